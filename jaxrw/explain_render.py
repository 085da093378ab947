"""Views of an `Explanation`: a rich table (its repr), HTML for notebooks, jaxprs side by side, and
the before/after dataflow graphs through the `graphviz` package (drawing needs the `dot` program;
without it the DOT source is still available and rendering is skipped with a message saying so).
"""

from __future__ import annotations

import html
import io
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["ExplanationViews", "dot_available", "fmt_cost", "fmt_bytes", "hoisted_text", "speedup_text"]

# Fill colors of graph nodes by kind (original program: kept/rewritten/removed; optimized: kept/new).
COLORS = {
    "input": "#e8eef7",
    "kept": "#f2f2f2",
    "rewritten": "#f6c7c7",
    "removed": "#f6c7c7",
    "new": "#c9ecd0",
    "shared": "#f2f2f2",
    "unused": "#ffffff",
    "unknown": "#fff3bf",
}
DOT_MISSING = (
    "graphviz's `dot` program was not found on PATH: graphs were not rendered "
    "(install it, e.g. `apt-get install graphviz`; `.graph(which).source` has the DOT text)"
)
HTML_GRAPH_MAX_NODES = 300  # larger graphs are slow to lay out and unreadable inline
UNITLESS_MODELS = ("flops",)  # cost models not in seconds (the CostModel contract is seconds)
# the report's notes shown as summary rows: why nothing was hoisted, why fewer rules ran, what runs
NOTE_ROWS = (
    ("hoisting", "hoist_note"),
    ("non-finite", "nonfinite_note"),
    ("rules", "rules_note"),
    ("schedule", "schedule"),
)


def dot_available() -> bool:
    return shutil.which("dot") is not None


def fmt_cost(x: float | None, model: str = "roofline") -> str:
    if x is None:
        return "—"
    if model in UNITLESS_MODELS:
        return f"{x:.3g}"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(x) >= scale or unit == "ns":
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def hoisted_text(nbytes: int, sets: int, in_loop: bool, priced: bool = False) -> str:
    """A report's hoisted row: values kept between calls for hoisted arguments (with what several
    parameter sets in turn may each keep), or, for a loop's body, its loop-invariant work, computed
    once per call before the loop and kept nowhere after it. `priced`: say how the model priced it."""
    price = " (priced as free: the unchanged row's gain)" if priced else ""
    if in_loop:
        return f"{fmt_bytes(nbytes)} of loop-invariant work moved before the loop, once per call{price}"
    times = {2: "twice", 3: "three times", 4: "four times"}.get(sets, f"{sets} times")
    turn = f" ({times} that for {sets} parameter sets in turn)" if sets > 1 else ""
    return f"{fmt_bytes(nbytes)} of parameter-only work kept between calls{price}{turn}"


def fmt_bytes(n: int) -> str:
    """1536 -> '1.50 KiB': a size in the largest binary unit it reaches (B for under 1 KiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def speedup_text(before: float, after: float) -> str:
    """before / after as '2.00x'; '∞' when only `after` is 0, '—' when both are."""
    return f"{before / after:.2f}x" if after > 0 else ("—" if before == 0 else "∞")


def predicted_text(before: float, after: float, model: str, rewritten: bool, bodies: bool) -> str:
    """A report's predicted row. Kept as written: the cost of what runs, alone (the result row
    says what the rewrite was predicted). With rewritten control-flow bodies: the cost outside
    them (the bodies row has each body's own)."""
    if not rewritten:
        return f"{fmt_cost(before, model)} (the program as written)" if before else "—"
    text = f"{fmt_cost(before, model)} -> {fmt_cost(after, model)} ({speedup_text(before, after)})"
    return f"{text} outside the control-flow bodies" if bodies else text


class ExplanationViews:
    """Mixed into `Explanation`: everything here reads its plain-data fields."""

    # --- rows shared by the text and HTML views --------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        rep = self.report or {}
        model = rep.get("cost_model", "")
        if self.where:  # a control-flow body: its inputs are the body's, not the function's
            rows = [("body", self.where), ("inputs", ", ".join(self.signature))]
        else:
            rows = [("function", f"{self.name}({', '.join(self.signature)})")]
        rows.append(("result", self.status))
        if self.note:
            rows.append(("note", self.note))
        if rep:
            rows += [
                ("equations", f"{rep['n_equations']} ({self._status_counts()})"),
                ("e-graph", f"{rep['egraph_nodes']} nodes, {rep['egraph_classes']} classes"),
                ("iterations", f"{rep['iterations']} (stop: {rep['stop_reason']})"),
                (
                    "cost model",
                    f"{model}, extractor {rep['extractor']}"
                    + (f" ({rep['extractor_note']})" if rep.get("extractor_note") else ""),
                ),
                (
                    "predicted",
                    predicted_text(
                        rep["cost_before"],
                        rep["cost_after"],
                        model,
                        rep["rewritten"],
                        any(b["rewritten"] for b in rep.get("bodies", ())),
                    ),
                ),
            ]
            if rep.get("hoisted_bytes"):
                sets, in_loop = rep.get("hoisted_sets", 0), rep.get("hoisted_in_loop", False)
                rows.append(("hoisted", hoisted_text(rep["hoisted_bytes"], sets, in_loop, priced=True)))
            rows += [(label, rep[key]) for label, key in NOTE_ROWS if rep.get(key)]
        if self.measured:
            m = self.measured
            times = ", ".join(
                f"{k} {fmt_cost(v['median_s'])} (±{v['spread'] * 50:.0f}%)" for k, v in m.items()
            )
            sp = self.measured_speedup
            rows.append(("measured", times + (f" -> {sp:.2f}x" if sp else "")))
        if self.phases:
            rows.append(("phases", " ".join(f"{k} {v * 1e3:.0f}ms" for k, v in self.phases.items())))
        return rows

    def _status_counts(self) -> str:
        counts: dict[str, int] = {}
        for e in self.equations:
            counts[e.status] = counts.get(e.status, 0) + 1
        return ", ".join(f"{n} {k}" for k, n in counts.items()) or "not mapped"

    def rule_rows(self) -> list[tuple[str, ...]]:
        rows = []
        for r in self.rules:
            if r.sites is None:
                where = "not located"
            elif not r.sites:
                where = "on rewritten terms"
            else:
                where = ", ".join(self._where(i) for i in r.sites[:6]) + (" …" if len(r.sites) > 6 else "")
            rows.append((r.name, r.identity, str(r.matches), where, "yes" if r.at_change else "no"))
        return rows

    def region_rows(self) -> list[tuple[str, ...]]:
        model = (self.report or {}).get("cost_model", "")
        rows = []
        for g in self.regions:
            before = ", ".join(f"{k}×{v}" for k, v in g.before_ops.items()) or "—"
            after = ", ".join(f"{k}×{v}" for k, v in g.after_ops.items()) or "—"
            eqns = ",".join(f"#{i}" for i in g.equations[:8]) + ("…" if len(g.equations) > 8 else "")
            rows.append(
                (
                    str(g.id),
                    f"{eqns} {' '.join(g.sources[:2])}".strip(),
                    f"{before} → {after}",
                    ", ".join(g.rules) or "—",
                    fmt_cost(g.cost_before, model),
                    fmt_cost(g.cost_after, model),
                    speedup_text(g.cost_before, g.cost_after),
                )
            )
        b, a = self.unchanged_cost
        if self.equations:
            # hoisted work is priced as free: its gain lands on the equations kept as written
            hoisted = (self.report or {}).get("hoisted_bytes") and a < b
            label = "unchanged, hoisted work free" if hoisted else "unchanged"
            rows.append(("—", label, "", "", fmt_cost(b, model), fmt_cost(a, model), speedup_text(b, a)))
        # the program-level terms of the totals (xla_passes.program_cost): what XLA's dot merger
        # and fused kernels' shared reads (CUDA profiles), and concat links decode cannot chain,
        # add to or take from the node costs
        pb = self.cost_before - b - sum(g.cost_before for g in self.regions)
        pa = 0.0
        if self.status == "rewritten":  # a kept program's totals are its own: nothing extracted
            pa = self.cost_after - a - sum(g.cost_after for g in self.regions)
        if self.equations and max(abs(pb), abs(pa)) > 1e-6 * max(self.cost_before, 1e-30):
            rows.append(("—", "program-level", "", "", fmt_cost(pb, model), fmt_cost(pa, model), ""))
        return rows

    def _where(self, i: int) -> str:
        e = self.equations[i] if 0 <= i < len(self.equations) else None
        return f"#{i} {e.primitive}" + (f" @ {e.source}" if e and e.source else "") if e else f"#{i}"

    # --- rich ------------------------------------------------------------------------------
    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        def add(table: Table, row: tuple[str, ...]) -> None:  # verbatim: `X[a:b]` is not markup
            table.add_row(*(Text(cell) for cell in row))

        top = Table(title=f"jaxrw.explain — {self.name}", title_justify="left", show_header=False, box=None)
        top.add_column(style="bold")
        top.add_column(overflow="fold")
        for row in self.summary_rows():
            add(top, row)
        parts: list[Any] = [top]
        if self.rules:
            t = Table(title="rules fired", title_justify="left")
            for col in ("rule", "identity", "matches", "matched in the original at", "at a change"):
                t.add_column(col, overflow="fold")
            for row in self.rule_rows():
                add(t, row)
            parts.append(t)
        if self.regions or self.equations:
            t = Table(title="predicted cost per region", title_justify="left")
            for col in ("region", "equations", "ops", "rules matched", "before", "after", "gain"):
                t.add_column(
                    col, overflow="fold", justify="right" if col in ("before", "after", "gain") else "left"
                )
            for row in self.region_rows():
                add(t, row)
            parts.append(t)
        parts.extend(body.__rich__() for body in self.bodies)  # control-flow bodies, titled by where
        return Group(*parts)

    def __repr__(self) -> str:
        from rich.console import Console

        buf = io.StringIO()
        width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
        Console(file=buf, width=width, color_system=None, force_terminal=False).print(self.__rich__())
        return buf.getvalue().rstrip()

    def side_by_side(self) -> Any:
        """A rich Table with the original and the optimized jaxpr in two columns."""
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"{self.name}: jaxprs", title_justify="left")
        t.add_column("original")
        t.add_column("optimized")
        after = self.jaxpr_after or "(unchanged: the original program runs)"
        t.add_row(Text(self.jaxpr_before), Text(after))
        return t

    # --- HTML ------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        e = html.escape
        out = [
            f"<div class='jaxrw-explain'><h4>jaxrw.explain — {e(self.name)}</h4>",
            _html_table(None, self.summary_rows()),
        ]
        if self.rules:
            out.append(
                _html_table(
                    ("rule", "identity", "matches", "matched in the original at", "at a change"),
                    self.rule_rows(),
                    "rules fired",
                )
            )
        if self.regions or self.equations:
            out.append(
                _html_table(
                    ("region", "equations", "ops", "rules matched", "before", "after", "gain"),
                    self.region_rows(),
                    "predicted cost per region",
                )
            )
        out.append(
            "<details><summary>jaxprs side by side</summary><table><tr><th>original</th>"
            "<th>optimized</th></tr><tr>"
            f"<td style='vertical-align:top'><pre>{e(self.jaxpr_before)}</pre></td>"
            f"<td style='vertical-align:top'><pre>{e(self.jaxpr_after or '(unchanged)')}</pre></td>"
            "</tr></table></details>"
        )
        if self.graphs:
            out.append(self._graphs_html())
        for body in self.bodies:
            out.append(f"<details><summary>{e(body.name)}</summary>{body._repr_html_()}</details>")
        out.append("</div>")
        return "\n".join(out)

    def _graphs_html(self) -> str:
        if not dot_available():
            return f"<p><i>{html.escape(DOT_MISSING)}</i></p>"
        size = max(len(g["nodes"]) for g in self.graphs.values())
        if size > HTML_GRAPH_MAX_NODES:
            return (
                f"<p><i>dataflow graphs not inlined: {size} nodes > {HTML_GRAPH_MAX_NODES} "
                "(use .render(directory) to write them)</i></p>"
            )
        cells = []
        for which in ("before", "after"):
            try:
                svg = self.graph(which).pipe(format="svg").decode()
            except Exception as err:  # noqa: BLE001 - a drawing failure must not hide the report
                svg = f"<i>{html.escape(str(err))}</i>"
            cells.append(f"<td style='vertical-align:top'><b>{which}</b><br>{svg}</td>")
        return (
            "<details><summary>dataflow graphs</summary><table><tr>"
            + "".join(cells)
            + "</tr></table></details>"
        )

    # --- graphviz --------------------------------------------------------------------------
    def graph(self, which: str = "after") -> Any:
        """The `graphviz.Digraph` of the original (`before`) or optimized (`after`) program.
        Building it needs only the Python package; drawing it needs the `dot` program."""
        import graphviz

        if which not in self.graphs:
            raise ValueError(f"unknown graph {which!r}; valid: {sorted(self.graphs)!r}")
        data = self.graphs[which]
        g = graphviz.Digraph(
            name=f"{self.name}_{which}",
            graph_attr={"rankdir": "TB", "fontsize": "10"},
            node_attr={"shape": "box", "style": "rounded,filled", "fontsize": "9", "fontname": "Helvetica"},
        )
        for n in data["nodes"]:
            label = n["label"] + (f"\nregion {n['region']}" if n.get("region") is not None else "")
            g.node(
                n["id"],
                label=label,
                fillcolor=COLORS.get(n["kind"], "#ffffff"),
                shape="ellipse" if n["kind"] == "input" else "box",
            )
        for a, b in data["edges"]:
            g.edge(a, b)
        return g

    def render(self, directory: str | Path = ".", format: str = "svg") -> list[Path]:
        """Write `<name>_before.<format>` and `<name>_after.<format>`, and those of each control-flow
        body; return their paths. Returns [] (and says why) when graphviz's `dot` program is not
        installed."""
        if not dot_available():  # printed, as a notebook shows it whatever logging is set up
            print(DOT_MISSING, file=sys.stderr)
            return []
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for which in self.graphs:
            stem = directory / f"{_safe(self.name)}_{which}"
            path = self.graph(which).render(
                filename=stem.name, directory=str(directory), format=format, cleanup=True
            )
            paths.append(Path(path))
        for body in self.bodies:
            paths += body.render(directory, format)
        return paths


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name) or "program"


def _html_table(header: tuple[str, ...] | None, rows: list[tuple[str, ...]], caption: str = "") -> str:
    e = html.escape
    out = ["<table class='jaxrw-table'>"]
    if caption:
        out.append(f"<caption style='text-align:left'><b>{e(caption)}</b></caption>")
    if header:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        tag = "th" if header is None else "td"
        cells = [f"<{tag} style='text-align:left'>{e(row[0])}</{tag}>"]
        cells += [f"<td style='text-align:left'>{e(c)}</td>" for c in row[1:]]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)

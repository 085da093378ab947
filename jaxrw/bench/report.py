"""Show benchmark results: a rich table with a geometric-mean line per suite, and a PNG plot.

Slower cases are shown like faster ones (red rather than green); errors and optimization
timeouts get a row of their own. Everything here reads the JSON-ready records of `runner`.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from ..rewrite.measure import median_interval, paired_ratio, round_ratios
from ..rewrite.measure import verdict as measure_verdict

__all__ = [
    "summarize_suites",
    "geomean",
    "same_program",
    "slower_with_new_args",
    "in_jit_speedup",
    "paired_speedup",
    "speedup_interval",
    "verdict",
    "fmt_time",
    "fmt_interval",
    "rules_summary",
    "stop_summary",
    "table",
    "plot",
    "write_json",
    "write_rows",
    "program_ops",
    "built_program",
    "add_case_options",
]

SLOWER, FASTER = 0.97, 1.03  # speedups outside this band are colored
AT_LEAST = 0.98  # issue 4: every case at >= 0.98x of jax.jit; the runner samples on until settled


def write_json(path: str, data: Any, default: Any = None) -> None:
    """`data` as indented JSON at `path`, its folder made if new (the bench tools' result files)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=default))


def write_rows(path: str | None, rows: list[dict]) -> dict[str, str]:
    """The device and jax version, and with `path` the JSON {device, jax, rows} written there (the
    layout of the bench/*_h200.py diagnostics)."""
    import json

    import jax

    meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    if path:
        with open(path, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
    return meta


def add_case_options(ap: Any) -> None:
    """The options of the bench/*_cpu.py diagnostics: which cases, dtypes, size, profile, JSON."""
    from .case import DTYPES

    ap.add_argument("--case", default="*", help="case names or globs, comma-separated")
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--size", default="large")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--json", default=None)


def built_program(opt: Any) -> Any:
    """The program an optimized function runs for its first signature (built by then), a function
    of the flat argument leaves, or None where it runs none of its own (fallen back)."""
    return next(iter(opt._cache.values())).fn


def program_ops(opt: Any, args: tuple) -> dict[str, int] | None:
    """Equations per primitive in the program an optimized function runs for `args` (its first
    signature, built by then), or None where it runs none of its own (fallen back): what the bench
    diagnostics count ("dots extracted")."""
    import collections

    import jax

    program = built_program(opt)
    if program is None:
        return None
    closed = jax.make_jaxpr(program)(*jax.tree_util.tree_leaves(args))
    return dict(collections.Counter(e.primitive.name for e in closed.jaxpr.eqns))


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize_suites(records: list[dict]) -> dict[str, dict[str, Any]]:
    """Per suite (and dtype): geometric means of jaxrw and hand speedups, counts of slower cases."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys((r["suite"], r["dtype"]) for r in records):
        rs = [r for r in records if (r["suite"], r["dtype"]) == key]
        # a speedup of a result outside the tolerance is no gain: listed, not averaged
        wrong = [r["case"] for r in rs if r["status"] == "ok" and not r.get("numerics_ok", True)]
        timed = [r for r in rs if r.get("speedup") and r["case"] not in wrong]
        sp = [r["speedup"] for r in timed]
        paired = {r["case"]: p for r in timed if (p := paired_speedup(r)) is not None}
        hand = [r for r in timed if r.get("hand_speedup") and r.get("hand_numerics_ok", True)]
        out[f"{key[0]}/{key[1]}"] = {
            "suite": key[0],
            "dtype": key[1],
            "cases": len(rs),
            "timed": len(sp),
            "geomean_speedup": geomean(sp),
            # hand and jaxrw over the same cases (not every case has a hand version)
            "geomean_hand": geomean([r["hand_speedup"] for r in hand]),
            "geomean_speedup_with_hand": geomean([r["speedup"] for r in hand]),
            "with_hand": len(hand),
            "geomean_in_jit": geomean([in_jit_speedup(r) for r in timed]),
            "max_speedup": max(sp, default=None),
            "min_speedup": min(sp, default=None),
            "slower": [r["case"] for r in timed if r["speedup"] < SLOWER],
            "min_paired": min(paired.values(), default=None),
            "slower_paired": [case for case, p in paired.items() if p < SLOWER],
            # hoisted cases called with new weights every call (jax.jit's program runs there)
            "slower_new_args": [r["case"] for r in timed if slower_with_new_args(r)],
            "errors": [r["case"] for r in rs if r["status"] == "error"],
            "skipped": [r["case"] for r in rs if r["status"] == "skipped"],
            "not_timed": [r["case"] for r in rs if r["status"] == "ok" and not r.get("speedup")],
            "numerics_failed": wrong,
            "hand_numerics_failed": [r["case"] for r in rs if r.get("hand_numerics_ok") is False],
        }
    return out


def slower_with_new_args(rec: dict) -> bool:
    """A hoisted case slower than jax.jit when called with new weights every call."""
    return bool(rec.get("speedup_new_args")) and rec["speedup_new_args"] < SLOWER


def same_program(rec: dict) -> bool:
    """jaxrw ran the original program (fallback, or the guard kept it): inside an outer jax.jit it
    is jax.jit's own program, so that variant is not timed."""
    return bool(rec.get("speedup")) and not (rec.get("report") or {}).get("rewritten")


def in_jit_speedup(rec: dict) -> float | None:
    """The in-jit speedup; 1.0 for the same program (counted so in geometric means, by construction)."""
    return 1.0 if same_program(rec) else rec.get("speedup_in_jit")


def paired_speedup(rec: dict, name: str = "jaxrw", base: str = "jax.jit") -> float | None:
    """`base`'s time over `name`'s, as the median over rounds of their ratio within a round
    (`measure.paired_ratio`; robust to a change of clock or load between rounds), from the samples
    in the record, so it can be computed for results recorded before it was reported."""
    v = rec.get("variants") or {}
    if base not in v or name not in v:
        return None
    r = paired_ratio(v[base].get("samples_s") or [], v[name].get("samples_s") or [])
    return r if math.isfinite(r) else None


# the speedups of variants `settle` does not sample on (record field -> variant): each is taken
# over the rounds that variant ran in, where jax.jit may have run more (a median over other rounds
# takes in the host's drift between them: hand 1.35x reported where its own rounds gave 1.05x)
MATCHED = {
    "speedup_in_jit": "jaxrw@jit",
    "hand_speedup": "hand",
    "speedup_bind": "jaxrw:bind",
    "second_jit": "jax.jit#2",
}


def matched_speedup(rec: dict, name: str, base: str = "jax.jit") -> float | None:
    """`base`'s median time over `name`'s, both over the rounds `name` was sampled in (the first
    ones: every variant runs the first `repeats` rounds, and `settle` appends rounds)."""
    v = rec.get("variants") or {}
    if base not in v or name not in v:
        return None
    b, o = v[base].get("samples_s") or [], v[name].get("samples_s") or []
    n = min(len(b), len(o))
    if not n:  # a record without samples: its medians
        return v[base]["median_s"] / v[name]["median_s"] if v[name].get("median_s") else None
    return statistics.median(b[:n]) / statistics.median(o[:n])


def with_matched_speedups(rec: dict) -> dict:
    """`rec` with MATCHED's speedups computed from its samples (for records written before)."""
    return {**rec, **{k: matched_speedup(rec, name) for k, name in MATCHED.items() if k in rec}}


def speedup_interval(rec: dict, name: str = "jaxrw", base: str = "jax.jit") -> tuple[float, float] | None:
    """A 95% confidence interval of `paired_speedup` (`measure.median_interval` of the per-round
    speedups), from the samples in the record; None with too few rounds."""
    v = rec.get("variants") or {}
    if base not in v or name not in v:
        return None
    return median_interval(round_ratios(v[base].get("samples_s") or [], v[name].get("samples_s") or []))


def verdict(interval: tuple[float, float] | None, at: float = AT_LEAST) -> str:
    """`measure.verdict` against AT_LEAST unless told: 'at least', 'below' or 'unresolved'."""
    return measure_verdict(interval, at)


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_interval(interval: tuple[float, float] | None) -> str:
    """'[lo, hi]' of a speedup interval, '' without one."""
    return f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""


def fmt_x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def rules_summary(report: dict | None, limit: int = 3) -> str:
    if not report:
        return ""
    fired = sorted(report.get("rules_fired", {}).items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k}×{v}" for k, v in fired[:limit])
    return text + (f" +{len(fired) - limit}" if len(fired) > limit else "") if fired else "none"


def case_notes(rec: dict) -> str:
    """The runner's notes plus what the report says beyond rules: hoisted bytes, autotune's pick."""
    parts = list(rec.get("notes", []))
    rep = rec.get("report") or {}
    if rep.get("hoisted_bytes"):
        parts.append(f"hoisted {rep['hoisted_bytes'] / 2**20:.3g} MiB")
    if rep.get("hoist_note"):
        parts.append(str(rep["hoist_note"]))
    if rec.get("speedup_bind"):
        parts.append(f"bound: {rec['speedup_bind']:.2f}x")
    if rep.get("schedule") and not str(rep["schedule"]).startswith("xla:"):
        parts.append(f"schedule {rep['schedule']}")
    paired = paired_speedup(rec)
    if paired and rec.get("speedup") and abs(math.log(paired / rec["speedup"])) > math.log(1.05):
        parts.append(f"paired by round: {paired:.2f}x")
    interval = speedup_interval(rec)
    unsettled = rec.get("speedup") and verdict(interval) != "at least"
    if unsettled:
        rounds = len(rec["variants"]["jaxrw"].get("samples_s") or [])
        parts.append(
            f"{verdict(interval)} {AT_LEAST}x: by round {_times(paired)} {_within(interval)}, {rounds} rounds"
        )
    if rec.get("second_jit"):
        control = ""
        if unsettled:  # the control over the same rounds: how far two compilations of one program differ
            by_round = paired_speedup(rec, "jax.jit#2")
            control = (
                f" ({by_round:.2f}x by round {_within(speedup_interval(rec, 'jax.jit#2'))})"
                if by_round
                else ""
            )
        parts.append(f"a second jax.jit: {rec['second_jit']:.2f}x{control}")
    if rec.get("speedup_new_args"):
        by_round = paired_speedup(rec, "jaxrw:new-args", "jax.jit:new-args")
        parts.append(
            f"new weights every call: {rec['speedup_new_args']:.2f}x"
            + (f", {by_round:.2f}x by round" if by_round else "")
        )
    tune = rep.get("autotune")
    if isinstance(tune, dict) and tune.get("winner"):
        parts.append(f"autotune: {tune['winner']}" + (" (cached)" if tune.get("cached") else ""))
    return "; ".join(parts)


def _times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"  # None: a record from before rounds were kept


def _within(interval: tuple[float, float] | None) -> str:
    return f"in {fmt_interval(interval)}" if interval else "(too few rounds)"


def stop_summary(rec: dict) -> str:
    rep = rec.get("report")
    if rec.get("opt_timeout"):
        return "timeout"
    if rec.get("fallback"):
        return "fallback"
    if rep is None:
        return "—"
    return rep["stop_reason"] + ("" if rep.get("rewritten") else ", kept")


def _hand_geomean(s: dict) -> str:
    """The hand column's geomean, with its count where fewer cases than jaxrw's have a hand version."""
    return fmt_x(s["geomean_hand"]) + (f" ({s['with_hand']})" if s["with_hand"] < s["timed"] else "")


def _variant(rec: dict, name: str, key: str) -> Any:
    return rec.get("variants", {}).get(name, {}).get(key)


def _err(rec: dict) -> str:
    parts = [_variant(rec, n, "rel_err") for n in ("jax.jit", "jaxrw")]
    text = " / ".join("—" if e is None else f"{e:.1e}" for e in parts)
    return text if rec.get("numerics_ok", True) else f"[red]{text} ✗[/red]"


def _colored(x: float | None) -> str:
    if x is None:
        return "—"
    color = "green" if x >= FASTER else "red" if x <= SLOWER else ""
    return f"[{color}]{x:.2f}x[/{color}]" if color else f"{x:.2f}x"


# the columns a narrow terminal keeps (an 80-column one folded eleven into "9…" and 3-letter lines)
COMPACT_COLUMNS = ("case", "jax.jit", "jaxrw", "speedup", "hand")
COMPACT_BELOW = 150  # terminal columns


def table(result: dict, compact: bool = False) -> Any:
    """A rich Table of one run's records, with a geometric-mean row after each suite; `compact`:
    the COMPACT_COLUMNS alone (rules, notes and the rest are in --json and a wider terminal)."""
    from rich.table import Table

    meta = result["meta"]
    t = Table(
        title=f"jaxrw bench — {meta['device']} ({meta['platform']}), {meta['size']} sizes, {meta['dtype']}, "
        f"jax {meta['jax']}",
        title_justify="left",
        caption="compact: rules, notes, errors and in-jit times in a wider terminal or --json"
        if compact
        else None,
    )
    columns = (
        ("case", {"no_wrap": True}),
        ("jax.jit", {"justify": "right"}),
        ("jaxrw", {"justify": "right"}),
        ("speedup", {"justify": "right"}),
        ("in jit", {"justify": "right"}),
        ("hand", {"justify": "right"}),
        ("rel err jit / jaxrw", {"justify": "right"}),
        ("opt", {"justify": "right"}),
        ("e-graph", {"justify": "right"}),
        ("stop", {}),
        ("rules fired", {"overflow": "fold", "ratio": 1}),
        # timing notes (rounds added, paired ratios, verdicts) and the runner's: a column of their
        # own, not appended to the rules fired
        ("notes", {"overflow": "fold", "ratio": 1}),
    )
    keep = [i for i, (col, _) in enumerate(columns) if not compact or col in COMPACT_COLUMNS]
    for i in keep:
        t.add_column(columns[i][0], **columns[i][1])

    def add_row(*cells: Any, **kw: Any) -> None:
        t.add_row(*(cells[i] for i in keep), **kw)

    # speedups over matched rounds, and the summary of them (a recorded run's stored ones may be
    # medians over different rounds, or summarized by older rules)
    cases = [with_matched_speedups(r) for r in result["cases"]]
    summary = summarize_suites(cases)
    for suite in dict.fromkeys(r["suite"] for r in cases):
        rs = [r for r in cases if r["suite"] == suite]
        t.add_section()
        for r in rs:
            if r["status"] == "skipped":
                add_row(
                    f"{suite}/{r['case']}",
                    "[yellow]skipped[/yellow]",
                    *[""] * 9,
                    f"[yellow]skipped: {'; '.join(r['notes'])}[/yellow]",
                )
                continue
            if r["status"] != "ok":
                add_row(
                    f"{suite}/{r['case']}", "[red]error[/red]", *[""] * 9, f"[red]error: {r['error']}[/red]"
                )
                continue
            rep = r.get("report") or {}
            notes = case_notes(r)
            rules = rules_summary(rep) or (f"fallback: {r['fallback']}" if r.get("fallback") else "")
            add_row(
                f"{suite}/{r['case']}",
                fmt_time(_variant(r, "jax.jit", "median_s")),
                fmt_time(_variant(r, "jaxrw", "median_s")),
                # kept as written: not colored as a gain or a loss (the same program, compiled apart)
                (f"[dim]{r['speedup']:.2f}x kept[/dim]" if same_program(r) else _colored(r.get("speedup")))
                + ("" if r.get("numerics_ok", True) else " [red]✗[/red]"),  # outside the tolerance: no gain
                "[dim]same[/dim]" if same_program(r) else _colored(r.get("speedup_in_jit")),
                fmt_x(r.get("hand_speedup")),
                _err(r),
                f"{r.get('opt_s') or 0:.2f} s",
                str(rep.get("egraph_nodes", "—")),
                stop_summary(r),
                rules,
                f"[dim]{notes}[/dim]" if notes else "",
            )
        for s in summary.values():
            if s["suite"] == suite:
                add_row(
                    f"[bold]{suite} geomean[/bold] ({s['timed']}/{s['cases']})",
                    "",
                    "",
                    f"[bold]{_colored(s['geomean_speedup'])}[/bold]",
                    _colored(s["geomean_in_jit"]),
                    _hand_geomean(s),
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    end_section=True,
                )
    return t


def plot(result: dict, path: str) -> None:
    """Write a PNG: speedup over jax.jit per case on a log axis, with the 1x line, the
    hand-optimized speedup as a gray bar behind each case's jaxrw bar, a black diamond for
    jaxrw called inside an outer jax.jit, and a note on any result outside the error tolerance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result["cases"]
    meta = result["meta"]
    labels = [f"{r['suite']}/{r['case']}" for r in rs]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.28 * max(len(rs), 1)))
    ys = list(range(len(rs)))[::-1]
    hand = [r.get("hand_speedup") or float("nan") for r in rs]
    mine = [r.get("speedup") or float("nan") for r in rs]
    # bars start at 1x so gains extend right and losses left on the log axis
    ax.barh(
        ys,
        [h - 1 if h == h else 0 for h in hand],
        left=1,
        height=0.8,
        color="#c8c8c8",
        label="hand-optimized",
    )
    colors = [  # a program kept as written in gray: its ratio is two compilations of one program
        "#9e9e9e"
        if same_program(r)
        else "#2a9d4b"
        if (m == m and m >= FASTER)
        else "#d1495b"
        if (m == m and m <= SLOWER)
        else "#5c7cfa"
        for r, m in zip(rs, mine, strict=True)
    ]
    ax.barh(
        ys,
        [m - 1 if m == m else 0 for m in mine],
        left=1,
        height=0.45,
        color=colors,
        label="jaxrw (called directly)",
    )
    in_jit = [r.get("speedup_in_jit") or float("nan") for r in rs]
    ax.scatter(in_jit, ys, marker="D", s=12, color="black", zorder=3, label="jaxrw inside jax.jit")
    for y, r, m in zip(ys, rs, mine, strict=True):
        if m != m:
            why = r["status"] if r["status"] != "ok" else "opt timeout" if r.get("opt_timeout") else "n/a"
            ax.text(1, y, f"  {why}", va="center", fontsize=7, color="#555")
        elif not r.get("numerics_ok", True):  # a speedup of a wrong result is no gain: said on the bar
            ax.text(m, y, "  ✗ outside the error tolerance", va="center", fontsize=7, color="#d1495b")
        elif same_program(r):
            ax.text(max(m, 1.0), y, "  kept as written", va="center", fontsize=7, color="#555")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    finite = [v for v in mine + hand + in_jit if v == v and v > 0]
    lo, hi = min([*finite, 1.0]), max([*finite, 1.0])
    ax.set_xlim(lo / 1.5, hi * 1.5)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("speedup over jax.jit (log scale; >1 is faster)")
    ax.set_title(
        f"jaxrw vs jax.jit — {meta['device']}, {meta['size']}, {meta['dtype']}, {meta['date'][:10]}",
        fontsize=9,
    )
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)

"""Print a markdown summary of one or more `jaxrw bench --json` results (for bench/README.md).

    python -m jaxrw.bench.summarize bench/results/h200-f32.json bench/results/h200-bf16.json
    python -m jaxrw.bench.summarize bench/results/*-float32.json --plot out/   # and their plots

One table per input file (its environment in a line above it), a geometric-mean row per suite,
and then the cases where jaxrw was slower than jax.jit, errors and untimed cases, so none hides.
`--plot DIR` also draws each file's plot (`report.plot`, as `jaxrw bench --plot` does) into
DIR/<file name>.png: the recorded JSON is enough to redraw any run's figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .report import (
    AT_LEAST,
    SLOWER,
    case_notes,
    fmt_interval,
    fmt_time,
    fmt_x,
    paired_speedup,
    plot,
    rules_summary,
    same_program,
    slower_with_new_args,
    speedup_interval,
    stop_summary,
    summarize_suites,
    verdict,
    with_matched_speedups,
)

__all__ = ["markdown", "optimization_table", "settled_line", "main"]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _err(rec: dict, name: str) -> str:
    e = rec.get("variants", {}).get(name, {}).get("rel_err")
    return "—" if e is None else f"{e:.1e}"


HEADER = ["suite", "case", "shape", "jax.jit", "jaxrw", "speedup", "in jit", "hand", "hand×", "rel err jaxrw",
          "opt s", "equations", "e-graph", "stop", "rules fired", "notes"]  # fmt: skip


def _case_row(suite: str, r: dict) -> list[str]:
    if r["status"] != "ok":
        why = f"error: {r['error']}" if r["status"] == "error" else f"skipped: {'; '.join(r['notes'])}"
        return [suite, r["case"], r.get("shape", ""), *["—"] * (len(HEADER) - 4), why]
    v, rep = r["variants"], r.get("report") or {}
    notes = case_notes(r)
    return [
        suite, r["case"], r.get("shape", ""), fmt_time(v["jax.jit"]["median_s"]),
        fmt_time(v.get("jaxrw", {}).get("median_s")), f"**{fmt_x(r.get('speedup'))}**",
        "same" if same_program(r) else fmt_x(r.get("speedup_in_jit")),
        fmt_time(v.get("hand", {}).get("median_s")), fmt_x(r.get("hand_speedup")),
        _err(r, "jaxrw"), f"{r.get('opt_s') or 0:.2f}", str(rep.get("n_equations", "—")),
        str(rep.get("egraph_nodes", "—")), stop_summary(r),
        rules_summary(rep, limit=4), notes,
    ]  # fmt: skip


def markdown(result: dict) -> str:
    """The markdown table for one result."""
    m = result["meta"]
    lines = [
        f"**{m['device']}** ({m['platform']}), jax {m['jax']}, jaxlib {m.get('jaxlib')}, "
        f"egglog {m.get('egglog')}, "
        f"{m['size']} sizes, {m['dtype']}, {m['repeats']} samples per variant, {m['date']}, "
        f"commit {m.get('commit') or '?'}",
        "",
        _row(HEADER),
        _row(["---"] * len(HEADER)),
    ]
    summary = summarize_suites(result["cases"])
    for suite in dict.fromkeys(r["suite"] for r in result["cases"]):
        lines += [_row(_case_row(suite, r)) for r in result["cases"] if r["suite"] == suite]
        for s in summary.values():
            if s["suite"] == suite:
                hand = fmt_x(s["geomean_hand"])
                if s.get("with_hand") and s["with_hand"] < s["timed"]:  # not the same cases as jaxrw's
                    hand += f" (jaxrw {fmt_x(s['geomean_speedup_with_hand'])} on these {s['with_hand']})"
                geo = [f"**{fmt_x(s['geomean_speedup'])}**", fmt_x(s["geomean_in_jit"]), "", hand]
                lines.append(_row([suite, f"**geomean** ({s['timed']} of {s['cases']})", "", "", "", *geo]
                                  + [""] * (len(HEADER) - 9)))  # fmt: skip
    lines.append("")
    cases = result["cases"]
    slower = [r for r in cases if r.get("speedup") and r["speedup"] < SLOWER]
    lines.append(
        f"Slower than jax.jit (< {SLOWER}x): "
        + (", ".join(f"{r['suite']}/{r['case']} {r['speedup']:.2f}x" for r in slower) or "none")
    )
    new_args = [r for r in cases if slower_with_new_args(r)]
    lines.append(
        f"Slower than jax.jit with new weights every call (< {SLOWER}x): "
        + (", ".join(f"{r['suite']}/{r['case']} {r['speedup_new_args']:.2f}x" for r in new_args) or "none")
    )
    slower_paired = [(r, p) for r in cases if (p := paired_speedup(r)) is not None and p < SLOWER]
    lines.append(
        f"Slower than jax.jit by the per-round ratio (< {SLOWER}x): "
        + (", ".join(f"{r['suite']}/{r['case']} {p:.2f}x" for r, p in slower_paired) or "none")
    )
    lines.append(settled_line(cases))
    untimed = [r for r in cases if r["status"] == "ok" and not r.get("speedup")]
    if untimed:
        why = [f"{r['suite']}/{r['case']} ({'; '.join(r.get('notes', [])) or 'n/a'})" for r in untimed]
        lines.append("Not timed under jaxrw: " + ", ".join(why))
    for status in ("error", "skipped"):
        rs = [r for r in cases if r["status"] == status]
        if rs:
            lines.append(f"{status.capitalize()}: " + ", ".join(f"{r['suite']}/{r['case']}" for r in rs))
    bad = [r for r in cases if r["status"] == "ok" and not r.get("numerics_ok", True)]
    if bad:
        lines.append("Outside the error tolerance: " + ", ".join(f"{r['suite']}/{r['case']}" for r in bad))
    hand = [r for r in cases if r["status"] == "ok" and not r.get("hand_numerics_ok", True)]
    if hand:  # the suite's hand-written version, not jaxrw
        lines.append(
            "Hand-written versions outside it: " + ", ".join(f"{r['suite']}/{r['case']}" for r in hand)
        )
    return "\n".join(lines)


def settled_line(cases: list[dict]) -> str:
    """How many timed cases the 95% interval of the per-round speedup puts at or above AT_LEAST,
    and which it puts below or leaves unresolved (with their intervals)."""
    timed = [(r, speedup_interval(r)) for r in cases if r.get("speedup")]
    groups: dict[str, list[str]] = {"at least": [], "below": [], "unresolved": []}
    for r, iv in timed:
        groups[verdict(iv)].append(f"{r['suite']}/{r['case']} {fmt_interval(iv)}".rstrip())
    return (
        f"At or above {AT_LEAST}x by the 95% interval of the per-round speedup: "
        f"{len(groups['at least'])} of {len(timed)}; below: {', '.join(groups['below']) or 'none'}; "
        f"unresolved: {', '.join(groups['unresolved']) or 'none'}"
    )


PHASES = ("encode", "rewrite", "extract", "schedule")  # RewriteReport.phase_s, in order


def optimization_table(result: dict, suites: tuple[str, ...] = ("models",)) -> str:
    """Optimization time per case of `suites` against the issue-9 target (1 s per 1,000 equations)."""
    rows = [r for r in result["cases"] if r["suite"] in suites and r["status"] == "ok" and r.get("opt_s")]
    if not rows:
        return ""
    head = ["case", "equations", "optimize s", "s per 1,000 eqns", " / ".join(PHASES) + " s", "e-graph",
            "stop"]  # fmt: skip
    lines = [_row(head), _row(["---"] * len(head))]
    for r in rows:
        rep = r.get("report") or {}
        n, ph = rep.get("n_equations"), rep.get("phase_s", {})
        per = f"{r['opt_s'] / n * 1000:.1f}" if n else "—"
        phases = " / ".join(f"{ph[k]:.2f}" if k in ph else "—" for k in PHASES)
        opt = f"> {r['opt_s']:.0f} (timeout)" if r.get("opt_timeout") else f"{r['opt_s']:.2f}"
        lines.append(_row([r["case"], str(n or "—"), opt, per, phases, str(rep.get("egraph_nodes", "—")),
                           stop_summary(r)]))  # fmt: skip
    return "\n".join(lines)


META_KEYS = ("device", "platform", "size", "dtype", "jax", "date", "repeats")
CASE_KEYS = ("suite", "case", "status", "dtype")


def _check_result(result: object) -> None:
    """Raise ValueError naming what a bench result lacks (the tables read these keys)."""
    if not isinstance(result, dict) or not isinstance(result.get("meta"), dict):
        raise ValueError("not an object with a 'meta' object")
    if not isinstance(result.get("cases"), list):
        raise ValueError("no 'cases' list")
    missing = [k for k in META_KEYS if k not in result["meta"]]
    if missing:
        raise ValueError(f"'meta' lacks {missing}")
    for i, r in enumerate(result["cases"]):
        lacks = [k for k in CASE_KEYS if k not in r] if isinstance(r, dict) else list(CASE_KEYS)
        if lacks:
            raise ValueError(f"case {i} lacks {lacks}")


def _plot_names(paths: list[str]) -> list[str]:
    """A PNG name per file: its stem, with its folder's name where two files share a stem
    (a/float32.json and b/float32.json would overwrite one plot)."""
    stems = [Path(p).stem for p in paths]
    return [
        f"{Path(p).parent.name}-{stem}.png" if stems.count(stem) > 1 else f"{stem}.png"
        for p, stem in zip(paths, stems, strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrw.bench.summarize", description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="result files written by `jaxrw bench --json`")
    ap.add_argument(
        "--plot",
        metavar="DIR",
        help="also write each file's plot as DIR/<name>.png (<folder>-<name>.png where names repeat)",
    )
    args = ap.parse_args(argv)
    folder = Path(args.plot) if args.plot else None
    if folder and (not folder.is_dir() if folder.exists() else bool(folder.suffix)):  # plots.v2/ is one
        ap.error(f"--plot {args.plot!r}: a folder for the plots (one per file), not a file name")
    plot_names = _plot_names(args.json)
    unread, shown = [], 0
    for i, path in enumerate(args.json):
        try:
            result = json.loads(Path(path).read_text())
            _check_result(result)
        except (OSError, ValueError) as e:  # the others are still summarized (a glob of results/*)
            print(f"summarize: skipped {path!r}: not a jaxrw bench result: {e}", file=sys.stderr)
            unread.append(path)
            continue
        # hand, in-jit, bound and second-jit speedups over their own rounds (older records divided
        # medians over different rounds)
        result["cases"] = [with_matched_speedups(r) for r in result["cases"]]
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
            plot(result, str(folder / plot_names[i]))
        if shown:
            print()
        shown += 1
        print(markdown(result))
        opt = optimization_table(result)
        if opt:
            print(f"\nOptimization time ({result['meta']['dtype']}, target ≤ 1 s per 1,000 equations):\n")
            print(opt)
    if unread:
        print(f"summarize: {len(unread)} of {len(args.json)} files skipped (see above)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

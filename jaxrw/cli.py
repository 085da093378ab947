"""The `jaxrw` command line: `jaxrw bench` (side-by-side benchmarks) and `jaxrw calibrate`.

Heavy imports (jax, the suites) happen inside the subcommands so `jaxrw --help` is instant.
A bad option value exits with status 2 and a message naming the value and the valid set.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]

SUITE_CHOICES = ("algebra", "merge", "models", "streams", "all")
SIZE_CHOICES = ("small", "large")
DTYPE_CHOICES = ("float32", "bfloat16")


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; valid: a positive integer")
    return v


def _suites(text: str) -> str:
    for part in text.split(","):
        if part.strip() not in SUITE_CHOICES:
            valid = ", ".join(repr(c) for c in SUITE_CHOICES)
            raise argparse.ArgumentTypeError(f"invalid choice: {part.strip()!r} (choose from {valid})")
    return text


def _finite_float(text: str, zero_ok: bool) -> float:
    """A finite number >= 0 (or > 0): inf overflowed the timers of every case."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not ((v >= 0 if zero_ok else v > 0) and math.isfinite(v)):
        valid = "a finite number >= 0" if zero_ok else "a finite number > 0"
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; valid: {valid}")
    return v


def _nonneg_float(text: str) -> float:
    return _finite_float(text, zero_ok=True)


def positive_float(text: str) -> float:
    return _finite_float(text, zero_ok=False)


def _nonempty(text: str) -> str:
    if not text.strip():  # `--json "$OUT"` with OUT unset: silently no file, or every case
        raise argparse.ArgumentTypeError("empty value; valid: a non-empty path or pattern")
    return text


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _version() -> str:
    """jaxrw's installed version, with the jax it runs on."""
    import importlib.metadata as md

    try:
        mine = md.version("jaxrw")
    except md.PackageNotFoundError:
        mine = "(not installed)"
    return f"{mine} (jax {md.version('jax')})"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="jaxrw", description="Rewrite JAX programs into faster equivalent forms."
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    b = sub.add_parser(
        "bench",
        help="run benchmark suites under jax.jit, jaxrw and hand-optimized code",
        description="Time each case under jax.jit, jaxrw and (where one exists) a hand-optimized "
        "version; check each against a float64 reference; print a table.",
    )
    b.add_argument(
        "--suite",
        type=_suites,
        default="all",
        help=f"which suites, comma-separated, run in that order: {', '.join(SUITE_CHOICES)} (default: all)",
    )
    b.add_argument(
        "--case",
        metavar="PATTERN",
        type=_nonempty,
        default=None,
        help="only the case of this name, or those matching this glob or substring (a comma-separated list)",
    )
    b.add_argument("--size", choices=SIZE_CHOICES, default="small", help="small (CPU) or large (GPU) inputs")
    b.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32")
    b.add_argument(
        "--json",
        metavar="PATH",
        type=_nonempty,
        default=None,
        help="write every sample and the environment as JSON",
    )
    b.add_argument(
        "--plot",
        metavar="PATH",
        type=_nonempty,
        default=None,
        help="write a plot of the speedups (log scale): .png, .pdf or .svg",
    )
    b.add_argument("--autotune", action="store_true", help="let jaxrw time its top candidates on this device")
    b.add_argument("--repeats", type=positive_int, default=5, help="samples per variant (default: 5)")
    b.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        help="jaxrw's equality-saturation iterations per case (default: optimize's, 12)",
    )
    b.add_argument(
        "--max-rounds",
        type=positive_int,
        default=None,
        help="rounds in all while jaxrw's speedup interval straddles 0.98x; >= --repeats (default: 6x "
        "--repeats at the large size; at the small size --repeats, raised to 6, the fewest for a 95%% "
        "interval)",
    )
    b.add_argument(
        "--sample-ms",
        type=_nonneg_float,
        default=None,
        help="target length of one sample in ms; a sample is never less than one call, so 0 times one "
        "call per sample (default: 10 on CPU, 20 on GPU)",
    )
    b.add_argument(
        "--opt-timeout",
        type=_nonneg_float,
        default=None,
        metavar="SECONDS",
        help="optimization deadline per case; past it jaxrw is not timed (0: none; default 20 at the "
        "small size, 300 at the large size)",
    )
    b.add_argument(
        "--budget",
        type=_nonneg_float,
        default=None,
        metavar="SECONDS",
        help="start no new case after this many seconds; the rest are listed as skipped (0: no budget; "
        "default 150 at the small size, none at the large size)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    b.set_defaults(func=_bench)

    # listed here for `jaxrw --help`; main() hands everything after `calibrate` to the calibrator
    sub.add_parser("calibrate", help="measure this device and save a cost-model profile", add_help=False)
    return ap


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .bench.case import select
    from .bench.report import COMPACT_BELOW, plot, table
    from .bench.runner import Options, run
    from .errors import InvalidOptionError
    from .options import disabled, output_problem

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # logs and pipes: do not fold the table to 80 columns
    try:
        cases = [c for c in select(args.suite, args.case) if args.dtype in c.dtypes]
    except InvalidOptionError as e:
        print(f"jaxrw bench: error: {e}", file=sys.stderr)
        return 2
    if args.max_rounds is not None and args.max_rounds < args.repeats:  # was raised to it silently
        print(
            f"jaxrw bench: error: --max-rounds {args.max_rounds} is below --repeats {args.repeats}; valid: "
            f"an integer >= {args.repeats} (the rounds in all, the --repeats ones included)",
            file=sys.stderr,
        )
        return 2
    for path, option, suffixes in ((args.json, "--json", ()), (args.plot, "--plot", PLOT_SUFFIXES)):
        problem = path and output_problem(path, option, suffixes)
        if problem:
            print(f"jaxrw bench: error: {problem}", file=sys.stderr)
            return 2
    if args.json and args.plot and Path(args.json).resolve() == Path(args.plot).resolve():
        print(f"jaxrw bench: error: --json and --plot name one file ({args.plot!r})", file=sys.stderr)
        return 2
    if disabled():
        print("jaxrw bench: warning: JAXRW_DISABLE is set, so the jaxrw column times jax.jit's program")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("jaxrw bench: error: --plot needs matplotlib (pip install 'jaxrw[plots]')", file=sys.stderr)
            return 2
    opts = Options(
        size=args.size,
        dtype=args.dtype,
        repeats=args.repeats,
        autotune=args.autotune,
        sample_s=None if args.sample_ms is None else args.sample_ms / 1e3,
        opt_timeout_s=args.opt_timeout,
        include_heavy=bool(args.case),
        budget_s=args.budget,
        max_rounds=args.max_rounds,
        iterations=args.iterations,
    )
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task("starting", total=len(cases))

        def on_case(case, rec):
            if rec is None:
                progress.update(task, description=f"{case.suite}/{case.name}")
            else:
                progress.advance(task)

        result = run(cases, opts, on_case)
    for path, write in ((args.json, _write_json), (args.plot, plot)):  # first: a closed pipe loses nothing
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)  # the plot's folder too
                write(result, path)
            except OSError as e:
                print(f"jaxrw bench: error: could not write {path!r}: {e}", file=sys.stderr)
                return 2
            if not args.quiet:
                console.print(f"wrote {path}")
    if not args.quiet:
        console.print(table(result, compact=console.width < COMPACT_BELOW))
        _footer(console, result, opts)
    if result["meta"].get("interrupted"):
        return 130
    return 1 if any(s["errors"] or s["numerics_failed"] for s in result["summary"].values()) else 0


def _write_json(result: dict, path: str) -> None:
    from .bench.report import write_json

    write_json(path, result, default=_json_default)


def _footer(console: Any, result: dict, opts: Any) -> None:
    """What the table's cells alone do not say: units and sampling, and every case a geomean
    leaves out or that needs a second look."""
    from .bench.report import AT_LEAST, SLOWER
    from .bench.summarize import settled_line
    from .rewrite.measure import MIN_INTERVAL_ROUNDS

    limit = opts.round_limit()
    more = f" (up to {limit} where a speedup's interval straddled 0.98x)" if limit > opts.repeats else ""
    console.print(
        f"[dim]{_ran(result['cases'])} in {result['meta']['total_s']:.0f} s. Times: medians of "
        f"{opts.repeats} interleaved samples{more}. speedup: jax.jit time / jaxrw time; in jit: jaxrw "
        "called inside an outer jax.jit; hand: hand-optimized (its geomean over the cases that have one, "
        "counted where fewer). rel err: against float64.[/dim]"
    )
    if limit >= MIN_INTERVAL_ROUNDS:  # `--repeats 11` at the small size (limit 11) printed none
        console.print(settled_line(result["cases"]))
    elif any(r.get("speedup") for r in result["cases"]):
        console.print(
            f"No verdict at {AT_LEAST}x: {limit} rounds give no 95% interval of the per-round speedup "
            f"({MIN_INTERVAL_ROUNDS} or more do: --repeats or --max-rounds)"
        )
    lists = (
        ("slower", f"median speedup under {SLOWER:.2f}x"),
        ("slower_new_args", f"under {SLOWER:.2f}x with new weights every call"),
        ("numerics_failed", "[red]outside the error tolerance (not in the geomean)[/red]"),
        ("hand_numerics_failed", "hand-written version outside the tolerance"),
        ("errors", "errors"),
        ("not_timed", "not timed"),
        ("skipped", "skipped"),
    )
    for s in result["summary"].values():
        said = [f"{what}: {', '.join(s[key])}" for key, what in lists if s.get(key)]
        if said:
            console.print(f"{s['suite']}/{s['dtype']}: " + "; ".join(said))
    if result["meta"].get("jaxrw_disabled"):
        console.print("[yellow]JAXRW_DISABLE was set: the jaxrw column timed jax.jit's program.[/yellow]")


def _ran(cases: list[dict]) -> str:
    """'N cases run', with how many were skipped (budget, Ctrl-C, heavy): the records hold both,
    and counting them all as run said "26 cases" where 2 had run."""
    skipped = sum(r["status"] == "skipped" for r in cases)
    ran = len(cases) - skipped
    text = f"{ran} case{'' if ran == 1 else 's'} run"
    return text + (f" ({skipped} skipped)" if skipped else "")


def _json_default(x: object) -> object:
    if hasattr(x, "tolist"):
        return x.tolist()
    if hasattr(x, "value"):  # enums
        return x.value
    return str(x)


def _calibrate(argv: list[str]) -> int:
    import importlib

    try:
        calibrate = importlib.import_module("jaxrw.rewrite.calibrate")
    except ImportError as e:
        print(
            f"jaxrw calibrate: error: the calibrator (jaxrw.rewrite.calibrate) is not in this build: {e}",
            file=sys.stderr,
        )
        return 2
    return int(calibrate.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["calibrate"]:
        return _calibrate(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Why a thunky program `auto` measured faster can run slower in the benchmark (H200, jax >= 0.12).

    python bench/thunky_pick_h200.py --case experts_equal --dtype bfloat16 [--json PATH]

Run g3 (bench/HISTORY.md) had `auto` pick thunky for merge/experts_equal in bfloat16, measured
1.10x over the rewritten program under XLA, while the benchmark then timed jaxrw at 0.85x of
jax.jit. This optimizes the case as the benchmark does, then times side by side, interleaved:
- `jax.jit`: the user's function; `jaxrw`: the optimized function, as the benchmark calls it;
- `entry`: the signature's program as optimize() runs it (the `Scheduled` wrapper);
- `thunky`: the emitted program (`ThunkyProgram`, through its executable when it could build one);
- `thunky jit`: the same program through jax's dispatch;
- `thunky again`: the plan emitted and compiled once more (a separate compilation, as `auto`'s
  trial and the program it keeps are);
- `rewritten`: jax.jit of the rewritten program (what `auto` measured thunky against).
`--schedule streams` forces the thunky program (under `auto` it may not be picked); `--bind BYTES`
passes constants of at least BYTES to the regions as packed buffers instead of leaving them in the
regions' code (JAXRW_BIND_CONSTANTS; compare the per-call time and `optimize_s`). A short
table is printed last; the JSON holds every median.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import jax

from jaxrw import optimize
from jaxrw.bench import case as bench_case
from jaxrw.bench.report import write_rows
from jaxrw.rewrite.measure import measure
from jaxrw.schedule import Scheduled, emit
from jaxrw.schedule.emit import BIND_CONSTANTS_VARIABLE


def diagnose(name: str, dtype: str, repeats: int, size: str = "large", schedule: str = "auto") -> dict:
    bench_case.load_suites()
    inst = bench_case.CASES[name].instance(size, dtype)
    args = tuple(jax.device_put(a) for a in inst.args(0))
    opt = optimize(inst.fn, schedule=schedule)
    start = time.perf_counter()
    jax.block_until_ready(opt(*args))
    optimize_s = time.perf_counter() - start
    entry = next(iter(opt._cache.values()))
    leaves = jax.tree_util.tree_leaves(args)
    row: dict = {
        "case": name,
        "dtype": dtype,
        "asked": schedule,
        "bind_constants": os.environ.get(BIND_CONSTANTS_VARIABLE, ""),
        "schedule": entry.schedule,
        "call": type(entry.call).__name__,
        "optimize_s": optimize_s,
    }
    variants = {"jax.jit": (jax.jit(inst.fn), args), "jaxrw": (opt, args)}
    if entry.fn is not None:
        variants["rewritten"] = (jax.jit(entry.fn), tuple(leaves))
    if isinstance(entry.call, Scheduled):
        sched = entry.call
        again = emit(sched.plan, (), entry.out_tree)
        variants.update(
            entry=(sched, tuple(leaves)),
            thunky=(sched.fast, tuple(leaves)),
            **{
                "thunky jit": (sched.fast.jitted, (*leaves, *sched.fast.bound)),  # its constants too
                "thunky again": (again, tuple(leaves)),
            },
        )
    timed = measure(variants, repeats=repeats, sample_s=0.05)
    row["median_us"] = {k: t.median * 1e6 for k, t in timed.items()}
    if isinstance(entry.call, Scheduled):
        row["direct"] = {
            "thunky": entry.call.fast._direct is not None,
            "thunky again": variants["thunky again"][0]._direct is not None,
        }
        row["why_not_direct"] = entry.call.fast.why_not_direct
        row["plan"] = {
            "regions": len(entry.call.plan.regions),
            "streams": entry.call.plan.streams,
            "bound_constant_bytes": entry.call.fast.bound_bytes,
            "bound_buffers": len(entry.call.fast.bound),
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["experts_equal"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--size", default="large", help="small: to check the script on a CPU")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--schedule", default="auto", help="optimize()'s schedule, e.g. streams")
    ap.add_argument(
        "--bind", type=int, default=None, help="pass constants of at least this many bytes as buffers"
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.environ[BIND_CONSTANTS_VARIABLE] = "" if a.bind is None else str(a.bind)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("jaxrw").setLevel(logging.INFO)
    rows = [diagnose(c, a.dtype, a.repeats, a.size, a.schedule) for c in a.case]
    print(write_rows(a.json, rows))
    for r in rows:
        base = r["median_us"]["jax.jit"]
        cells = ", ".join(f"{k} {v:.1f} µs ({base / v:.2f}x)" for k, v in r["median_us"].items())
        print(
            f"{r['case']} {r['dtype']} asked={r['asked']} schedule={r['schedule']} "
            f"optimize {r['optimize_s']:.1f} s, plan {r.get('plan')} direct={r.get('direct')}: {cells}"
        )


if __name__ == "__main__":
    main()

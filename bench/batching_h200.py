"""The batched-GEMM win jaxrw leaves (bench/HISTORY.md, "A win jaxrw leaves"), timed on a GPU.

    python bench/batching_h200.py [--case NAME ...] [--iterations 12 48] [--dtype bfloat16] [--json PATH]

For each case: jax.jit, the hand version where the case has one, and jaxrw optimized with each
`--iterations` limit (12, the default; 48 was needed before `batch.stack_dots` wrote whole groups
before saturation, twenty-second session) crossed with `Profile.concat_chains` (off, and on: the
built-in profiles' setting since the seventeenth lease), each with `schedule="xla"` so that only
the rewrite differs. Each row records the optimization time, the stop reason, the predicted cost,
the dots extracted and the median time of a call, interleaved. A short table is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax

from jaxrw import compat, optimize
from jaxrw.bench.case import CASES, load_suites
from jaxrw.bench.report import program_ops, write_rows
from jaxrw.rewrite.measure import measure
from jaxrw.rewrite.profiles import default_profile


def run_case(name: str, dtype: str, size: str, repeats: int, limits: tuple[int, ...] = (12,)) -> dict:
    load_suites()
    inst = CASES[name].instance(size, dtype)
    args = tuple(jax.device_put(a) for a in inst.args(0))
    base = default_profile(compat.device_kind())
    variants = {"jax.jit": (jax.jit(inst.fn), args)}
    if inst.hand is not None:
        hand_args = inst.hand_prep(args) if inst.hand_prep else args
        variants["hand"] = (jax.jit(inst.hand), hand_args)
    rows = {}
    for iterations in limits:
        for chains in (False, True):
            label = f"it={iterations} chains={'on' if chains else 'off'}"
            profile = dataclasses.replace(base, concat_chains=chains)
            start = time.perf_counter()
            opt = optimize(
                inst.fn, profile=profile, schedule="xla", limits={"iterations": iterations, "time_s": 60}
            )
            jax.block_until_ready(opt(*args))
            rep = opt.report(*args)
            rows[label] = {
                "optimize_s": time.perf_counter() - start,
                "stop": str(rep.stop_reason),
                "rewritten": bool(rep.rewritten),
                "predicted_us": rep.cost_after * 1e6,
                "dots": (program_ops(opt, args) or {}).get("dot_general"),
            }
            variants[label] = (opt, args)
    timed = measure(variants, repeats=repeats, sample_s=0.05)
    medians = {k: t.median * 1e6 for k, t in timed.items()}
    for label, row in rows.items():
        row["median_us"] = medians[label]
    return {"case": name, "dtype": dtype, "size": size, "median_us": medians, "variants": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["experts_equal", "experts_packed", "small_decoders"])
    ap.add_argument(
        "--iterations", nargs="+", type=int, default=[12], help="iteration limits (12: the default)"
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--size", default="large", help="small: to check the script on a CPU")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = [run_case(c, a.dtype, a.size, a.repeats, tuple(a.iterations)) for c in a.case]
    print(write_rows(a.json, results))
    for r in results:
        base = r["median_us"]["jax.jit"]
        hand = r["median_us"].get("hand")
        print(
            f"{r['case']} {r['dtype']}: jax.jit {base:.1f} µs"
            + (f", hand {hand:.1f} µs ({base / hand:.2f}x)" if hand else "")
        )
        for label, v in r["variants"].items():
            print(
                f"  {label:20s} {v['median_us']:8.1f} µs ({base / v['median_us']:.2f}x)  dots {v['dots']}"
                f"  predicted {v['predicted_us']:.1f} µs  {v['stop']}  optimize {v['optimize_s']:.1f} s"
            )


if __name__ == "__main__":
    main()

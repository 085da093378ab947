"""How far separate compilations of one program differ in speed on a GPU, and whether XLA's GEMM
autotuning is the cause.

    python bench/compile_variance_h200.py [--case experts_mixed_8 ...] [--dtype bfloat16] [--json PATH]
    XLA_FLAGS=--xla_gpu_autotune_level=0 python bench/compile_variance_h200.py ...   # no autotuning

For each case (large size): `--copies` jax.jit compilations of the same function (each traced and
compiled apart), timed interleaved (`rewrite.measure`, medians and per-round ratios to the first
copy, with their 95% intervals), with a fingerprint of each compiled program's text so equal
programs show as equal. Where jaxrw keeps a program it is one more such compilation: the spread
here is the floor under a kept case's speedup in the benchmarks. Two controls are timed in the same
rounds: `same`, the first copy's executable again as a variant of its own (an A/A pair: what the
harness and the placement of buffers alone make of one executable), `jax.jit`, the benchmarks'
baseline (jax.jit(fn) compiled and called the usual way) and `optimize`, jaxrw's `optimize(fn)`
at its defaults (`--no-optimize` leaves it out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re

import jax

from jaxrw.bench.case import CASES, load_suites
from jaxrw.rewrite.measure import measure, median_interval, paired_ratio, round_ratios


def _fingerprint(compiled) -> str:
    text = re.sub(r"HloModule \S+", "HloModule m", compiled.as_text())  # the name follows the function's
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def run_case(name: str, dtype: str, copies: int, repeats: int, with_optimize: bool = True) -> dict:
    load_suites()
    inst = CASES[name].instance("large", dtype)
    args = inst.args(1)
    # each copy compiled once, ahead of time: the executable fingerprinted is the one timed
    compiled = {
        f"jit#{i}": jax.jit(lambda *a: inst.fn(*a)).lower(*args).compile()  # noqa: B023 - the same fn
        for i in range(copies)
    }
    prints = {k: _fingerprint(c) for k, c in compiled.items()}
    variants = {k: (c, args) for k, c in compiled.items()}
    variants["same"] = (compiled["jit#0"], args)  # A/A: one executable as two variants
    prints["same"] = prints["jit#0"]
    variants["jax.jit"] = (jax.jit(inst.fn), args)  # the benchmarks' baseline: jax's C++ dispatch
    prints["jax.jit"] = "jax.jit"
    if with_optimize:
        from jaxrw import optimize

        rw = optimize(inst.fn)
        jax.block_until_ready(rw(*args))
        variants["optimize"] = (rw, args)
        rep = rw.report(*args)
        prints["optimize"] = "fallback" if rep.fallback else "rewritten" if rep.rewritten else "kept"
    timed = measure(variants, repeats=repeats, sample_s=0.02)
    first = timed["jit#0"].samples
    rows = {
        k: {
            "median_us": t.median * 1e6,
            "vs_first": timed["jit#0"].median / t.median,
            "vs_first_paired": paired_ratio(first, t.samples),
            "vs_first_interval": median_interval(round_ratios(first, t.samples)),
            "program": prints[k],
            "samples_s": t.samples,
        }
        for k, t in timed.items()
    }
    return {"case": name, "dtype": dtype, "copies": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["experts_mixed_8", "qkv_args_decode", "multibranch_cell"])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--no-optimize", action="store_true", help="leave out optimize(fn)'s variant")
    ap.add_argument("--json")
    a = ap.parse_args()
    flags = os.environ.get("XLA_FLAGS", "")
    out = {"device": str(jax.devices()[0]), "jax": jax.__version__, "xla_flags": flags, "cases": []}
    for name in a.case:
        res = run_case(name, a.dtype, a.copies, a.repeats, not a.no_optimize)
        out["cases"].append(res)
        copies = {k: r for k, r in res["copies"].items() if k.startswith("jit#")}
        programs = len({r["program"] for r in copies.values()})
        cells = [
            f"{k}={r['vs_first_paired']:.3f}"
            + ("[{:.3f},{:.3f}]".format(*r["vs_first_interval"]) if r["vs_first_interval"] else "")
            for k, r in res["copies"].items()
            if k != "jit#0"
        ]
        print(
            f"{flags or 'default':12} {a.dtype:9} {name:18} {programs} program(s) | paired vs jit#0: "
            + " ".join(cells)
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

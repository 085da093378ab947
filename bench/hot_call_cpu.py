"""The Python a hoisted call on cached parameters costs, on this machine's CPU (issue 10).

The direct hoisted call's own Python is what separates it from `Optimized.bind` on the H200,
whose host runs it about an order of magnitude slower than this CPU (nasrnn_args_hoist f32, j2:
103 µs direct, 73 µs bound). Here the main program's jit is replaced by a function that returns
at once, so what is timed is jaxrw's Python alone: the call through the instance minus that
function called with the same arguments. Medians of interleaved repeats.

    python bench/hot_call_cpu.py [--json out.json] [--case nasrnn_args_hoist llama288_hoist]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import timeit

import jax
import jax.numpy as jnp

from jaxrw import optimize
from jaxrw.bench import case
from jaxrw.bench.runner import git_commit

CASES = ("nasrnn_args_hoist", "llama288_hoist", "llama4096_hoist")
SIZES = {"nasrnn_args_hoist": "large", "llama288_hoist": "large", "llama4096_hoist": "small"}


def _noop(*args, **kwargs):
    return None


def measure(name: str, calls: int, repeats: int) -> dict:
    """ns per call: the hoisted call with its jit replaced, the replacement alone, and the difference."""
    inst = case.CASES[name].instance(SIZES[name], "float32")
    args = jax.tree_util.tree_map(jnp.asarray, inst.args(0))
    opt = optimize(inst.fn, profile="h200", **inst.opt_kwargs)  # the decisions made for the GPU
    for _ in range(3):
        jax.block_until_ready(opt(*args))
    hot = opt._hot_path
    if hot is None:
        raise SystemExit(f"{name}: no hot path after three calls")
    hot.call = _noop
    if hasattr(opt, "_set_hot_path"):  # the class call captures the jit when installed
        opt._set_hot_path(hot)
    values, fast = hot.h.values, args[1:]
    wrapped, bare = [], []
    for _ in range(repeats):  # interleaved
        wrapped.append(timeit.timeit(lambda: opt(*args), number=calls) / calls * 1e9)
        bare.append(timeit.timeit(lambda: _noop(values, (), *fast), number=calls) / calls * 1e9)
    leaves = len(jax.tree_util.tree_leaves(args[0]))
    w, b = statistics.median(wrapped), statistics.median(bare)
    return {
        "case": name,
        "size": SIZES[name],
        "leaves": leaves,
        "call_ns": w,
        "bare_ns": b,
        "python_ns": w - b,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    case.load_suites()
    rows = [measure(n, a.calls, a.repeats) for n in a.case]
    commit = git_commit()
    meta = {
        "commit": commit,
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%F"),
    }
    meta["jax"] = jax.__version__
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{'case':20} {'leaves':>6} {'python ns':>10} {'call ns':>9}")
    for r in rows:
        print(f"{r['case']:20} {r['leaves']:>6} {r['python_ns']:>10.0f} {r['call_ns']:>9.0f}")


if __name__ == "__main__":
    main()

"""Where a hoisted call's time goes on a GPU: host time to issue calls vs time to finish them.

    python bench/hoist_h200.py [--case llama288_hoist nasrnn_args_hoist] [--json PATH]

For each case (large size, `--dtype`, float32 by default): jax.jit and jaxrw called directly
(jaxrw built by its first call, as a user's is), and jax.jit behind a class's `__call__` slot
with no Python frame (`_slot`). For programs not hoisted also jax.jit(fn)
through optimize's `_jitted` and through one Python frame; where optimize() runs jax.jit(fn)
itself (state "jit"), also the pieces of its call, alone and behind a frame. For hoisting
cases also jaxrw with new parameters on every call (three sets in turn, on an instance first
called with other weights, as a training loop), jaxrw's direct jax.jit for the latter, and the
bound function. `issue_us` is the host time per call with nothing waited for (while the device
queue has room), `total_us` the time per call including the wait at the end: a variant whose
issue time is close to its total time is bound by the host (Python and dispatch), not the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit

import jax

from jaxrw import optimize
from jaxrw.bench.case import CASES, load_suites


def _time(fn, arg_sets, calls: int) -> tuple[float, float]:
    """(issue, total) time per call; the argument sets rotate on across samples (never the same
    set twice in a row, which would make jaxrw hoist it)."""
    out = None
    start = _next.get(id(fn), 0)
    _next[id(fn)] = start + calls
    t0 = time.perf_counter()
    for i in range(start, start + calls):
        out = fn(*arg_sets[i % len(arg_sets)])
    t1 = time.perf_counter()
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


_next: dict[int, int] = {}  # per function: where its rotation continues


def _host_parts(rw, args: tuple, n: int = 20000) -> dict[str, float]:
    """Host µs per call of the pieces of optimize()'s call in state "jit" (Optimized.__call__),
    each timed alone: the top-level check, jax.jit's cache size, and the whole call with
    jax.jit(fn) replaced by a no-op (what the call path adds to jax.jit's own dispatch)."""
    from jaxrw import compat

    def per_call(f) -> float:
        return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6

    real = rw._jitted
    rw._jitted = lambda *a, **k: None
    try:
        minus_jit = per_call(lambda: rw(*args))
    finally:
        rw._jitted = real
    return {
        "top_level": per_call(compat.top_level),
        "jit_size": per_call(rw._jit_size),
        "empty lambda": per_call(lambda: None),
        "call minus jax.jit": minus_jit,
    }


def _call_path_pieces(rw, base: tuple) -> dict[str, tuple]:
    """jax.jit(fn) (rw._jitted) behind one Python frame that adds one piece of optimize()'s
    state-"jit" call at a time: which piece costs host time next to a real dispatch."""
    from jaxrw import compat

    jitted, size, top = rw._jitted, rw._jitted._cache_size, compat.top_level

    def with_kwargs(*a, **k):
        return jitted(*a, **k)

    def with_top_level(*a):
        top()
        return jitted(*a)

    def with_cache_size(*a):
        out = jitted(*a)
        size()
        return out

    known = rw._jit_known

    def state_jit_copy(*a, **k):  # Optimized.__call__'s state-"jit" branch, as a plain function
        if rw._fast_state == "jit" and top():
            out = jitted(*a, **k)
            if size() != known:
                raise AssertionError("jax.jit's cache grew")
            return out
        raise AssertionError("not in state jit")

    return {
        "optimize's bound __call__": (rw.__call__, [base]),  # no type-slot lookup per call
        "state-jit branch as a function": (state_jit_copy, [base]),
        "frame(**{}) + jax.jit": (with_kwargs, [base]),
        "frame + top_level": (with_top_level, [base]),
        "frame + cache size": (with_cache_size, [base]),
    }


def _slot(jitted):
    """An instance whose class's `__call__` is `jitted` itself: called like optimize()'s object,
    with no Python frame on the way (what a no-Python call in state "jit" would cost)."""
    return type("SlotCall", (), {"__call__": staticmethod(jitted)})()


def run_case(name: str, calls: int, repeats: int, dtype: str = "float32") -> dict:
    load_suites()
    inst = CASES[name].instance("large", dtype)
    rw = optimize(inst.fn, **inst.opt_kwargs)
    jj = jax.jit(inst.fn)
    base = inst.args(1)
    new = [inst.args(s) for s in (3, 4, 5)]
    jax.block_until_ready(rw(*base))  # built by a direct call, as a user's first call does
    variants = {"jax.jit": (jj, [base]), "jaxrw": (rw, [base]), "class slot -> jax.jit": (_slot(jj), [base])}
    if not inst.opt_kwargs.get("hoist_argnums"):  # where the host time of a plain call goes
        variants |= {
            "jaxrw._jitted": (rw._jitted, [base]),  # jax.jit(fn) itself: state "jit" calls it
            "python frame + jax.jit": (lambda *a: jj(*a), [base]),
        }
        if rw._fast_state == "jit":  # kept: the pieces of optimize()'s call in that state
            variants |= _call_path_pieces(rw, base)
    if inst.opt_kwargs.get("hoist_argnums"):
        trainer = optimize(inst.fn, **inst.opt_kwargs)  # a training loop: step-0 weights, then new
        jax.block_until_ready(trainer(*inst.args(6)))
        variants |= {
            "jaxrw:bind": (rw.bind(*base), [base[1:]]),
            "jax.jit:new-args": (jj, new),
            "class slot -> jax.jit:new-args": (_slot(jj), new),
            "jaxrw:new-args": (trainer, new),
            "jaxrw._jitted:new-args": (rw._jitted, new),
        }
    for fn, sets in variants.values():  # compile and warm
        _time(fn, sets, 10)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    for _ in range(repeats):
        for k, (fn, sets) in variants.items():
            samples[k].append(_time(fn, sets, calls))
    (entry,) = [e for e in (trainer if "jaxrw:new-args" in variants else rw)._cache.values()]
    h = entry.call
    rec = {
        k: {
            "issue_us": statistics.median(s[0] for s in v),
            "total_us": statistics.median(s[1] for s in v),
        }
        for k, v in samples.items()
    }
    parts = _host_parts(rw, base) if rw._fast_state == "jit" else {}
    counters = {k: getattr(h, k, None) for k in ("prologue_runs", "direct_runs")}
    counters["new-args handed off"] = entry.handed_off
    return {
        "case": name,
        "variants": rec,
        "counters": counters,
        "hot_path": rw._hot_path is not None,
        "fast_state": rw._fast_state,
        "host_parts_us": parts,
        "dtype": dtype,
        "schedule": rw.report(*base).schedule,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ["llama288_hoist", "nasrnn_args_hoist", "llama288", "per_head_proj"]
    ap.add_argument("--case", nargs="+", default=default)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"device": str(jax.devices()[0]), "jax": jax.__version__, "cases": []}
    for name in a.case:  # printed as each ends: a run cut short still says what it measured
        c = run_case(name, a.calls, a.repeats, a.dtype)
        out["cases"].append(c)
        print(c["case"], c["counters"], "hot path" if c["hot_path"] else "no hot path", flush=True)
        print("  schedule:", c["schedule"], "| state", c["fast_state"])
        if c["host_parts_us"]:
            print("  host µs:", ", ".join(f"{k} {v:.2f}" for k, v in c["host_parts_us"].items()))
        base = c["variants"]["jax.jit"]["total_us"]
        for k, v in c["variants"].items():
            print(
                f"  {k:24s} issue {v['issue_us']:8.1f} us   total {v['total_us']:8.1f} us"
                f"   {base / v['total_us']:5.2f}x of jax.jit",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""Where a hoisted call's time goes on a GPU: host time to issue calls vs time to finish them.

    python bench/hoist_h200.py [--case llama288_hoist nasrnn_args_hoist] [--json PATH]

For each case (large size, `--dtype`, float32 by default): jax.jit and jaxrw called directly
(jaxrw built by its first call, as a user's is), and jax.jit behind a class's `__call__` slot
with no Python frame (`_slot`, as optimize() calls a kept program: state "jit"). For programs
not hoisted also jax.jit(fn) through optimize's `_jitted` and through one Python frame. For hoisting
cases also jaxrw with new parameters on every call (three sets in turn, on an instance first
called with other weights, as a training loop), jaxrw's direct jax.jit for the latter, and the
bound function, called directly and through one Python frame, the hot path with its jit
replaced by a no-op (its Python alone), and its jit called with no check before it. `issue_us`
is the host time per call with nothing waited for (while the device queue has room),
`total_us` the time per call including the wait at the end: a variant whose issue time is close
to its total time is bound by the host (Python and dispatch), not the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

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


def _slot(jitted):
    """An instance whose class's `__call__` is `jitted` itself: called like optimize()'s object,
    with no Python frame on the way, as optimize() calls a program kept as written (state "jit")."""
    return type("SlotCall", (), {"__call__": staticmethod(jitted)})()


def _without_dispatch(rw):
    """A copy of `rw` whose hot path calls a no-op instead of its jit: what the identity check and
    the glue around it cost on this host, with nothing dispatched (returns None)."""
    import copy

    stub = copy.copy(rw)
    hot = stub._hot_path = copy.copy(rw._hot_path)
    hot.call = lambda *a, **k: None
    stub._set_hot_path(hot)  # its class's call captures the jit it is given
    return stub


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
            "jaxrw._jitted": (rw._jitted, [base]),  # jax.jit(fn) itself (fallbacks run it)
            "python frame + jax.jit": (lambda *a: jj(*a), [base]),
        }
    if inst.opt_kwargs.get("hoist_argnums"):
        trainer = optimize(inst.fn, **inst.opt_kwargs)  # a training loop: step-0 weights, then new
        jax.block_until_ready(trainer(*inst.args(6)))
        bound = rw.bind(*base)
        variants |= {
            "jaxrw:bind": (bound, [base[1:]]),
            # what one Python frame costs between real dispatches on this host: the hot path's
            # Python is this plus its identity check of every hoisted leaf
            "python frame + bind": (lambda *a: bound(*a), [base[1:]]),
            "jax.jit:new-args": (jj, new),
            "class slot -> jax.jit:new-args": (_slot(jj), new),
            "jaxrw:new-args": (trainer, new),
            "jaxrw._jitted:new-args": (rw._jitted, new),
        }
    if rw._hot_path is not None:  # the hot path's Python alone: its jit replaced by a no-op
        variants["jaxrw hot path, no dispatch"] = (_without_dispatch(rw), [base])
        # its jit with no check before it, through one Python frame as "python frame + bind": tells
        # the jit's own dispatch from the Python in front of it
        hot = rw._hot_path
        hoisted = jax.tree_util.tree_leaves(hot.layout.hoisted_args(base, {}))
        passed, values = hot.layout.pick_passed(hoisted), hot.h.values
        variants["python frame + hot jit"] = (lambda *a: hot.call(values, passed, *a), [base[1:]])
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
    counters = {k: getattr(h, k, None) for k in ("prologue_runs", "direct_runs")}
    counters["new-args handed off"] = entry.handed_off
    return {
        "case": name,
        "variants": rec,
        "counters": counters,
        "hot_path": rw._hot_path is not None,
        "fast_state": rw._fast_state,
        "class_call": bool(getattr(type(rw), "_call_class", False)),  # the one-frame hot call
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

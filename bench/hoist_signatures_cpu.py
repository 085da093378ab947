"""Hoisted calls with several signatures of one function, against jax.jit, on this machine's CPU.

The patterns the thirty-second session's reviews measured (docs/reliability.md): each is a loop
of calls that mixes parameter sets and batch sizes, timed per call (block_until_ready), jaxrw and
jax.jit interleaved, median of the repeats' medians. The ratio is jaxrw's time over jax.jit's
(below 1: jaxrw is faster).

- two_sets: live and averaged weights, each reused at its own batch size, two calls at a time.
- train_eval: a training loop whose new parameters are called at a training and an evaluation
  batch size each step (new on every step: both signatures should go to jax.jit's program).
- alternating_64: two parameter sets of 64 leaves in turn at one batch size; the second set's
  calls timed (before the thirty-third session it never stayed cached and ran jax.jit's program
  behind the hoisted call's Python; now it has prologue values of its own, `HoistedCall.spares`).
- rotation_4: four parameter sets of 64 leaves in turn (ensemble members, checkpoints), every
  call timed (before the thirty-fourth session only two were kept: the third and fourth ran
  jax.jit's program behind the hoisted call's Python).
- rotation_6: six such sets in turn, more than a signature's four slots (before the thirty-fifth
  session one set was kept and five ran jax.jit's program behind the hoisted call's Python).
- sets_two_sizes: three parameter sets of 64 leaves, each called at two batch sizes, in turn
  (before the thirty-fourth session the structure lookup remembered one signature, so every call
  took the full call path).
- shapes_in_turn: three parameter sets of 64 leaves at three shapes (inner size 8, 4, 2) with the
  same data, in turn: three models through one function (before the thirty-fifth session two
  of them were decided by another shape's policy or never built).
- anew_two_sizes: parameters made anew for each call from one set (a cast, as `opt(cast(p), x)`)
  at two batch sizes: new on every call, so jax.jit's program should run (before the
  thirty-fifth session the dead arrays' recycled ids read as the same arrays, and the prologue
  ran on most calls). The making of the arrays is timed for both.
- scalar_anew: one set of 64 arrays and a Python float scale, an equal float made anew for each
  call (before the thirty-sixth session every call took the full call path: the quick path
  compared the float's identity). The making of the dict is timed for both.
- scalar_changing: the same with another value on each call (a schedule's value inside the
  hoisted pytree): served through the structure lookup, the float passed as it is.
- namedtuple_64: one set of 64 arrays as a namedtuple, reused (before the thirty-sixth session
  the identity check knew no namedtuple, so every call flattened it).
- dataclass_64: the same in a dataclass registered with jax.tree_util.register_dataclass (before
  the thirty-seventh session every call flattened it).
- finetune_bias: one set of 64 arrays and a bias that only the main program reads, new on
  every call (fine-tuning what the merges leave alone). Every hoisted array keys the prologue's
  cache, so these calls run jax.jit's program and are handed off to it; keying the cache by the
  prologue's own inputs was tried and reverted in the thirty-seventh session
  (docs/reliability.md). The making of the bias is timed for both.

    python bench/hoist_signatures_cpu.py [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrw import optimize
from jaxrw.bench.runner import git_commit


def _chain(pairs: int):
    def f(p, x):
        if not isinstance(p, dict):  # namedtuple_64's and dataclass_64's parameters
            p = p._asdict() if hasattr(p, "_asdict") else vars(p)
        for i in range(pairs):
            x = jnp.tanh(x @ (p[f"A{i}"] @ p[f"B{i}"]))
        x = x + p["bias"] if "bias" in p else x  # finetune_bias's, read by the main program only
        return x * p["scale"] if "scale" in p else x

    return f


def _params(seed: int, pairs: int, d: int, inner: int | None = None) -> dict:
    """Weights A_i (d, inner) and B_i (inner, d) of `_chain` (inner: d where not given)."""
    r, inner = np.random.default_rng(seed), inner or d
    shapes = {"A": (d, inner), "B": (inner, d)}
    return {
        f"{k}{i}": jnp.asarray(r.standard_normal(shapes[k]).astype(np.float32) / np.sqrt(d))
        for i in range(pairs)
        for k in "AB"
    }


def _time(calls) -> float:
    """Seconds per call of the list of thunks, each blocked on."""
    t0 = time.perf_counter()
    for c in calls:
        jax.block_until_ready(c())
    return (time.perf_counter() - t0) / len(calls)


def _data(name: str) -> dict:
    """The arrays of pattern `name`: made once for the reused sets, new for each call of it in
    train_eval (new parameters on every step)."""
    if name == "two_sets":
        return {
            "sets": (_params(0, 1, 512), _params(1, 1, 512)),
            "x": (jnp.ones((4, 512)), jnp.ones((9, 512))),
        }
    if name == "train_eval":
        return {
            "sets": [_params(10 + k, 2, 512) for k in range(20)],
            "x": (jnp.ones((4, 512)), jnp.ones((9, 512))),
        }
    if name in ("rotation_4", "rotation_6"):
        n = int(name[-1])
        return {"sets": [_params(110 + k, 32, 8) for k in range(n)], "x": (jnp.ones((2, 8)),)}
    if name == "sets_two_sizes":
        sizes = (jnp.ones((2, 8)), jnp.ones((5, 8)))
        return {"sets": [_params(120 + k, 32, 8) for k in range(3)], "x": sizes}
    if name == "shapes_in_turn":
        return {
            "sets": [_params(130 + k, 32, 8, inner) for k, inner in enumerate((8, 4, 2))],
            "x": (jnp.ones((2, 8)),),
        }
    if name == "anew_two_sizes":
        return {"sets": (_params(140, 32, 8),), "x": (jnp.ones((2, 8)), jnp.ones((5, 8)))}
    if name.startswith("scalar_"):
        return {"sets": (_params(150, 32, 8),), "x": (jnp.ones((2, 8)),)}
    if name == "finetune_bias":
        return {"sets": (_params(180, 32, 8),), "x": (jnp.ones((2, 8)),)}
    if name == "namedtuple_64":
        p = _params(160, 32, 8)
        return {"sets": (collections.namedtuple("Params", sorted(p))(**p),), "x": (jnp.ones((2, 8)),)}
    if name == "dataclass_64":
        p = _params(170, 32, 8)
        cls = jax.tree_util.register_dataclass(dataclasses.make_dataclass("Params", sorted(p)))
        return {"sets": (cls(**p),), "x": (jnp.ones((2, 8)),)}
    return {"sets": (_params(100, 32, 8), _params(101, 32, 8)), "x": (jnp.ones((2, 8)),)}


def _pattern(name: str, fn, data: dict) -> tuple[list, list]:
    """The calls of one repeat of pattern `name` with callable `fn`, and those of them timed."""
    sets, xs = data["sets"], data["x"]
    if name == "two_sets":
        calls = [lambda p=p, x=x: fn(p, x) for p, x in zip(sets, xs, strict=True) for _ in range(2)] * 10
        return calls, calls
    if name == "train_eval":
        calls = [lambda p=p, x=x: fn(p, x) for p in sets for x in xs]
        return calls, calls
    if name == "sets_two_sizes":
        calls = [lambda p=p, x=x: fn(p, x) for p in sets for x in xs] * 10
        return calls, calls
    if name == "anew_two_sizes":  # each call's arrays die after it
        calls = [lambda x=x: fn({k: v * 1.0 for k, v in sets[0].items()}, x) for x in xs] * 20
        return calls, calls
    if name.startswith("scalar_"):  # an equal float made anew, or another value, on each call
        scales = [0.5] * 40 if name == "scalar_anew" else [0.5 + i / 64 for i in range(40)]
        calls = [lambda s=s: fn({**sets[0], "scale": float(np.float64(s))}, xs[0]) for s in scales]
        return calls, calls
    if name == "finetune_bias":  # a new bias on every call (made inside the timed call, for both)
        bias = [lambda i=i: jnp.full(8, i / 40, jnp.float32) for i in range(40)]
        calls = [lambda b=b: fn({**sets[0], "bias": b()}, xs[0]) for b in bias]
        return calls, calls
    calls = [lambda p=p: fn(p, xs[0]) for p in sets] * 20
    return (calls, calls[1::2]) if name == "alternating_64" else (calls, calls)


# name: weight pairs of f
PATTERNS = {
    "two_sets": 1,
    "train_eval": 2,
    "alternating_64": 32,
    "rotation_4": 32,
    "rotation_6": 32,
    "sets_two_sizes": 32,
    "shapes_in_turn": 32,
    "anew_two_sizes": 32,
    "scalar_anew": 32,
    "scalar_changing": 32,
    "namedtuple_64": 32,
    "dataclass_64": 32,
    "finetune_bias": 32,
}


def measure(name: str, repeats: int) -> dict:
    f = _chain(PATTERNS[name])
    opt, ref = optimize(f, hoist_argnums=0), jax.jit(f)
    per: dict[str, list[float]] = {"jaxrw": [], "jax.jit": []}
    kept = _data(name)

    def data() -> dict:  # train_eval's parameters are new on every pass, the others reused
        return _data(name) if name == "train_eval" else kept

    for _ in range(2):  # warm-up: builds, compilations, the policy's first decisions
        for fn in (opt, ref):
            for c in _pattern(name, fn, data())[0]:
                jax.block_until_ready(c())
    for _ in range(repeats):
        for label, fn in (("jaxrw", opt), ("jax.jit", ref)):
            calls, timed = _pattern(name, fn, data())
            if timed is calls:
                per[label].append(_time(calls) * 1e6)
            else:  # the other calls run between, untimed
                ts = []
                for c, t in zip(calls[0::2], timed, strict=True):
                    jax.block_until_ready(c())
                    ts.append(_time([t]))
                per[label].append(statistics.median(ts) * 1e6)
    med = {k: statistics.median(v) for k, v in per.items()}
    entries = list(opt._cache.values())
    return {
        "pattern": name,
        "us_per_call": med,
        "ratio": med["jaxrw"] / med["jax.jit"],
        "repeats_us": per,
        "signatures": len(entries),
        "prologue_runs": sum(e.call.prologue_runs for e in entries),
        "handed_off": [e.handed_off for e in entries],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", nargs="+", choices=sorted(PATTERNS), default=list(PATTERNS))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = [measure(name, a.repeats) for name in a.pattern]
    head = f"{'pattern':16s} {'jaxrw us':>9s} {'jax.jit us':>10s} {'ratio':>6s}"
    print(head + "  signatures, prologue runs, handed off")
    for r in rows:
        u = r["us_per_call"]
        print(
            f"{r['pattern']:16s} {u['jaxrw']:9.0f} {u['jax.jit']:10.0f} {r['ratio']:6.2f}  "
            f"{r['signatures']}, {r['prologue_runs']}, {r['handed_off']}"
        )
    if a.json:
        commit = git_commit()
        env = {
            "machine": platform.processor() or platform.machine(),
            "jax": jax.__version__,
            "commit": commit,
        }
        with open(a.json, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()

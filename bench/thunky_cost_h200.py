"""What a thunky call costs per buffer, and whether inputs packed into one buffer cost less.

    python bench/thunky_cost_h200.py [--n 1 4 16 64 192] [--json PATH]     # jax >= 0.12, CUDA

The planner priced a thunky call at ~40 µs plus ~9 µs per buffer crossing its boundary, fitted to
whole scheduler programs (StreamCosts, run q). This separates the terms on one kernel's worth of work:
N small float32 inputs (64 x 64) summed into one output, as
- `xla`: jax.jit of the sum;
- `args`: one `call_jax` region reading the N inputs, passed to `thunky.jit` as N arrays (as
  `jaxrw.schedule.thunky.emit` passes a program's inputs);
- `views`: the inputs packed in one (N * 4096,) array, the region reading N leading-axis views;
- `one_view`: the packed array read as one buffer, reshaped inside the region;
- `concat+views`: the N arrays concatenated by XLA inside the same jit, then `views` (what packing
  a program's inputs on every call would cost);
- `empty`: a thunky program writing one zero (the fixed cost of a call);
- `empty+params`: the same inside a jit that also takes the N inputs, unused but kept
  (`keep_unused=True`): the cost of the outer executable's parameters alone;
- `views+xla`: `views` on the packed array while XLA sums the N inputs in the same jit (the
  inputs are parameters of a program with a thunky call, but thunky never sees them);
- `pack_apart`: the N inputs concatenated by a separate jax.jit (no thunky in it), then `views`
  (packing in its own executable);
- `args direct`, `empty+params direct`: `args` and `empty+params` called as jaxrw calls an
  emitted program, through its compiled executable (`jaxrw.schedule.direct.ThunkyProgram`), not
  through jax's Python dispatch.
Each is timed as `total_us` per call (and `issue_us`, the host's time alone) over `--calls`
back-to-back calls, waited for at the end, the median over `--repeats` interleaved rounds; results
are checked against `xla`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrw.schedule.direct import ThunkyProgram

SIDE = 64
SIZE = SIDE * SIDE


def _out_ref():
    return jax.new_ref(jnp.empty((SIDE, SIDE), jnp.float32))


def _summing_region(n: int):
    def region(*refs):
        total = refs[0][...]
        for r in refs[1:n]:
            total = total + r[...]
        refs[n][...] = total

    return region


def variants(n: int) -> dict:
    """name -> jitted function of the N separate inputs (packed variants take the packed array)."""
    from jax.experimental import thunky

    region = _summing_region(n)

    def args_body(*refs):
        thunky.call_jax(region, *refs)

    def views_body(packed, out):
        views = [packed.at[i * SIZE : (i + 1) * SIZE].reshape(SIDE, SIDE) for i in range(n)]
        thunky.call_jax(region, *views, out)

    def one_view_body(packed, out):
        def whole(p, o):
            o[...] = p[...].reshape(n, SIDE, SIDE).sum(0)

        thunky.call_jax(whole, packed, out)

    def empty_body(out):
        def zero(o):
            o[...] = jnp.zeros_like(o[...])

        thunky.call_jax(zero, out)

    args_k, views_k = thunky.jit(args_body), thunky.jit(views_body)
    one_k, empty_k = thunky.jit(one_view_body), thunky.jit(empty_body)

    def through(kernel, *xs):
        out = _out_ref()
        kernel(*xs, out)
        return out[...]

    def pack(*xs):
        return jnp.concatenate([x.reshape(-1) for x in xs])

    def total(xs):
        return sum(xs[1:], xs[0])

    views = jax.jit(lambda p: through(views_k, p))
    args = jax.jit(lambda *xs: through(args_k, *xs))
    empty_params = jax.jit(lambda *xs: through(empty_k), keep_unused=True)
    pack_jit = jax.jit(pack)
    return {
        "xla": jax.jit(lambda *xs: total(xs)),
        "args": args,
        "views": views,
        "one_view": jax.jit(lambda p: through(one_k, p)),
        "concat+views": jax.jit(lambda *xs: through(views_k, pack(*xs))),
        "empty": jax.jit(lambda: through(empty_k)),
        "empty+params": empty_params,
        "views+xla": jax.jit(lambda p, *xs: (through(views_k, p), total(xs))[0]),
        "pack_apart": lambda *xs: views(pack_jit(*xs)),
        "args direct": ThunkyProgram(args),  # the same executables, called without jax's dispatch
        "empty+params direct": ThunkyProgram(empty_params),
    }


def _per_call_us(fn, args, calls: int) -> tuple[float, float]:
    """(issue, total) µs per call: host time with nothing waited for, and with the wait at the end."""
    out = None
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    t1 = time.perf_counter()
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def measure(n: int, calls: int, repeats: int) -> dict:
    rng = np.random.default_rng(n)
    xs = [jnp.asarray(rng.standard_normal((SIDE, SIDE), dtype=np.float32)) for _ in range(n)]
    packed = jnp.concatenate([x.reshape(-1) for x in xs])
    fns = variants(n)
    inputs = {name: xs for name in fns} | {"views": [packed], "one_view": [packed], "empty": []}
    inputs["views+xla"] = [packed, *xs]
    want = np.asarray(fns["xla"](*xs), np.float64)
    errors = {}
    for name, fn in fns.items():
        got = np.asarray(jax.block_until_ready(fn(*inputs[name])), np.float64)
        if not name.startswith("empty"):
            errors[name] = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    issue: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            host, total = _per_call_us(fn, inputs[name], calls)
            issue[name].append(host)
            samples[name].append(total)
    return {
        "n": n,
        "median_us": {k: statistics.median(v) for k, v in samples.items()},
        "issue_median_us": {k: statistics.median(v) for k, v in issue.items()},
        "samples_us": samples,
        "max_rel_error": errors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 16, 64, 192])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = [measure(n, a.calls, a.repeats) for n in a.n]
    names = list(rows[0]["median_us"])
    print("N".rjust(5) + "".join(name.rjust(20) for name in names) + "   max rel error")
    for row in rows:
        errs = max(row["max_rel_error"].values())
        cells = "".join(f"{row['median_us'][k]:20.1f}" for k in names)
        print(str(row["n"]).rjust(5) + cells + f"   {errs:.1e}")
        host = "".join(f"{row['issue_median_us'][k]:20.1f}" for k in names)
        print("issue" + host)
    if a.json:
        device = str(jax.devices()[0])
        meta = {"jax": jax.__version__, "device": device, "calls": a.calls, "repeats": a.repeats}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""A Megatron-layout SwiGLU MLP on 8 CPU devices: w1/w3 column-split and w2 row-split over the
`model` axis of a 2x4 mesh, the batch over `data`, weights hoisted, under the built-in h200 profile
(what a CUDA machine gets). Prints jax.jit's time over jaxrw's, three medians of nine samples, and
writes them with the report's decision. Before the thirty-ninth session jaxrw merged [w1|w3] across
shard boundaries and ran 0.32-0.42x; now such a call is kept as written.

    python bench/tensor_parallel_cpu.py OUT.json COMMIT
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxrw  # noqa: E402


def swiglu(x, w1, w2, w3):
    return (jax.nn.silu(x @ w1) * (x @ w3)) @ w2


def _median_time(fn, args, calls=300, samples=9):
    fn(*args).block_until_ready()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            y = fn(*args)
        y.block_until_ready()
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def main() -> None:
    out, commit = sys.argv[1], sys.argv[2]
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    t, d, f = 8, 256, 688
    k = jax.random.split(jax.random.key(0), 4)
    col, row = NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model", None))
    w1 = jax.device_put(jax.random.normal(k[0], (d, f)) / 16, col)
    w3 = jax.device_put(jax.random.normal(k[1], (d, f)) / 16, col)
    w2 = jax.device_put(jax.random.normal(k[2], (f, d)) / 26, row)
    x = jax.device_put(jax.random.normal(k[3], (t, d)), NamedSharding(mesh, P("data", None)))
    args = (x, w1, w2, w3)
    opt, ref = jaxrw.optimize(swiglu, hoist_argnums=(1, 2, 3), profile="h200"), jax.jit(swiglu)
    ratios = []
    for _ in range(3):
        a, c = _median_time(ref, args), _median_time(opt, args)
        ratios.append(a / c)
        print(f"jax.jit {a * 1e6:.0f} us, jaxrw {c * 1e6:.0f} us: {a / c:.2f}x")
    rep = opt.report(*args)
    row_ = {
        "case": f"megatron swiglu t{t} d{d} f{f}, mesh 2x4 (data, model), hoisted, profile h200",
        "devices": "8 CPU (xla_force_host_platform_device_count)",
        "speedups_jit_over_jaxrw": ratios,
        "rewritten": rep.rewritten,
        "stop_reason": rep.stop_reason.value,
        "commit": commit,
    }
    with open(out, "w") as fh:
        json.dump(row_, fh, indent=1)


if __name__ == "__main__":
    main()

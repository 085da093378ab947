"""What a new signature costs to build, on this machine's CPU: the first call at a new shape.

A researcher's program meets new shapes (batch sizes, sequence lengths) and new small functions
all the time; each pays jaxrw's trace, encode, rewrite, extract and decode once, where jax.jit
pays its trace and compile. Timed here: `report(*args)` of an `optimize` already warmed on other
shapes (the process's one-time start-up excluded), per new shape, against jax.jit's
`.lower(*args).compile()` at the same shapes. Medians over the shapes.

    python bench/signature_cost_cpu.py [--shapes 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from jaxrw import optimize
from jaxrw.bench.runner import git_commit


def chain(a, b, v):
    return a @ b @ v


def mlp(params, x):
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return jnp.sum(x**2)


def mlp_step(params, x):
    grads = jax.grad(mlp)(params, x)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def deep_linear(ws, x):
    for w in ws:
        x = x @ w
    return jnp.mean(x**2)


def deep_linear_step(ws, x):
    grads = jax.grad(deep_linear)(ws, x)
    return [w - 0.01 * g for w, g in zip(ws, grads, strict=True)]


def _chain_args(n):
    return jnp.ones((n, n)), jnp.ones((n, n)), jnp.ones((n, 4))


def _mlp_args(n):
    params = [(jnp.ones((64, 64)) / 64, jnp.zeros(64)) for _ in range(4)]
    return params, jnp.ones((n, 64))


def _deep_args(n):
    return [jnp.eye(64) + 0.01 for _ in range(8)], jnp.ones((n, 64))


CASES = {
    "chain (2 equations)": (chain, _chain_args),
    "mlp_step (4 layers, grad + SGD)": (mlp_step, _mlp_args),
    "deep_linear_step (8 linear layers)": (deep_linear_step, _deep_args),
}


def measure(fn, make, shapes: int) -> dict:
    """Seconds per new signature, jaxrw's build and jax.jit's compile, at `shapes` new shapes."""
    opt = optimize(fn)
    opt.report(*make(7))  # warm: the process's first rewrite and jax's first traces
    jax.jit(fn).lower(*make(7)).compile()
    ours, jits = [], []
    for n in range(8, 8 + shapes):
        args = make(n)
        t = time.perf_counter()
        report = opt.report(*args)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        jax.jit(fn).lower(*args).compile()
        jits.append(time.perf_counter() - t)
    return {
        "jaxrw_build_s": statistics.median(ours),
        "jaxrw_build_range_s": [min(ours), max(ours)],
        "jit_compile_s": statistics.median(jits),
        "equations": report.n_equations,
        "phase_s": report.phase_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=12, help="new shapes timed per case")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = {name: measure(fn, make, a.shapes) for name, (fn, make) in CASES.items()}
    commit = git_commit()
    meta = {"commit": commit, "jax": jax.__version__, "machine": platform.processor() or platform.machine()}
    for name, r in rows.items():
        print(
            f"{name:34s} jaxrw build {r['jaxrw_build_s'] * 1e3:7.1f} ms "
            f"({r['jaxrw_build_range_s'][0] * 1e3:.0f}-{r['jaxrw_build_range_s'][1] * 1e3:.0f})   "
            f"jax.jit compile {r['jit_compile_s'] * 1e3:6.1f} ms"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "signatures": rows}, f, indent=1)


if __name__ == "__main__":
    main()

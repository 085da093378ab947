"""What a large program costs jaxrw to build on this machine's CPU, phase by phase: the gradient of
a tanh RNN unrolled in Python (8,409 equations at 400 steps), as researchers write small recurrent
models. Each build is `optimize(f).report(*args)` in a process that has built it once already.

    python bench/large_program_cpu.py [--steps 400] [--builds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxrw import optimize
from jaxrw.bench.runner import git_commit


def rnn_gradient(steps: int, hidden: int = 128, batch: int = 8, width: int = 32):
    """jax.grad of a mean-squared loss of a tanh RNN unrolled over `steps`, with its arguments."""
    rng = np.random.default_rng(1)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * scale)

    params = {
        "Wx": normal(width, hidden, scale=hidden**-0.5),
        "Wh": normal(hidden, hidden, scale=hidden**-0.5),
        "b": jnp.zeros(hidden),
        "Wo": normal(hidden, 1, scale=hidden**-0.5),
    }
    xs, ys = normal(steps, batch, width), normal(batch, 1)

    def loss(p, xs, ys):
        h = jnp.zeros((batch, hidden))
        for t in range(steps):
            h = jnp.tanh(xs[t] @ p["Wx"] + h @ p["Wh"] + p["b"])
        return jnp.mean((h @ p["Wo"] - ys) ** 2)

    return jax.grad(loss), (params, xs, ys)


def build(fn, args) -> dict:
    f = optimize(fn)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = f.report(*args)
    return {
        "build_s": round(time.perf_counter() - t, 2),
        "phases": {k: round(v, 2) for k, v in r.phase_s.items()},
        "fired": sum(r.rules_fired.values()),
        "nodes": r.egraph_nodes,
        "stop": r.stop_reason.value,
        "equations": r.n_equations,
        "cost": [r.cost_before, r.cost_after],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    fn, args = rnn_gradient(a.steps)
    build(fn, args)  # the process's one-time start-up: rules built, template e-graph made
    builds = [build(fn, args) for _ in range(a.builds)]
    for b in builds:
        print(b, flush=True)
    meta = {"commit": git_commit(), "jax": jax.__version__, "machine": platform.machine(), "steps": a.steps}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "builds": builds}, fh, indent=1)


if __name__ == "__main__":
    main()

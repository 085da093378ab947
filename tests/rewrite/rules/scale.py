"""How long the rewrite phase takes on large programs (a measurement, not a timed test).

    .venv/bin/python -m tests.rewrite.rules.scale            # ~2,000-equation MLP and attention stack

prints, per program: equations, seconds per phase, e-graph nodes, iterations and the stop reason.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from jaxrw.rewrite.profiles import CPU
from jaxrw.rewrite.run import Limits, RewriteReport, rewrite_jaxpr


def _rand(rng, *shape):
    return np.asarray(rng.standard_normal(shape), np.float32)


def deep_mlp(depth: int, d: int = 64):
    """x <- x + relu(x @ W + b), `depth` times: 5 equations a layer."""
    rng = np.random.default_rng(0)
    ws = [_rand(rng, d, d) * 0.1 for _ in range(depth)]
    bs = [_rand(rng, d) for _ in range(depth)]

    def f(x, ws, bs):
        for w, b in zip(ws, bs, strict=True):
            x = x + jax.nn.relu(x @ w + b)
        return x

    return f, (_rand(rng, 8, d), ws, bs)


def attention_stack(blocks: int, d: int = 32, heads: int = 4, s: int = 16):
    """Pre-layernorm attention blocks with q, k, v projections of one input (~42 equations each)."""
    rng = np.random.default_rng(1)
    params = [
        [_rand(rng, d, d) * 0.2 for _ in range(4)] + [_rand(rng, d), _rand(rng, d)] for _ in range(blocks)
    ]

    def f(x, params):
        for wq, wk, wv, wo, g, b in params:
            mu = x.mean(-1, keepdims=True)
            y = (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
            q, k, v = ((y @ w).reshape(s, heads, d // heads).transpose(1, 0, 2) for w in (wq, wk, wv))
            a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), -1)
            x = x + (a @ v).transpose(1, 0, 2).reshape(s, d) @ wo
        return x

    return f, (_rand(rng, s, d), params)


def measure(f, args, limits: Limits | None = None) -> RewriteReport:
    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat(*xs):
        return f(*jax.tree_util.tree_unflatten(tree, xs))

    closed = jax.make_jaxpr(flat)(*leaves)
    return rewrite_jaxpr(closed, profile=CPU, limits=limits).report


def main(argv: list[str]) -> None:
    depth = int(argv[1]) if len(argv) > 1 else 400
    blocks = int(argv[2]) if len(argv) > 2 else 48
    for name, (f, args) in (("mlp", deep_mlp(depth)), ("attention", attention_stack(blocks))):
        rep = measure(f, args)
        phases = " ".join(f"{k} {v:.2f}s" for k, v in rep.phase_s.items())
        print(
            f"{name}: {rep.n_equations} equations; {phases}; {rep.egraph_nodes} nodes, "
            f"{rep.iterations} iterations, stop: {rep.stop_reason.value}"
        )


if __name__ == "__main__":
    main(sys.argv)

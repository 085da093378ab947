"""Batching end to end (default roofline model, CPU profile)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .harness import count_prims, reaches


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def test_stacked_expert_products_become_one_batched_dot():
    rng = np.random.default_rng(0)
    x, w = _rand(rng, 8, 32, 64), _rand(rng, 8, 64, 32)
    opt = reaches(lambda x, w: jnp.stack([x[i] @ w[i] for i in range(8)]), lambda x, w: x @ w, (x, w))
    assert opt.dots == 1, opt.report
    assert count_prims(opt.fn, x, w, name="concatenate") == 0  # the stacks cancel against x and w


class GemmLaunches:
    """Counts GEMM kernels (plus a trace of FLOPs to break ties): the objective batching serves.
    jaxrw's roofline model prices each link of a concatenation chain as its own kernel (decode
    emits one n-ary concatenate), so with argument inputs it does not take this merge on CPU."""

    name = "gemm-launches"

    def node_cost(self, node, view):
        from jaxrw.rewrite.cost import node_flops

        return (1.0 if node.op == "dot" else 0.0) + 1e-9 * node_flops(node, view)


def test_independent_small_dots_become_one_batched_dot():
    # four experts on separate inputs, results used separately: the multi-dot batching rule
    rng = np.random.default_rng(1)
    ws = [_rand(rng, 32, 32) for _ in range(4)]
    xs = tuple(_rand(rng, 8, 32) for _ in range(4))
    opt = reaches(
        lambda a, b, c, d: (a @ ws[0], b @ ws[1], c @ ws[2], d @ ws[3]),
        lambda a, b, c, d: jnp.stack([a, b, c, d]) @ jnp.stack(ws),
        xs,
        cost_model=GemmLaunches(),
        extractor="ilp",
    )
    assert opt.report.rules_fired.get("batch.stack_dots", 0) > 0
    assert opt.dots == 1, opt.report

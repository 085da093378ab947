"""Batching end to end (default roofline model, CPU profile)."""

from __future__ import annotations

import jax
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


def test_every_step_input_product_becomes_one_gemm():
    # a recurrent cell unrolled: xs[t] @ W at every step is a row block of one product over all
    # steps (batch.index_rows, added after the main saturation, taken by the sharing pass); the
    # h @ U products depend on the previous step and stay one per step
    from jaxrw.rewrite.profiles import H200
    from jaxrw.rewrite.run import rewrite_jaxpr

    from .harness import flat_jaxpr, rel_err

    rng = np.random.default_rng(2)
    steps, batch, hidden = 4, 8, 64
    xs, h0 = _rand(rng, steps, batch, hidden), _rand(rng, batch, hidden)
    w, u = _rand(rng, hidden, hidden), _rand(rng, hidden, hidden)

    def cell(xs, h, w, u):
        outs = []
        for t in range(steps):
            h = jnp.tanh(xs[t] @ w + h @ u)
            outs.append(h)
        return jnp.stack(outs)

    closed, leaves = flat_jaxpr(cell, (xs, h0, w, u))
    # force: at this size XLA's dot merger makes one GEMM of the step products too, so the guard
    # (which prices that, xla_passes.py) keeps the program as written; this tests the extraction
    res = rewrite_jaxpr(closed, profile=H200, force=True)
    assert res.report.rules_fired.get("batch.index_rows", 0) > 0, res.report
    dots = [e for e in jax.make_jaxpr(res.fn)(*leaves).jaxpr.eqns if e.primitive.name == "dot_general"]
    want_shapes = [(batch, hidden)] * steps + [(steps * batch, hidden)]
    assert sorted(e.invars[0].aval.shape for e in dots) == want_shapes
    got, want = res.fn(*leaves)[0], cell(xs, h0, w, u)
    assert rel_err(got, want) <= 1e-5


def test_index_rows_is_not_taken_for_one_row_block_alone():
    # xs[t] @ W_t with a different W per step: lifting one step's product to all rows of xs
    # computes 3x the FLOPs for one row block; the extractor must keep the per-step products
    from jaxrw.rewrite.profiles import H200
    from jaxrw.rewrite.run import rewrite_jaxpr

    from .harness import flat_jaxpr, rel_err

    rng = np.random.default_rng(3)
    xs, ws = _rand(rng, 3, 8, 16), [_rand(rng, 16, 16) for _ in range(3)]

    def f(xs, *ws):
        return [jnp.tanh(xs[t] @ ws[t]) for t in range(3)]

    closed, leaves = flat_jaxpr(f, (xs, *ws))
    # force: at this size XLA's dot merger makes one GEMM of the step products too, so the guard
    # (which prices that, xla_passes.py) keeps the program as written; this tests the extraction
    res = rewrite_jaxpr(closed, profile=H200, force=True)
    assert res.report.rules_fired.get("batch.index_rows", 0) > 0, res.report
    if res.fn is not None:
        dots = [e for e in jax.make_jaxpr(res.fn)(*leaves).jaxpr.eqns if e.primitive.name == "dot_general"]
        assert all(e.invars[0].aval.shape != (24, 16) for e in dots)
        for got, want in zip(res.fn(*leaves), f(xs, *ws), strict=True):
            assert rel_err(got, want) <= 1e-5

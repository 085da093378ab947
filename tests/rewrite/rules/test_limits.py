"""Rule scheduling cannot explode: large programs saturate or stop at a limit, and say which.
(Timing on ~2,000 equations is measured by tests/rewrite/rules/scale.py, not asserted here.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite.run import Limits, StopReason

from .scale import attention_stack, deep_mlp, measure


def test_residual_mlp_saturates_without_growing():
    rep = measure(*deep_mlp(40))
    assert rep.stop_reason is StopReason.SATURATED
    assert rep.egraph_nodes < 10 * rep.n_equations


def test_attention_blocks_saturate_with_bounded_merges():
    rep = measure(*attention_stack(4))
    assert rep.stop_reason is StopReason.SATURATED
    assert rep.egraph_nodes < 10 * rep.n_equations
    assert rep.rules_fired.get("merge.shared_left", 0) > 0


def test_limits_are_reported_when_hit():
    rep = measure(*attention_stack(4), limits=Limits(iterations=2))
    assert rep.stop_reason is StopReason.ITERATION_LIMIT and rep.iterations == 2
    rep = measure(*attention_stack(4), limits=Limits(nodes=50))
    assert rep.stop_reason is StopReason.NODE_LIMIT


def _rows_of_matrices(xs, w, v):
    return xs[0] @ w, (xs[2] @ w) * 2, xs[1] @ v.T + 1, xs[3] @ w


def test_the_late_rules_stay_within_the_node_limit():
    # batch.index_rows runs once after the main rules; it matched 159k times after a sum of 16
    # scaled products stopped at 32k rows, grew the e-graph to 265k rows and took 14 s to extract
    # (36 products: 1.45M rows, 86 s); a rule with more matches than rows left now does not run
    xs, w, v = jnp.ones((4, 8, 16)), jnp.ones((16, 8)), jnp.ones((8, 16))
    free = jaxrw.optimize(_rows_of_matrices, rules=["batch.index_rows"]).report(xs, w, v)
    assert free.rules_fired == {"batch.index_rows": 4} and free.stop_reason is StopReason.SATURATED
    tight = jaxrw.optimize(_rows_of_matrices, rules=["batch.index_rows"], limits=Limits(nodes=60))
    rep = tight.report(xs, w, v)
    assert rep.rules_fired == {} and rep.stop_reason is StopReason.NODE_LIMIT


def test_sums_of_scaled_products_stop_near_the_node_limit():
    ms = [jax.random.normal(jax.random.key(i), (16, 16)) for i in range(4)]

    def f(ms):
        return sum(a @ b - b @ a * 0.5 for a in ms for b in ms)

    opt = jaxrw.optimize(f)
    rep = opt.report(ms)
    assert rep.stop_reason is StopReason.NODE_LIMIT and rep.egraph_nodes <= Limits().nodes
    np.testing.assert_allclose(opt(ms), jax.jit(f)(ms), rtol=1e-4, atol=1e-4)


def _zero_tangents(a, b, c):
    @jax.custom_jvp
    def f(a, b, c):
        return a * b + a * c

    @f.defjvp
    def f_jvp(primals, tangents):
        (a, b, c), (da, db, dc) = primals, tangents
        return f(a, b, c), da * (b + c) + a * (db + dc)

    return jax.grad(lambda a: f(a, b, c).sum())(a)  # b's and c's tangents: zeros, added


@pytest.mark.parametrize("numerics", ["default", "fast"])
def test_a_sum_of_zeros_saturates(numerics):
    # 0 + 0 = 0 (elementwise.add_zero) put the zero's own sum in its class, and like terms and
    # common factors then gathered 2·0, 3·0, (2+3)·0, ... without end: 5,356 nodes at the node limit
    # for a(0 + 0), 4 equations (a new user's try, 42nd session); custom_jvp's zero tangents add so
    a = jax.random.normal(jax.random.key(0), (4, 16))
    zeros_added = jaxrw.optimize(lambda a: a * (jnp.zeros_like(a) + jnp.zeros_like(a)), numerics=numerics)
    rep = zeros_added.report(a)
    assert rep.stop_reason is StopReason.SATURATED and rep.egraph_nodes < 30, rep
    np.testing.assert_array_equal(zeros_added(a), a * 0.0)
    opt = jaxrw.optimize(_zero_tangents, numerics=numerics)
    rep = opt.report(a, a + 1, a - 1)
    assert rep.stop_reason is StopReason.SATURATED and rep.egraph_nodes < 10 * rep.n_equations, rep
    want = jax.jit(_zero_tangents)(a, a + 1, a - 1)
    np.testing.assert_allclose(opt(a, a + 1, a - 1), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fn",
    [lambda a, b: a * 0.0 + a * 0.0 + b, lambda a, b: (a @ b) * 0.0 + (a @ b) * 0.0],
    ids=["products", "dots"],
)
def test_a_sum_of_zero_products_stays_small(fn):
    # a review: a·0 + a·0 lands in the class of a·0 (like terms, then 0 + 0 = 0), which then holds
    # a sum of itself that is not X: guarded for `X` alone, it still reached the node limit (15k
    # nodes for the first, 11k for the second with the dot rules' factors)
    a, b = (jax.random.normal(k, (16, 16)) for k in jax.random.split(jax.random.key(3)))
    opt = jaxrw.optimize(fn)
    rep = opt.report(a, b)
    assert rep.stop_reason is not StopReason.NODE_LIMIT and rep.egraph_nodes < 1000, rep
    np.testing.assert_allclose(opt(a, b), jax.jit(fn)(a, b), rtol=1e-6, atol=1e-6)


def test_a_rerun_with_no_time_left_says_where_the_time_went(monkeypatch):
    # a new user's SGD step: the first run took the 10 s, its inexact rewrites reached a saturating
    # op, and the rerun with exact rules only had none left; the report read "spent before this
    # program" with an empty phases row
    from jaxrw.rewrite import run

    calls = []

    def first_unsafe(view, in_cone):
        calls.append(1)
        return {"c0"} if len(calls) == 1 else set()

    monkeypatch.setattr(run, "unsafe_classes", first_unsafe)
    x, a, b = jnp.ones((4, 64)), jnp.ones((64, 64)), jnp.ones((64, 2))
    rep = jaxrw.optimize(lambda x, a, b: (x @ a) @ b, limits=Limits(time_s=1e-6)).report(x, a, b)
    assert rep.stop_reason is StopReason.TIME_LIMIT and not rep.rewritten
    assert "before its rerun with exact rules only" in rep.guard_note
    assert rep.phase_s.get("rewrite", 0) > 0 and rep.phase_s.get("encode", 0) > 0


def test_a_program_past_the_node_limit_before_any_rule_runs_none_does():
    # 2,000 independent products: the encoding and the stacking seed were past limits.nodes, and a
    # first iteration still ran (10 s more under time_s=1), as limits were checked after it
    from jaxrw.rewrite.profiles import default_profile
    from jaxrw.rewrite.run import Limits, StopReason, rewrite_jaxpr

    rng = np.random.default_rng(0)
    ms = [jnp.asarray(rng.standard_normal((8, 8)).astype(np.float32)) for _ in range(12)]
    closed = jax.make_jaxpr(lambda *m: [a @ b for a, b in zip(m[::2], m[1::2], strict=True)])(*ms)
    result = rewrite_jaxpr(closed, profile=default_profile("cpu"), limits=Limits(nodes=50))
    assert result.report.stop_reason is StopReason.NODE_LIMIT and result.report.iterations == 0
    result = rewrite_jaxpr(closed, profile=default_profile("cpu"), limits=Limits(time_s=1e-9))
    assert result.report.stop_reason is StopReason.TIME_LIMIT and result.report.iterations == 0

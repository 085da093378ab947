"""Rule scheduling cannot explode: large programs saturate or stop at a limit, and say which.
(Timing on ~2,000 equations is measured by tests/rewrite/rules/scale.py, not asserted here.)"""

from __future__ import annotations

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

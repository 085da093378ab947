"""Batching end to end (default roofline model, CPU profile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import count_prims, optimized, reaches


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


def _experts(seed: int, count: int):
    """`count` independent products x_i @ W_i (4x16 @ 16x8, closed-over weights): (f, xs)."""
    rng = np.random.default_rng(seed)
    ws = [_rand(rng, 16, 8) for _ in range(count)]
    xs = tuple(_rand(rng, 4, 16) for _ in range(count))

    def f(*xs):
        return [x @ w for x, w in zip(xs, ws, strict=True)]

    return f, xs


def _same_results(opt, f, xs):
    from .harness import rel_err

    for got, want in zip(opt.fn(*xs), f(*xs), strict=True):
        assert rel_err(got, want) <= 1e-6


def test_a_group_of_32_experts_is_batched_whole_in_one_iteration():
    # the group is written before saturation (Rule.seed): one iteration suffices where a rule
    # growing the stack one dot per iteration needed 31
    from jaxrw.rewrite.run import Limits

    f, xs = _experts(4, 32)
    opt = optimized(f, xs, cost_model=GemmLaunches(), limits=Limits(iterations=1))
    assert opt.report.rules_fired.get("batch.stack_dots") == 32, opt.report
    assert opt.dots == 1, opt.report
    _same_results(opt, f, xs)


def test_dots_of_different_levels_or_a_shared_operand_are_not_stacked_together():
    # x @ W then (x @ W) @ V has equal shapes at two levels: one depends on the other, so they
    # can't be one batched dot; a @ W and b @ W share W (the shared-operand merges take those)
    from jaxrw.rewrite.encode import encode
    from jaxrw.rewrite.rules import RULES

    from .harness import flat_jaxpr

    rng = np.random.default_rng(5)
    x, a, b = _rand(rng, 8, 8), _rand(rng, 8, 8), _rand(rng, 8, 8)
    w, v = _rand(rng, 8, 8), _rand(rng, 8, 8)
    closed, _ = flat_jaxpr(lambda x, a, b: ((x @ w) @ v, a @ w, b @ w), (x, a, b))
    program = encode(closed)
    assert len(program.dots) == 4
    assert RULES["batch.stack_dots"].seed(program) == 0
    # with two independent dots on distinct operands at level 1, the group is written
    closed, _ = flat_jaxpr(lambda x, a: (x @ w, a @ v), (x, a))
    assert RULES["batch.stack_dots"].seed(encode(closed)) == 2


def test_projections_sharing_an_input_stack_per_weight_and_as_one_group():
    # two decoders' q and k projections: x1 feeds q1 and k1, x2 feeds q2 and k2. Stacks: [q1, q2],
    # [k1, k2], and the four at once with x1 and x2 repeated, which one GEMM computes
    from jaxrw.rewrite.encode import encode
    from jaxrw.rewrite.rules import RULES

    from .harness import flat_jaxpr

    rng = np.random.default_rng(6)
    ws = [_rand(rng, 16, 16) for _ in range(4)]
    xs = (_rand(rng, 4, 16), _rand(rng, 4, 16))

    def f(x1, x2):
        return x1 @ ws[0], x1 @ ws[1], x2 @ ws[2], x2 @ ws[3]

    closed, _ = flat_jaxpr(f, xs)
    assert RULES["batch.stack_dots"].seed(encode(closed)) == 2 + 2 + 4
    opt = optimized(f, xs, cost_model=GemmLaunches())
    assert opt.dots == 1, opt.report
    _same_results(opt, f, xs)


def test_a_stack_of_closed_over_weights_is_folded_into_one_constant():
    # the stacked operand is a concatenation of the weights, each with a leading unit axis: both
    # are folded when the program is built (priced as copies otherwise), into one constant and
    # not one per prefix of the chain
    f, xs = _experts(7, 6)
    opt = optimized(f, xs, cost_model=GemmLaunches())
    assert opt.dots == 1, opt.report
    _same_results(opt, f, xs)
    built = jax.make_jaxpr(opt.fn)(*xs)
    assert [tuple(c.shape) for c in built.consts] == [(6, 16, 8)]
    assert all(
        e.primitive.name != "concatenate" or e.outvars[0].aval.shape[1:] != (16, 8) for e in built.jaxpr.eqns
    )


def test_a_stack_of_hoisted_weights_is_built_once_outside_the_hot_call():
    # with the weights hoisted, their stack (a concatenation of unit-axis relayouts of slow
    # arguments) is the prologue's one value; new weights rebuild it
    import jaxrw

    rng = np.random.default_rng(8)
    ws = [_rand(rng, 64, 64) for _ in range(8)]
    xs = [_rand(rng, 4, 64) for _ in range(8)]

    def f(ws, xs):
        return [x @ w for x, w in zip(xs, ws, strict=True)]

    opt = jaxrw.optimize(f, hoist_argnums=0, profile="h200")
    for weights in (ws, ws, [w * 2 for w in ws], [w * 2 for w in ws]):
        for got, want in zip(opt(weights, xs), f(weights, xs), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    rep = opt.report(ws, xs)
    assert rep.rewritten and rep.hoisted_bytes == 8 * 64 * 64 * 4, rep


def test_rows_of_one_array_stack_as_the_array_and_the_stacked_results_as_the_batched_dot():
    # x[i] @ w[i] stacked: the batched dot's operands are x and w themselves and its result is the
    # stack, in one iteration (Program.rows and Program.stacks), with no concatenation left
    from jaxrw.rewrite.run import Limits

    rng = np.random.default_rng(9)
    x, w = _rand(rng, 16, 4, 32), _rand(rng, 16, 32, 8)

    def f(x, w):
        return jnp.stack([x[i] @ w[i] for i in range(16)])

    opt = optimized(f, (x, w), cost_model=GemmLaunches(), limits=Limits(iterations=1))
    assert opt.dots == 1, opt.report
    assert count_prims(opt.fn, x, w, name="concatenate") == 0
    assert count_prims(opt.fn, x, w, name="slice") == 0
    _same_results(opt, lambda x, w: [f(x, w)], (x, w))


def test_rows_or_results_out_of_order_are_not_taken_for_a_slice_or_the_batched_dot():
    # x[0], x[2], x[1] (or x[0], x[2]) stacked are not x[0:3] (x[0:2]): a plausible but false
    # identity; the batched dot must read them restacked, and the stack of results likewise
    rng = np.random.default_rng(10)
    x, w = _rand(rng, 4, 3, 8), _rand(rng, 4, 8, 5)
    for order in ((0, 2, 1), (0, 2), (1, 0)):

        def f(x, w, order=order):
            return jnp.stack([x[i] @ w[i] for i in order])

        opt = optimized(f, (x, w), cost_model=GemmLaunches())
        assert opt.report.rules_fired.get("batch.stack_dots") == len(order), opt.report
        _same_results(opt, lambda x, w, f=f: [f(x, w)], (x, w))

    def g(x, w):  # computed in order, stacked in another: not the batched dot itself
        d = [x[i] @ w[i] for i in range(3)]
        return jnp.stack([d[2], d[0], d[1]])

    opt = optimized(g, (x, w), cost_model=GemmLaunches())
    assert opt.report.rules_fired.get("batch.stack_dots") == 3, opt.report
    _same_results(opt, lambda x, w: [g(x, w)], (x, w))


@given(
    n=st.integers(2, 5),
    share_a=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    share_b=st.lists(st.integers(0, 4), min_size=5, max_size=5),
    rows=st.booleans(),
    stacked=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_stacked_groups_match_a_float64_reference(n, share_a, share_b, rows, stacked, seed):
    # groups with shared operands (several stacks plus the whole group), operands that are rows of
    # one array, results stacked or not: batched whenever it is taken, and the same values
    rng = np.random.default_rng(seed)
    # rows of two arrays, or five separate arrays each (the same one for equal share indices)
    xs, ws = _rand(rng, 5, 3, 6), _rand(rng, 5, 6, 4)
    if not rows:
        xs, ws = list(xs), list(ws)

    def f(xs, ws):
        a = [xs[i if rows else share_a[i]] for i in range(n)]
        b = [ws[i if rows else share_b[i]] for i in range(n)]
        out = [p @ q for p, q in zip(a, b, strict=True)]
        return jnp.stack(out) if stacked else out

    opt = optimized(f, (xs, ws), cost_model=GemmLaunches())
    pairs = [(i, i) if rows else (share_a[i], share_b[i]) for i in range(n)]
    stackable = any(p[0] != q[0] and p[1] != q[1] for p in pairs for q in pairs)
    assert (opt.report.rules_fired.get("batch.stack_dots", 0) > 0) == stackable, opt.report
    got = opt.fn(*jax.tree_util.tree_leaves((xs, ws)))
    as64 = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64), (xs, ws))
    want = jax.tree_util.tree_leaves(f(*as64))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-5, atol=1e-5)


def test_a_group_larger_than_a_stack_is_batched_in_parts(monkeypatch):
    # 2,000 products stacked whole wrote 2,000 concatenation links per side and passed the node
    # limit before any rule ran; a group is stacked in parts of batch.MAX_STACK (here 4)
    from jaxrw.rewrite.rules import batch

    monkeypatch.setattr(batch, "MAX_STACK", 4)
    f, xs = _experts(4, 10)
    opt = optimized(f, xs, cost_model=GemmLaunches())
    assert opt.report.rules_fired.get("batch.stack_dots") == 10, opt.report  # 4 + 4 + 2, no whole
    assert opt.dots == 3, opt.report
    _same_results(opt, f, xs)


def test_the_seed_joins_through_facts_the_analysis_applies():
    # the seed's unions go in as `joined` facts, applied and deleted by the analysis that runs next
    # (each union as a command of its own cost a pass over the e-graph); the batching they make
    # is what the tests above check
    from jaxrw.rewrite.encode import encode
    from jaxrw.rewrite.rules import RULES
    from jaxrw.rewrite.terms import analysis

    from .harness import flat_jaxpr

    def facts(program):
        return sum(n for fn, n in program.egraph.all_function_sizes() if "joined" in str(fn))

    f, xs = _experts(4, 6)
    program = encode(flat_jaxpr(f, xs)[0])
    program.egraph.run(analysis.saturate())
    assert RULES["batch.stack_dots"].seed(program) == 6
    assert facts(program) == 6  # one per dot, not applied yet
    program.egraph.run(analysis.saturate())
    assert facts(program) == 0

"""Rewriting inside scan, while_loop/fori_loop and cond bodies, with loop invariants hoisted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxrw
from jaxrw.rewrite.profiles import CPU
from jaxrw.rewrite.run import rewrite_jaxpr


def _r(seed, *shape):
    return jnp.asarray(
        np.random.default_rng(seed).standard_normal(shape).astype(np.float32) / np.sqrt(shape[0])
    )


def _count_in_body(closed_fn, args, prim, body_prim="scan"):
    """dot_generals inside the loop body of the optimized program."""
    jaxpr = jax.make_jaxpr(closed_fn)(*args).jaxpr
    n = 0

    def walk(j, inside):
        nonlocal n
        for e in j.eqns:
            if e.primitive.name == prim and inside:
                n += 1
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub, inside or e.primitive.name == body_prim)

    walk(jaxpr, False)
    return n


def test_scan_body_is_rewritten_and_invariant_product_hoisted():
    d = 64
    A, B, h0 = _r(0, d, d), _r(1, d, d), _r(2, 8, d)
    xs = _r(3, 5, 8, d)

    def f(A, B, h0, xs):
        def step(h, x):
            h = jnp.tanh(h @ (A @ B) + x)  # A @ B is loop-invariant: hoisted out of the scan
            return h, h.sum()

        return jax.lax.scan(step, h0, xs)

    opt = jaxrw.optimize(f)
    got, want = opt(A, B, h0, xs), f(A, B, h0, xs)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    rep = opt.report(A, B, h0, xs)
    assert rep.bodies and rep.bodies[0].rewritten and rep.bodies[0].hoisted_bytes == d * d * 4
    assert _count_in_body(f, (A, B, h0, xs), "dot_general") == 2
    assert _count_in_body(opt, (A, B, h0, xs), "dot_general") == 1  # only h @ AB stays in the loop


def test_fori_loop_and_cond_bodies():
    n = 128
    A, B, C, v = _r(4, n, n), _r(5, n, n), _r(6, n, n), _r(7, n, 2)

    def f(A, B, C, v, flag):
        def body(i, u):
            return jnp.tanh(((A @ B) @ C) @ u)  # reassociated inside the loop body

        u = jax.lax.fori_loop(0, 3, body, v)
        return jax.lax.cond(flag > 0, lambda u: (A @ B) @ u, lambda u: u * 2.0, u)

    opt = jaxrw.optimize(f)
    flag = jnp.int32(1)
    np.testing.assert_allclose(opt(A, B, C, v, flag), f(A, B, C, v, flag), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(opt(A, B, C, v, -flag), f(A, B, C, v, -flag), rtol=1e-3, atol=1e-4)
    rep = opt.report(A, B, C, v, flag)
    assert sum(b.rewritten for b in rep.bodies) >= 2


def test_while_loop_body_with_hoisted_constants():
    d = 32
    W1, W2, x0 = _r(8, d, d), _r(9, d, d), _r(10, 4, d)

    def f(W1, W2, x0):
        def cond(c):
            return c[0] < 4

        def body(c):
            i, x = c
            return i + 1, jnp.tanh(x @ W1.T @ W2.T)

        return jax.lax.while_loop(cond, body, (0, x0))[1]

    closed = jax.make_jaxpr(f)(W1, W2, x0)
    res = rewrite_jaxpr(closed, profile=CPU)
    assert res.report.bodies
    opt = jaxrw.optimize(f)
    np.testing.assert_allclose(opt(W1, W2, x0), f(W1, W2, x0), rtol=1e-4, atol=1e-5)


def test_control_flow_bodies_left_alone_when_disabled():
    d = 32
    A, B, h0, xs = _r(11, d, d), _r(12, d, d), _r(13, 2, d), _r(14, 3, 2, d)

    def f(A, B, h0, xs):
        return jax.lax.scan(lambda h, x: (h @ (A @ B) + x, None), h0, xs)[0]

    res = rewrite_jaxpr(jax.make_jaxpr(f)(A, B, h0, xs), profile=CPU, control_flow=False)
    assert not res.report.bodies


def test_nasrnn_cell_in_a_scan_merges_its_eight_shared_input_products_per_step():
    # issue 9's example: each step's x@W_i merge into x@[W_1..W_8] and h@U_i into h@[U_1..U_8]
    # (or all sixteen into one batched product); the concatenated weights are loop-invariant and
    # built once, outside the scan
    from jaxrw.bench.nets import _nas_combine

    d, batch, steps = 64, 4, 6
    W = [_r(10 + i, d, d) for i in range(8)]
    U = [_r(20 + i, d, d) for i in range(8)]
    xs, h0 = _r(30, steps, batch, d), _r(31, batch, d)

    def cell_scan(W, U, xs, h0):
        def step(h, x):
            h = _nas_combine([x @ W[i] + h @ U[i] for i in range(8)])
            return h, h

        return jax.lax.scan(step, h0, xs)[1]

    opt = jaxrw.optimize(cell_scan, profile="h200")
    np.testing.assert_allclose(opt(W, U, xs, h0), cell_scan(W, U, xs, h0), rtol=1e-5, atol=1e-6)
    rep = opt.report(W, U, xs, h0)
    assert rep.bodies and rep.bodies[0].rewritten and rep.bodies[0].hoisted_bytes == 2 * 8 * d * d * 4
    assert _count_in_body(cell_scan, (W, U, xs, h0), "dot_general") == 16
    # x@[W_1..W_8] and h@[U_1..U_8], or the sixteen as one batched GEMM (batch.stack_dots)
    assert _count_in_body(opt, (W, U, xs, h0), "dot_general") in (1, 2)


def _custom_pair():
    """The same chain under custom_jvp and custom_vjp, each with a derivative rule that is not the
    derivative of the chain (so a gradient shows which one jax used). The chain ends in sin, not
    a saturating function such as tanh: default numerics leaves a chain that reaches one as
    written (rewrite/nonfinite.py)."""

    @jax.custom_jvp
    def f(x, a, b):
        return jnp.sin((x @ a) @ b)

    @f.defjvp
    def f_jvp(primals, tangents):
        return f(*primals), 3.0 * tangents[0]

    @jax.custom_vjp
    def g(x, a, b):
        return jnp.sin((x @ a) @ b)

    g.defvjp(lambda x, a, b: (g(x, a, b), None), lambda _, ct: (2.0 * ct, None, None))
    return f, g


def test_custom_jvp_and_vjp_primals_are_rewritten_and_their_rules_kept():
    x, a, b = _r(0, 256, 8), _r(1, 8, 256), _r(2, 256, 8)
    for fn in _custom_pair():

        def loss(x, a, b, fn=fn):
            return (fn(x, a, b) * 2).sum()

        opt = jaxrw.optimize(loss)
        rep = opt.report(x, a, b)
        assert rep.rewritten and any(body.rewritten for body in rep.bodies)
        fired = {k for body in rep.bodies for k in body.rules_fired}
        assert any(k.startswith("dot.assoc") for k in fired)  # x @ (a @ b): the 8-wide product first
        with jax.enable_x64(True):
            want = float(jax.jit(loss)(*(np.asarray(v, np.float64) for v in (x, a, b))))
        np.testing.assert_allclose(float(opt(x, a, b)), want, rtol=1e-4)
        # the user's rule, not a derivative of the rewritten primal: 2 * (3 or 2) everywhere
        np.testing.assert_allclose(jax.grad(opt)(x, a, b), jax.grad(loss)(x, a, b))


def test_checkpoint_region_is_rewritten_and_stays_a_region():
    # jax.checkpoint marks activations to recompute under jax.grad: the optimized program keeps the
    # region (its body rewritten on its own) instead of inlining it, which would save them instead.
    # sin, not tanh: default numerics does not reassociate a chain that reaches tanh (nonfinite.py)
    def block(x, a, b):
        return jnp.sin((x @ a) @ b)

    def loss(x, a, b):
        return jax.checkpoint(block)(x, a, b).sum()

    x, a, b = _r(0, 256, 8), _r(1, 8, 256), _r(2, 256, 8)
    opt = jaxrw.optimize(loss)
    rep = opt.report(x, a, b)
    assert rep.rewritten and any(body.rewritten for body in rep.bodies)
    grad_jaxpr = str(jax.make_jaxpr(jax.grad(opt))(x, a, b))
    assert "remat" in grad_jaxpr or "checkpoint" in grad_jaxpr
    np.testing.assert_allclose(jax.grad(opt)(x, a, b), jax.grad(loss)(x, a, b), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(opt(x, a, b)), float(loss(x, a, b)), rtol=1e-4)


def test_a_region_whose_output_reaches_tanh_outside_is_not_reassociated():
    """The body of a custom_jvp is rewritten before the program around it: the encoder tells it
    which outputs reach a saturating op outside (rewrite/nonfinite.py), and default numerics then
    leaves the chain as written there; "fast" reassociates it."""
    f, _ = _custom_pair()
    x, a, b = _r(0, 256, 8), _r(1, 8, 256), _r(2, 256, 8)

    def outside(x, a, b):
        return jnp.tanh(f(x, a, b)).sum()

    def assoc_fired(rep):
        return any(k.startswith("dot.assoc") for body in rep.bodies for k in body.rules_fired)

    assert not assoc_fired(jaxrw.optimize(outside).report(x, a, b))
    assert assoc_fired(jaxrw.optimize(outside, numerics="fast").report(x, a, b))
    assert assoc_fired(jaxrw.optimize(lambda x, a, b: f(x, a, b).sum()).report(x, a, b))


def test_jaxpr_cone_follows_inlined_calls_and_saturating_operands():
    from jaxrw.rewrite.encode import _inlined_body
    from jaxrw.rewrite.nonfinite import jaxpr_cone

    @jax.jit
    def inner(p, q):
        return p @ q, p * 2.0

    def f(x, y, z, w):
        s, t = inner(x, y)
        return jnp.tanh(s), t + z, w / z

    closed = jax.make_jaxpr(f)(*(jnp.ones((2, 2)),) * 4)
    x, y, z, w = closed.jaxpr.invars
    cone = jaxpr_cone(closed.jaxpr, (), _inlined_body)
    assert {x, y, z} <= cone and w not in cone  # x, y reach tanh through the call; z divides
    cone_out = jaxpr_cone(closed.jaxpr, (2,), _inlined_body)
    assert w in cone_out  # w / z is an output that reaches a saturating op outside


def test_values_hoisted_out_of_a_scan_keep_their_weak_type():
    # a loop-invariant weak-typed input: the body built around the hoisted values must see it
    # weak, or an output that depends on it changes type (found by a review)
    rng = np.random.default_rng(0)
    w1, w2 = (jnp.asarray(rng.standard_normal((16, 16)), jnp.float32) for _ in range(2))
    wk = jnp.full((16, 16), 0.01)  # weak-typed float32
    c0 = jnp.asarray(rng.standard_normal((4, 16)), jnp.float32)

    def fn(w1, w2, wk, c0):
        def body(c, _):
            return jnp.tanh(c @ w1) + jnp.tanh(c @ w2) + c @ wk.T, wk.T + 0

        return jax.lax.scan(body, c0, None, length=3)

    got = jaxrw.optimize(fn, strict=True)(w1, w2, wk, c0)
    want = jax.jit(fn)(w1, w2, wk, c0)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert g.dtype == w.dtype and g.weak_type == w.weak_type
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)

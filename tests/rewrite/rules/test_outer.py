"""Outer products (rules/outer.py): per-example gradients under jax.vmap, their norms and their
clipped sum (DP-SGD), checked against float64 and for what the rewritten program no longer
computes; and the programs the rules must leave alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrw
from jaxrw.rewrite.encode import encode
from jaxrw.rewrite.rules import select_rules

from .harness import flat_jaxpr, intermediate_shapes, optimize_without_fallback, reference, rel_err, run_rules
from .per_example import clipped_mean, grad_norms, normal, optax_style_clip, per_example

select_rules(None)  # load every family


B, N, M = 64, 128, 96  # large enough that the factored form is predicted faster


def _args(seed, b=B, n=N, m=M, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return normal(rng, n, m, dtype=dtype), normal(rng, b, n, dtype=dtype), normal(rng, b, m, dtype=dtype)


def _no_per_example_gradient(opt, args):
    """Whether the program `opt` runs forms no [b, n, m] (or [b, m, n]) gradient."""
    return not {(B, N, M), (B, M, N)} & intermediate_shapes(opt, args)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_per_example_gradient_norms_need_only_the_factors(dtype, tol, seed):
    args = _args(seed, dtype=dtype)
    opt, out = optimize_without_fallback(grad_norms, args)
    fired = opt.report(*args).rules_fired
    assert fired.get("outer.product") and fired.get("outer.norm"), fired
    assert opt.report(*args).rewritten
    (want,) = reference(grad_norms, args)
    assert rel_err(out, want) <= max(tol, 10 * rel_err(jax.jit(grad_norms)(*args), want))
    # no [b, n, m] gradient is formed: the norm is |x| |δ| per example
    assert _no_per_example_gradient(opt, args)


@pytest.mark.parametrize("numerics", ["default", "fast"])
def test_a_clipped_mean_of_per_example_gradients_is_one_product(numerics):
    args = _args(2)
    opt, out = optimize_without_fallback(clipped_mean, args, numerics=numerics)
    fired = opt.report(*args).rules_fired
    assert fired.get("outer.scale") and fired.get("outer.batch_sum"), fired
    (want,) = reference(clipped_mean, args)
    assert rel_err(out, want) <= 1e-5
    # the norms too, though they reach a divisor: outer.norm keeps every NaN and Inf in place
    assert fired.get("outer.norm"), fired
    assert _no_per_example_gradient(opt, args)


def test_raveled_per_example_gradients_are_normed_by_their_factors():
    # DP code often norms each example's gradient flattened: jnp.linalg.norm(jnp.ravel(g))
    args = _args(9)

    def fn(w, xs, ys):
        return jax.vmap(lambda g: jnp.linalg.norm(jnp.ravel(g)))(per_example(w, xs, ys))

    opt, out = optimize_without_fallback(fn, args)
    assert opt.report(*args).rules_fired.get("outer.norm"), opt.report(*args).rules_fired
    (want,) = reference(fn, args)
    assert rel_err(out, want) <= 1e-5
    assert _no_per_example_gradient(opt, args) and (B, N * M) not in intermediate_shapes(opt, args)


@pytest.mark.parametrize("numerics", ["default", "fast"])
def test_optax_style_clipping(numerics):
    args = _args(7)
    opt, out = optimize_without_fallback(optax_style_clip, args, numerics=numerics)
    fired = opt.report(*args).rules_fired
    assert fired.get("outer.batch_sum"), fired
    (want,) = reference(optax_style_clip, args)
    assert rel_err(out, want) <= 1e-5
    assert _no_per_example_gradient(opt, args)


def test_vmap_of_vmap_and_jnp_outer():
    rng = np.random.default_rng(3)
    xs, ys = normal(rng, 3, 5, 16), normal(rng, 3, 5, 12)
    u, v = normal(rng, 16), normal(rng, 12)

    def f(xs, ys, u, v):
        per = jax.vmap(jax.vmap(lambda x, y: jnp.outer(x, y)))(xs, ys)  # [3, 5, 16, 12]
        two = jax.vmap(jax.vmap(lambda x, y: lax.dot_general(x, y, (((), ()), ((), ())))))(xs, ys)
        return jnp.sum(per**2, axis=(2, 3)), jnp.sum(two, axis=(2, 3)), jnp.sum(jnp.outer(u, v) ** 2)

    opt, out = optimize_without_fallback(f, (xs, ys, u, v))
    fired = opt.report(xs, ys, u, v).rules_fired
    assert fired.get("outer.sum", 0) + fired.get("outer.norm", 0) >= 3, fired
    for got, want in zip(out, reference(f, (xs, ys, u, v)), strict=True):
        assert rel_err(got, want) <= 1e-5


def test_only_dots_that_contract_nothing_are_outer_products():
    rng = np.random.default_rng(4)
    xs, ys, w = normal(rng, 6, 8), normal(rng, 6, 8), normal(rng, 8, 8)

    def f(xs, ys, w):
        return (
            lax.dot_general(xs, ys, (((1,), (1,)), ((0,), (0,)))),  # contracts: a batched dot
            xs @ w,
            # a precision of its own
            lax.dot_general(xs, ys, (((), ()), ((), ())), precision=lax.Precision.HIGHEST),
            lax.dot_general(xs, ys.astype(jnp.bfloat16), (((), ()), ((0,), (0,)))),  # mixed operand types
        )

    program = encode(flat_jaxpr(f, (xs, ys, w))[0])
    assert program.outers == []


# --- what must stay --------------------------------------------------------------------------------


def _outer3(p, q):
    b, n = p.shape
    m = q.shape[1]
    return lax.broadcast_in_dim(p, (b, n, m), (0, 1)) * lax.broadcast_in_dim(q, (b, n, m), (0, 2))


LEFT_ALONE = {
    # a sum over one product axis only: p_i² Σ_j q_j², not a product of two sums
    "outer.norm over one axis": (lambda p, q: jnp.sum(_outer3(p, q) ** 2, axis=2), "outer.norm"),
    # the square summed over the batch: Σ_b p_b² q_b², not (Σ p²)(Σ q²)
    "outer.batch_sum of a square": (lambda p, q: jnp.sum(_outer3(p, q) ** 2, axis=0), "outer.batch_sum"),
    # a cube: Σ (p q)³ = (Σ p³)(Σ q³) holds, but only the square is written (no rule for it)
    "outer.norm of a cube": (lambda p, q: jnp.sum(_outer3(p, q) ** 3, axis=(1, 2)), "outer.norm"),
    # a scale along a product axis is not per example
    "outer.scale along n": (lambda p, q: _outer3(p, q) * p[:1, :, None], "outer.scale"),
}


@pytest.mark.parametrize("case", sorted(LEFT_ALONE))
def test_look_alikes_are_left_alone(case):
    fn, rule = LEFT_ALONE[case]
    rng = np.random.default_rng(5)
    args = (normal(rng, 6, 8), normal(rng, 6, 5))
    fired = run_rules(fn, args, [rule, "outer.product"]).report.rules_fired
    assert fired.get("outer.product") and not fired.get(rule), fired  # the product found, not this
    np.testing.assert_allclose(jaxrw.optimize(fn)(*args), jax.jit(fn)(*args), rtol=1e-5, atol=1e-6)


def test_an_operand_broadcast_along_the_batch_is_not_an_outer_product():
    # p of one row broadcast over the batch: Σ_b p ⊗ q_b = p ⊗ Σ_b q_b, not a dot of p and q
    rng = np.random.default_rng(6)
    p, q = normal(rng, 1, 8), normal(rng, 6, 5)

    def fn(p, q):
        wide = lax.broadcast_in_dim(p, (6, 8, 5), (0, 1))
        return jnp.sum(wide * lax.broadcast_in_dim(q, (6, 8, 5), (0, 2)), 0)

    rules = ["outer.batch_sum", "outer.sum", "outer.norm", "outer.product"]
    fired = run_rules(fn, (p, q), rules).report.rules_fired
    assert not any(fired.get(r) for r in rules), fired
    np.testing.assert_allclose(jaxrw.optimize(fn)(p, q), jax.jit(fn)(p, q), rtol=1e-5, atol=1e-6)


def test_float16_squares_are_left_to_the_product():
    # p² overflows float16 past 256 where (p q)² need not: 300 · 0.01 squared is 9
    p = jnp.full((4, 3), 300.0, jnp.float16)
    q = jnp.full((4, 2), 0.01, jnp.float16)
    fn = lambda p, q: jnp.sum(_outer3(p, q) ** 2, axis=(1, 2))  # noqa: E731
    fired = run_rules(fn, (p, q), ["outer.norm", "outer.product"]).report.rules_fired
    assert fired.get("outer.product") and not fired.get("outer.norm"), fired  # found, not summed
    assert np.isfinite(np.asarray(jaxrw.optimize(fn)(p, q), np.float32)).all()


def test_norms_keep_the_programs_nan_and_inf_before_a_divisor():
    # x with an Inf against δ with a 0 and a nonzero: the program's norm is NaN (Inf·0), the
    # factors' Inf; 1/norm would make that 0 where jax.jit gives NaN. Row by row: NaN, Inf
    # (no zero in δ), NaN (a NaN), and finite
    inf, nan = np.inf, np.nan
    x = jnp.array([[inf, 1.0], [inf, 2.0], [nan, 1.0], [1.0, 2.0]], jnp.float32)
    d = jnp.array([[0.0, 3.0], [1.0, 3.0], [1.0, 1.0], [0.0, 3.0]], jnp.float32)

    def fn(x, d):
        n = jnp.sqrt(jnp.sum(_outer3(x, d) ** 2, axis=(1, 2)))
        return 1.0 / (n + 1e-6), n

    opt, (clip, norm) = optimize_without_fallback(fn, (x, d))
    assert opt.report(x, d).rules_fired.get("outer.norm"), opt.report(x, d).rules_fired
    want_clip, want_norm = jax.jit(fn)(x, d)
    np.testing.assert_array_equal(np.isnan(norm), np.isnan(want_norm))
    np.testing.assert_allclose(clip, want_clip, rtol=1e-6)  # NaN where NaN, 0 where Inf
    np.testing.assert_array_equal(np.isnan(clip), np.isnan(want_clip))


# --- a review's findings: each fell back or differed from jax.jit before its fix ------------------

REVIEWED = {
    # operands of more than one axis past the batch: the rules' forms are vectors (fallbacks)
    "matrix x vector, summed": (
        lambda a, v: jnp.sum(jnp.einsum("bij,bk->bijk", a, v) ** 2, axis=(1, 2)),
        ((4, 8, 8), (4, 8)),
    ),
    "matrix x vector, scaled": (
        lambda a, v, c: jnp.einsum("bij,bk->bijk", a, v) * c[:, None, None, None],
        ((4, 8, 8), (4, 8), (4,)),
    ),
    "matrix x scalar dot, transposed": (
        lambda a, v: jnp.swapaxes(lax.dot_general(a, v, (((), ()), ((0,), (0,)))), 1, 2),
        ((2, 3, 4), (2,)),
    ),
}


@pytest.mark.parametrize("case", sorted(REVIEWED))
def test_outer_products_of_matrices_are_left_to_the_program(case):
    fn, shapes = REVIEWED[case]
    rng = np.random.default_rng(0)
    args = tuple(normal(rng, *s) for s in shapes)
    _, out = optimize_without_fallback(fn, args)
    np.testing.assert_allclose(out, jax.jit(fn)(*args), rtol=1e-5, atol=1e-6)


def test_float16_outer_products_keep_their_overflows():
    # each 300·300 product overflows float16 in the program: a dot summing them in float32
    # cancelled them to 0 (jax.jit: NaN, Inf); and c·p = 90000 overflowed where p·q·c is 2400
    h = jnp.float16
    p, q = jnp.full((8, 64), 300.0, h), jnp.tile(jnp.array([[300.0], [-300.0]], h), (4, 64))
    fns = {
        "tensordot": (lambda p, q, c: jnp.tensordot(c, _outer3(p, q), axes=1), (p, q, jnp.ones(8, h))),
        "sum": (lambda p, q: lax.reduce_sum(_outer3(p, q), (0,)), (p, q)),
        "scale": (
            lambda p, q, c: lax.reduce_sum(_outer3(p, q) * c[:, None, None], (0,)),
            (p, jnp.full((8, 64), 1 / 300, h), jnp.full((8,), 300.0, h)),
        ),
    }
    for name, (fn, args) in fns.items():
        fired = run_rules(fn, args, ["outer.product", "outer.batch_sum", "outer.scale"]).report.rules_fired
        assert fired.get("outer.product") and not fired.get("outer.batch_sum"), (name, fired)
        want = np.asarray(jax.jit(fn)(*args), np.float32)
        got = np.asarray(jaxrw.optimize(fn)(*args), np.float32)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=name)

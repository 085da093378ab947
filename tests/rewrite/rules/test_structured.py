"""Structured operands end to end (default roofline model, CPU profile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxrw

from .harness import reaches, run_rules


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def test_diagonal_matrix_product_scales_rows():
    rng = np.random.default_rng(0)
    v, a, b = _rand(rng, 256), _rand(rng, 256, 256), _rand(rng, 256, 256)
    fast = {"numerics": "fast"}  # diag(v) @ a spreads a NaN down each column holding an inf; v * a not
    f = lambda v, a, b: jnp.diag(v) @ a @ b  # noqa: E731
    opt = reaches(f, lambda v, a, b: v[:, None] * (a @ b), (v, a, b), **fast)
    assert opt.dots == 1
    reaches(lambda a, v: a @ jnp.diag(v), lambda a, v: a * v[None, :], (a, v), **fast)


def test_identity_product():
    rng = np.random.default_rng(1)
    a = _rand(rng, 256, 256)
    opt = reaches(lambda a: jnp.eye(256) @ a @ jnp.eye(256) + 1, lambda a: a + 1, (a,), numerics="fast")
    assert opt.dots == 0


def test_outer_product_times_matrix():
    rng = np.random.default_rng(2)
    u, w, a = _rand(rng, 256), _rand(rng, 256), _rand(rng, 256, 256)
    reaches(lambda u, w, a: jnp.outer(u, w) @ a, lambda u, w, a: u[:, None] * (w @ a)[None, :], (u, w, a))


def test_low_rank_update_times_matrix():
    rng = np.random.default_rng(3)
    a, u, w = _rand(rng, 256, 256), _rand(rng, 256), _rand(rng, 256)
    x = _rand(rng, 256, 8)
    reaches(
        lambda a, u, w, x: (a + jnp.outer(u, w)) @ x,
        lambda a, u, w, x: a @ x + u[:, None] * (w @ x)[None, :],
        (a, u, w, x),
    )


def test_kronecker_product_times_vector_and_matrix():
    rng = np.random.default_rng(4)
    a, b = _rand(rng, 16, 12), _rand(rng, 8, 10)
    x2, x1 = _rand(rng, 120, 3), _rand(rng, 120)

    def best2(a, b, x):
        y = jnp.einsum("ij,jlc->ilc", a, x.reshape(12, 10, 3))
        return jnp.einsum("ilc,kl->ikc", y, b).reshape(128, 3)

    def best1(a, b, x):
        return (a @ x.reshape(12, 10) @ b.T).reshape(128)

    reaches(lambda a, b, x: jnp.kron(a, b) @ x, best2, (a, b, x2))
    reaches(lambda a, b, x: jnp.kron(a, b) @ x, best1, (a, b, x1))


def test_products_with_broadcast_rows_and_columns():
    rng = np.random.default_rng(5)
    v, b = _rand(rng, 256), _rand(rng, 256, 256)
    reaches(
        lambda v, b: jnp.broadcast_to(v, (256, 256)) @ b,
        lambda v, b: jnp.broadcast_to(v @ b, (256, 256)),
        (v, b),
    )
    reaches(lambda b: jnp.ones((256, 256)) @ b, lambda b: jnp.broadcast_to(b.sum(0), (256, 256)), (b,))


def test_per_example_adapters_share_the_base_weight():
    # multi-LoRA under jax.vmap: x_b @ (W + A_b B_b) formed a [b, d, d] weight per example
    rng = np.random.default_rng(6)
    x, w = _rand(rng, 8, 4, 128), _rand(rng, 128, 128) / 16
    a, b = _rand(rng, 8, 128, 4) / 16, _rand(rng, 8, 4, 128) / 16
    f = jax.vmap(lambda x, a, b, w: x @ (w + a @ b), (0, 0, 0, None))
    hand = lambda x, a, b, w: x @ w + jnp.einsum("bsr,brd->bsd", jnp.einsum("bsd,bdr->bsr", x, a), b)  # noqa: E731
    opt = reaches(f, hand, (x, a, b, w))
    assert opt.report.rules_fired.get("structured.shared_weight"), opt.report


def test_a_weight_broadcast_along_another_axis_is_not_shared():
    # v broadcast along the rows of each batch entry differs per entry: not one weight for all
    rng = np.random.default_rng(7)
    x, v = _rand(rng, 6, 4, 8), _rand(rng, 6, 8)
    f = lambda x, v: jnp.einsum("bsd,bde->bse", x, lax.broadcast_in_dim(v, (6, 8, 8), (0, 2)))  # noqa: E731
    fired = run_rules(f, (x, v), ["structured.shared_weight"]).report.rules_fired
    assert not fired.get("structured.shared_weight"), fired
    np.testing.assert_allclose(jaxrw.optimize(f)(x, v), jax.jit(f)(x, v), rtol=1e-5)


def test_a_weight_with_a_unit_axis_spread_by_the_broadcast_is_not_shared():
    # a review: w of [k, 1] broadcast to [b, k, n] was used as w itself, n times too small summed
    rng = np.random.default_rng(8)
    x, w = _rand(rng, 4, 32, 32), _rand(rng, 32, 1)
    f = lambda x, w: jnp.einsum("bsk,bkn->bsn", x, jnp.broadcast_to(w, (4, 32, 32))).sum(-1)  # noqa: E731
    fired = run_rules(f, (x, w), ["structured.shared_weight"]).report.rules_fired
    assert not fired.get("structured.shared_weight"), fired
    np.testing.assert_allclose(jaxrw.optimize(f)(x, w), jax.jit(f)(x, w), rtol=1e-5)

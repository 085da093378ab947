"""Reductions and slices through products end to end (default roofline model, CPU profile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .harness import optimized, reaches


def _rand(rng, *shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def test_trace_of_a_product_is_an_elementwise_sum():
    rng = np.random.default_rng(0)
    a, b = _rand(rng, 256, 256), _rand(rng, 256, 256)
    opt = reaches(lambda a, b: jnp.trace(a @ b), lambda a, b: jnp.sum(a * b.T), (a, b))
    assert opt.dots == 0


def test_bf16_trace_accumulates_in_float32():
    # DESIGN.md: a rewritten bf16 trace at n=8192 had 9% error without f32 accumulation
    n = 1024
    rng = np.random.default_rng(1)
    a, b = _rand(rng, n, n, dtype=jnp.bfloat16), _rand(rng, n, n, dtype=jnp.bfloat16)
    opt = reaches(lambda a, b: jnp.trace(a @ b), lambda a, b: jnp.sum(a * b.T), (a, b))
    want = float(np.trace(np.asarray(a, np.float64) @ np.asarray(b, np.float64)))
    got = float(opt.fn(a, b)[0])
    orig = float(jax.jit(lambda a, b: jnp.trace(a @ b))(a, b))
    scale = float(np.linalg.norm(np.asarray(a, np.float64)) * np.linalg.norm(np.asarray(b, np.float64)))
    assert abs(got - want) <= max(2 * abs(orig - want), 1e-3 * scale)


def test_sums_rows_and_elements_of_products():
    rng = np.random.default_rng(2)
    a, b = _rand(rng, 256, 256), _rand(rng, 256, 256)
    w = _rand(rng, 256)
    reaches(lambda a, b: (a @ b).sum(0), lambda a, b: a.sum(0) @ b, (a, b))
    reaches(lambda a, b: (a @ b)[3], lambda a, b: a[3] @ b, (a, b))
    reaches(lambda a, b: (a @ b)[:, 7], lambda a, b: a @ b[:, 7], (a, b))
    reaches(lambda a, b: (a @ b)[1, 7], lambda a, b: a[1] @ b[:, 7], (a, b))
    reaches(lambda a, b, w: (w[:, None] * (a @ b)).sum(0), lambda a, b, w: (w @ a) @ b, (a, b, w))


def test_quadratic_form_written_elementwise():
    rng = np.random.default_rng(3)
    a, b = _rand(rng, 256, 256), _rand(rng, 256, 256)
    x, y = _rand(rng, 256), _rand(rng, 256)
    opt = reaches(
        lambda x, a, b, y: jnp.sum(x[:, None] * (a @ b) * y[None, :]),
        lambda x, a, b, y: x @ (a @ (b @ y)),
        (x, a, b, y),
    )
    assert opt.report.stop_reason.value == "saturated"


def test_a_batch_slice_of_a_batched_product():
    rng = np.random.default_rng(4)
    a, b = _rand(rng, 16, 64, 64), _rand(rng, 16, 64, 64)
    opt = optimized(lambda a, b: (a @ b)[2:4], (a, b))
    assert opt.flops <= 1.05 * 2 * 2 * 64**3


def test_jnp_diagonal_of_a_product_is_an_elementwise_sum():
    # jnp.diagonal of a square matrix is a platform-dependent cond in jax 0.12 (a gather, or Σ_0 I∘X
    # for Mosaic): diag(A @ B) was kept as an n³ product plus a gather
    rng = np.random.default_rng(2)
    a, b = _rand(rng, 192, 96), _rand(rng, 96, 192)
    for f in (lambda a, b: jnp.diagonal(a @ b), lambda a, b: jnp.diag(b.T @ a.T)):
        opt = reaches(f, lambda a, b: jnp.sum(a * b.T, axis=1), (a, b))
        assert opt.dots == 0 and opt.report.rules_fired["reduce.platform_diagonal"] > 0
        want = np.einsum("ik,ki->i", np.asarray(a, np.float64), np.asarray(b, np.float64))
        assert np.abs(np.asarray(opt.fn(a, b)[0], np.float64) - want).max() < 1e-4 * np.abs(want).max()


def test_a_diagonal_kept_by_a_rewritten_program_is_read_as_jax_jit_reads_it():
    # the cond's Mosaic branch, Σ_0 I∘X, is NaN in every column where X holds an Inf off the
    # diagonal; the gather run here reads the diagonal alone. A program rewritten elsewhere (the
    # chain) keeps jax.jit's finite diagonal, and a diagonal of a product with an Inf off its
    # diagonal is finite where jax.jit's is
    rng = np.random.default_rng(3)
    x = np.array(_rand(rng, 48, 48))
    x[0, 5] = np.inf
    a, b, v = _rand(rng, 48, 48), _rand(rng, 48, 48), _rand(rng, 48)
    for f, args in (
        (lambda x, a, b, v: jnp.diagonal(x) + a @ b @ v, (jnp.asarray(x), a, b, v)),
        (lambda x, a, b, v: jnp.diagonal(x @ a) + v, (jnp.asarray(x), a, b, v)),
    ):
        opt = optimized(f, args)
        got, want = np.asarray(opt.fn(*args)[0]), np.asarray(jax.jit(f)(*args))
        assert opt.report.rules_fired, opt.report
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        assert np.isfinite(got).sum() >= 47
        np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-4, atol=1e-4)


def test_an_identity_product_written_out_is_not_read_as_a_diagonal_under_default_numerics():
    # Σ_0 I∘X written by the user (no platform cond) is NaN where X holds an Inf off the diagonal:
    # only numerics="fast" may rewrite it (reduce.diag_dot_eye), platform_diagonal not at all
    rng = np.random.default_rng(4)
    a, b = _rand(rng, 32, 32), _rand(rng, 32, 32)
    opt = optimized(lambda a, b: (jnp.eye(32, dtype=a.dtype) * (a @ b)).sum(0), (a, b))
    assert "reduce.platform_diagonal" not in opt.report.rules_fired and opt.dots == 1


def _platform_cond(default):
    """A user's platform_dependent whose TPU branch is the diagonal (Σ_0 I∘X) and whose branch run
    here is `default`: jax runs one branch and does not make them agree."""

    def fn(a, b):
        x = a @ b
        eye = jnp.eye(x.shape[0], dtype=x.dtype)
        return jax.lax.platform_dependent(x, tpu=lambda x: jnp.sum(eye * x, axis=0), default=default)

    return fn


def test_a_platform_cond_is_read_by_the_branch_that_runs_here():
    # reading a platform cond's TPU branch as its value returned the diagonal on CPU where jax.jit
    # returned column sums (a review); an anti-diagonal gather is a gather, not the diagonal
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 6, 5), _rand(rng, 5, 6)
    idx = jnp.arange(6)
    for default in (lambda x: jnp.sum(x, axis=0), lambda x: x[idx, 5 - idx], lambda x: x[idx, idx] * 2):
        f = _platform_cond(default)
        opt = optimized(f, (a, b))
        assert "reduce.platform_diagonal" not in opt.report.rules_fired
        np.testing.assert_allclose(opt.fn(a, b)[0], jax.jit(f)(a, b), rtol=1e-5, atol=1e-5)
    # the diagonal here too, its indices made in the branch: read as one
    diagonal = _platform_cond(lambda x: x[jnp.arange(6), jnp.arange(6)])
    assert optimized(diagonal, (a, b)).report.rules_fired["reduce.platform_diagonal"] == 1


def test_a_diagonal_is_one_equation_to_report_and_explain():
    # the first form encoded the cond's branches as equations of the program: report counted 10 of
    # 8 and explain's mapping from equations to lines failed on every program with a jnp.diagonal
    import jaxrw

    a, b = jnp.ones((4, 5)), jnp.ones((5, 4))
    f = lambda a, b: jnp.diagonal(a @ b)  # noqa: E731
    # the dot, and jnp.diagonal's iota, iota, add, eq, convert, platform_index and cond
    assert jaxrw.optimize(f).report(a, b).n_equations == 8
    text = str(jaxrw.explain(f, a, b))
    assert "mapping failed" not in text and "platform_diagonal" in text


def test_the_gradient_of_a_diagonal_of_a_product_drops_the_forward_product():
    # under jax.grad jnp.diagonal's cond also returns its gather indices (a residual for the
    # backward scatter): the cond, and so A @ B, stayed for them. They depend on no operand: the
    # constant they are stands in for them, and A @ B goes (3 dots -> 2)
    rng = np.random.default_rng(6)
    a, b = _rand(rng, 64, 64), _rand(rng, 64, 64)
    f = jax.grad(lambda a, b: jnp.sum(jnp.diagonal(a @ b) ** 2), argnums=(0, 1))
    opt = optimized(f, (a, b))
    assert opt.dots == 2 and opt.report.rules_fired["reduce.diag_dot"] > 0
    want = f(np.asarray(a, np.float64), np.asarray(b, np.float64))
    for got, ref in zip(opt.fn(a, b), want, strict=True):
        assert np.abs(np.asarray(got, np.float64) - ref).max() < 1e-4 * np.abs(ref).max()


def _batched_diagonals():
    """Batched traces and diagonals of batched products, as jax.vmap and axis arguments write them
    (a full batched product each before: n³ per batch where n² does)."""
    trace, diagonal = jnp.trace, jnp.diagonal
    return {
        "vmap(trace)": lambda a, b: jax.vmap(trace)(a @ b),
        "trace(axis1=1, axis2=2)": lambda a, b: trace(a @ b, axis1=1, axis2=2),
        "einsum('bii->bi')": lambda a, b: jnp.einsum("bii->bi", a @ b),
        "vmap(diagonal)": lambda a, b: jax.vmap(diagonal)(a @ b),
        "diagonal(axis1=-2, axis2=-1)": lambda a, b: diagonal(a @ b, axis1=-2, axis2=-1),
        "vmap(diag) of transposes": lambda a, b: jax.vmap(jnp.diag)(b.mT @ a.mT),
        "vmap(vmap(trace))": lambda a, b: jax.vmap(jax.vmap(trace))(
            a.reshape(2, 3, 48, 24) @ b.reshape(2, 3, 24, 48)
        ),
    }


def test_batched_traces_and_diagonals_of_products_are_elementwise_sums():
    rng = np.random.default_rng(7)
    a, b = _rand(rng, 6, 48, 24), _rand(rng, 6, 24, 48)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    for name, f in _batched_diagonals().items():
        opt = optimized(f, (a, b))
        assert opt.dots == 0, (name, opt.report.rules_fired)
        want = np.asarray(f(a64, b64))
        got = np.asarray(opt.fn(a, b)[0], np.float64)
        assert np.abs(got - want).max() < 1e-4 * np.abs(want).max(), name


def test_a_batched_product_with_the_identity_is_a_diagonal_under_fast_numerics_only():
    rng = np.random.default_rng(8)
    a, b = _rand(rng, 5, 32, 16), _rand(rng, 5, 16, 32)
    f = lambda a, b: ((a @ b) * jnp.eye(32, dtype=a.dtype)).sum(2)  # noqa: E731  eye broadcast [1, n, n]
    assert optimized(f, (a, b)).dots == 1  # Inf·0 off the diagonal is NaN as written
    opt = optimized(f, (a, b), numerics="fast")
    assert opt.dots == 0 and opt.report.rules_fired["reduce.diag_dot_eye"] > 0
    np.testing.assert_allclose(opt.fn(a, b)[0], jax.jit(f)(a, b), rtol=1e-4, atol=1e-4)


def test_the_diagonal_of_a_non_square_product_is_that_of_its_square_block():
    # jnp.diagonal of a 64x100 product gathers from the full product: it is the diagonal of its
    # leading 64x64 block, a product of slices (reduce.slice_dot), then an elementwise sum
    rng = np.random.default_rng(10)
    for a, b, f in (
        (_rand(rng, 64, 32), _rand(rng, 32, 100), jnp.diagonal),
        (_rand(rng, 3, 100, 32), _rand(rng, 3, 32, 64), jax.vmap(jnp.diagonal)),
    ):
        opt = optimized(lambda a, b: f(a @ b), (a, b))  # noqa: B023
        assert opt.dots == 0 and opt.report.rules_fired["reduce.platform_diagonal"] == 1
        want = f(np.asarray(a, np.float64) @ np.asarray(b, np.float64))
        np.testing.assert_allclose(opt.fn(a, b)[0], want, rtol=1e-4, atol=1e-4)


def test_a_gather_that_is_not_the_diagonal_stays_a_gather():
    # the anti-diagonal, a shifted diagonal, a column and a diagonal of rows shifted by one are
    # gathers too (a diagonal across the batch axis is one: of the transposed product's block)
    rng = np.random.default_rng(9)
    a, b = _rand(rng, 4, 12, 6), _rand(rng, 4, 6, 12)
    idx = jnp.arange(12)
    for f in (
        lambda a, b: (a @ b)[:, idx, 11 - idx],
        lambda a, b: jnp.diagonal(a @ b, offset=1, axis1=1, axis2=2),
        lambda a, b: (a @ b)[:, idx, jnp.zeros_like(idx)],
        lambda a, b: (a @ b)[:, idx[:11] + 1, idx[:11]],
    ):
        opt = optimized(f, (a, b))
        assert "reduce.platform_diagonal" not in opt.report.rules_fired
        np.testing.assert_allclose(opt.fn(a, b)[0], jax.jit(f)(a, b), rtol=1e-5, atol=1e-5)


def test_a_one_by_one_identity_broadcast_over_a_batched_product_is_not_its_diagonal():
    # where(eye(1), A @ B, 0) keeps every entry (the 1x1 mask broadcasts): batched, the mask was
    # matched without its size and the sums read as traces (a review: wrong values, and a
    # fallback for a non-square product)
    rng = np.random.default_rng(11)
    a, b, wide = _rand(rng, 4, 24, 20), _rand(rng, 4, 20, 24), _rand(rng, 4, 20, 30)
    one = jnp.eye(1, dtype=bool)
    for f, args, kw in (
        (lambda x, y: jnp.where(one, x @ y, 0).sum((1, 2)), (a, b), {}),
        (jax.vmap(lambda x, y: jnp.where(one, x @ y, 0).sum()), (a, b), {}),
        (lambda x, y: jnp.where(one, x @ y, 0).sum(1), (a, wide), {}),
        (lambda x, y: ((x @ y) * jnp.eye(1)).sum(2), (a, b), {"numerics": "fast"}),
    ):
        opt = optimized(f, args, **kw)
        assert not {"reduce.diag_dot", "reduce.diag_dot_eye"} & set(opt.report.rules_fired)
        np.testing.assert_allclose(opt.fn(*args)[0], jax.jit(f)(*args), rtol=1e-4, atol=1e-4)


def test_a_sum_over_transposed_axes_drops_the_transpose():
    # vmap(trace(AᵀA)) became Σ (Aᵀ)², its transpose copied before the sum (3.4-3.9x of the
    # rewritten program's time on this CPU, a helper's per-example Gram traces)
    rng = np.random.default_rng(12)
    a = _rand(rng, 6, 40, 24)
    f = jax.vmap(lambda x: jnp.trace(x.T @ x))
    opt = optimized(f, (a,))
    assert opt.dots == 0 and opt.report.rules_fired["reduce.sum_transpose"] > 0
    assert "transpose" not in str(jax.make_jaxpr(opt.fn)(a))
    np.testing.assert_allclose(opt.fn(a)[0], np.sum(np.asarray(a, np.float64) ** 2, axis=(1, 2)), rtol=1e-4)

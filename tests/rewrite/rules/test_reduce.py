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

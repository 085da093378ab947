"""verify=True on outputs with cancellation: the scale of their terms (jaxrw/error_scale.py).

A new user's try (forty-first session): the gradient of a least-squares loss at its solution
(`AᵀA x - Aᵀb`, reassociated by the default rules), a bf16 trace and a BFGS objective near zero
raised VerificationError on correct results, since the check was relative to the output alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxrw
from jaxrw import api
from jaxrw.error_scale import scales_function
from jaxrw.errors import VerificationError
from jaxrw.tolerance import check_outputs


def _residual(A, b, x):
    return A.T @ A @ x - A.T @ b  # the gradient of 0.5 |Ax - b|², near 0 at the least-squares x


def _least_squares(seed: int, m: int, n: int, dtype=jnp.float32):
    ka, kb = jax.random.split(jax.random.key(seed))
    A = jax.random.normal(ka, (m, n), dtype)
    b = jax.random.normal(kb, (m,), dtype)
    return A, b, jnp.linalg.lstsq(A, b)[0]


def test_verify_passes_a_residual_at_the_solution():
    A, b, x = _least_squares(0, 256, 32)
    want, got = jax.jit(_residual)(A, b, x), jaxrw.optimize(_residual)(A, b, x)
    rel = np.linalg.norm(np.asarray(got) - np.asarray(want)) / np.linalg.norm(want)
    assert rel > 5e-3  # the outputs alone differ past float32's tolerance: the case itself
    exact = np.asarray(A, np.float64).T @ (np.asarray(A, np.float64) @ np.asarray(x, np.float64))
    exact -= np.asarray(A, np.float64).T @ np.asarray(b, np.float64)
    assert np.linalg.norm(got - exact) <= 2 * np.linalg.norm(want - exact)  # as close as jax.jit's
    out = jaxrw.optimize(_residual, verify=True, strict=True)(A, b, x)
    np.testing.assert_array_equal(out, got)


def test_verify_passes_a_float64_residual():
    with jax.enable_x64(True):
        A, b, x = _least_squares(1, 128, 16, jnp.float64)
        jaxrw.optimize(_residual, verify=True, strict=True)(A, b, x)


def test_verify_still_catches_a_wrong_program_on_a_cancelling_output(monkeypatch):
    real = api.rewrite_jaxpr

    def drops_a_term(*a, **k):  # a wrong rule: the residual without its second term's last rows
        res = real(*a, **{**k, "force": True})
        fn = res.fn
        res.fn = lambda *xs: [y.at[-4:].set(0.0) for y in fn(*xs)]
        return res

    monkeypatch.setattr(api, "rewrite_jaxpr", drops_a_term)
    A, b, x = _least_squares(2, 256, 32)
    with pytest.raises(VerificationError, match="relative to the scale of its terms"):
        jaxrw.optimize(_residual, verify=True)(A, b + 1.0, x)


def test_check_outputs_takes_scales_only_past_the_plain_check():
    calls = []

    def scales():
        calls.append(1)
        return [jnp.full(2, 10.0)]

    check_outputs(jnp.array([1.0, 2.0]), jnp.array([1.0, 2.0]), "f", scales=scales)
    assert not calls  # within tolerance already
    check_outputs(jnp.array([1e-3, 0.0]), jnp.array([0.0, 1e-3]), "f", scales=scales)  # 1e-4 of 10
    assert calls == [1]
    with pytest.raises(VerificationError, match=r"relative error 1\.41 > 0\.005 \(0\.1 relative"):
        check_outputs(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]), "f", scales=scales)
    nan = jnp.array([1.0, jnp.nan])  # a NaN moved is not a rounding: no scale lets it through
    with pytest.raises(VerificationError, match="relative error inf"):
        check_outputs(jnp.array([1.0, 2.0]), nan, "f", "default", scales=scales)


def test_scales_of_sums_products_and_dots():
    a, b = jnp.array([3.0, -1.0, 2.0]), jnp.array([3.0, 1.0, -2.0])
    (s,) = scales_function(lambda a, b: a - b, [a, b])(a, b)
    np.testing.assert_allclose(s, np.sqrt(a**2 + b**2 + (a - b) ** 2), rtol=1e-6)
    (s,) = scales_function(lambda a, b: a * b, [a, b])(a, b)
    np.testing.assert_allclose(s, np.sqrt(3) * np.abs(a * b), rtol=1e-6)
    A, B = jax.random.normal(jax.random.key(3), (2, 5, 4))
    (s,) = scales_function(lambda A, B: A @ B.T, [A, B])(A, B)
    terms = np.asarray(A, np.float64) ** 2 @ np.asarray(B, np.float64).T ** 2
    np.testing.assert_allclose(s, np.sqrt(2 * terms + np.asarray(A @ B.T, np.float64) ** 2), rtol=1e-5)
    (s,) = scales_function(jnp.tanh, [a])(a)  # elementwise: the derivative times the scale
    np.testing.assert_allclose(s, np.hypot((1 - np.tanh(a) ** 2) * np.abs(a), np.tanh(np.abs(a))), rtol=1e-5)
    (s,) = scales_function(lambda i: i * 2, [jnp.arange(3)])(jnp.arange(3))
    np.testing.assert_array_equal(s, 0.0)  # integers carry no rounding


def _step(A, c):
    return jnp.tanh(A @ c) - 0.5 * c


@pytest.mark.parametrize("loop", ["scan", "fori", "while", "cond"])
def test_loops_and_branches_scale_as_written_out(loop):
    A = jax.random.normal(jax.random.key(4), (8, 8)) / 3
    c = jax.random.normal(jax.random.key(5), (8,))
    looped = {
        "scan": lambda A, c: lax.scan(lambda u, _: (_step(A, u), None), c, None, length=3)[0],
        "fori": lambda A, c: lax.fori_loop(0, 3, lambda i, u: _step(A, u), c),
        "while": lambda A, c: lax.while_loop(
            lambda t: t[0] < 3, lambda t: (t[0] + 1, _step(A, t[1])), (0, c)
        )[1],
        "cond": lambda A, c: lax.cond(c[0] > -10, lambda u: _step(A, _step(A, _step(A, u))), lambda u: u, c),
    }[loop]
    written_out = lambda A, c: _step(A, _step(A, _step(A, c)))  # noqa: E731
    (got,) = scales_function(looped, [A, c])(A, c)
    (want,) = scales_function(written_out, [A, c])(A, c)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_calls_out_skip_prints_and_refuse_results(capsys):
    x = jnp.arange(4.0)

    def prints(x):
        jax.debug.print("x0 {}", x[0])
        return x * 2

    (s,) = scales_function(prints, [x])(x)
    assert capsys.readouterr().out == ""  # the scales do not print again
    np.testing.assert_allclose(s, np.sqrt(3) * 2 * np.asarray(x), rtol=1e-6)  # x, 2 and x·2 rounded

    def calls_back(x):
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return jax.experimental.io_callback(lambda y: np.asarray(y) * 2, shape, x)

    assert scales_function(calls_back, [x]) is None  # it would call out again


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(2, 24),
    k=st.integers(1, 24),
    seed=st.integers(0, 2**16),
    near=st.floats(1e-7, 1e-2),
)
def test_a_difference_of_near_terms_scales_with_the_terms(m, k, seed, near):
    ka, kb, kx = jax.random.split(jax.random.key(seed), 3)
    A, B = jax.random.normal(ka, (m, k)), jax.random.normal(kb, (k, m))
    x = jax.random.normal(kx, (m,))
    f = lambda A, B, x: A @ (B @ x) - (A @ B) @ (x * (1 + near))  # noqa: E731
    (s,) = scales_function(f, [A, B, x])(A, B, x)
    terms = np.abs(np.asarray(A, np.float64) @ np.asarray(B, np.float64) @ np.asarray(x, np.float64))
    assert np.all(s >= 0.5 * terms)  # at least of the order of the terms, however small the result
    assert np.all(np.isfinite(s))

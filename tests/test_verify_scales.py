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


def test_verify_passes_a_bfloat16_trace_summed_more_accurately():
    # trace(A@B) -> Σ A∘Bᵀ sums in float32: 0.09% from a float64 reference where jax.jit's bf16
    # product is 8.8% off, and verify raised on the more accurate result (bfloat16's numpy kind
    # is "V": the scales were first skipped for it)
    ka, kb = jax.random.split(jax.random.key(0))
    A, B = ((jax.random.normal(k, (128, 128)) / 11).astype(jnp.bfloat16) for k in (ka, kb))
    jaxrw.optimize(lambda A, B: jnp.trace(A @ B), verify=True, strict=True)(A, B)


def test_verify_still_catches_a_wrong_program_on_a_cancelling_output(monkeypatch):
    real = api.rewrite_jaxpr

    def drops_a_term(*a, **k):  # a wrong rule: the residual without its second term's last rows
        res = real(*a, **{**k, "force": True})
        fn = res.fn
        res.fn = lambda *xs: [y.at[-4:].set(0.0) for y in fn(*xs)]
        return res

    monkeypatch.setattr(api, "rewrite_jaxpr", drops_a_term)
    A, b, x = _least_squares(2, 256, 32)
    with pytest.raises(VerificationError, match="of the rounding its terms allow"):
        jaxrw.optimize(_residual, verify=True)(A, b + 1.0, x)


def test_check_outputs_takes_scales_only_past_the_plain_check():
    calls = []

    def scales():
        calls.append(1)
        return [jnp.full(2, 1e-4), jnp.full(2, 1e-7)]  # absolute: one standard deviation of the error

    same = [jnp.array([1.0, 2.0])] * 2
    check_outputs(same, same, "f", scales=scales)
    assert not calls  # within tolerance already
    near = [jnp.array([1e-3, 0.0]), jnp.array([1.0, 2.0])]
    check_outputs(near, [jnp.array([0.0, 1e-3]), near[1]], "f", scales=scales)  # within 32 x 1e-4
    assert calls == [1]
    with pytest.raises(VerificationError, match=r"relative error 1\.41 > 0\.005 \(1\.56 of the rounding"):
        check_outputs([jnp.array([1.0, 0.0])] * 2, [jnp.array([0.0, 1.0])] * 2, "f", scales=scales)
    # a NaN moved is not a rounding, in this output or a later one once scales were read
    nan = [jnp.array([1e-3, 0.0]), jnp.array([jnp.nan, jnp.nan])]
    with pytest.raises(VerificationError, match="output 1 differs from jax.jit: relative error inf"):
        check_outputs(nan, [jnp.array([0.0, 1e-3]), jnp.array([1.0, 2.0])], "f", "strict", scales=scales)


def test_one_cancelling_entry_does_not_excuse_the_others():
    # compared norm-wise, the one large scale of a - b let a wrong c through (a review)
    def scales():
        return [jnp.array([1e-3, 1e-7, 2e-7])]

    want = jnp.array([1e-3, 1.0, 2.0])
    check_outputs(jnp.array([2e-3, 1.0, 2.0]), want, "f", scales=scales)
    with pytest.raises(VerificationError, match="of the rounding its terms allow"):
        check_outputs(jnp.array([1e-3, 11.0, 12.0]), want, "f", scales=scales)


def _scale(f, *xs):
    return np.asarray(scales_function(f, list(xs))(*xs)[0], np.float64)


def test_exact_inputs_and_moves_carry_no_error():
    x = jax.random.normal(jax.random.key(3), (4, 5))
    np.testing.assert_array_equal(_scale(lambda x: x.T[::-1, 1:], x), 0.0)
    np.testing.assert_array_equal(_scale(lambda i: i * 2, jnp.arange(3)), 0.0)  # integers
    # a rounding the size of its result, and no more: sin of large exact inputs is not ill-
    # conditioned (it was allowed |cos x|·|x|, so zeros passed for sin(3141.0): a review)
    big = jnp.array([1000.0, 1234.5, 2000.25, 3141.0])
    eps = float(jnp.finfo(jnp.float32).eps)
    ratio = _scale(jnp.sin, big) / (eps * np.abs(np.sin(np.asarray(big, np.float64))))
    assert np.all((ratio > 0.2) & (ratio < 5)), ratio


def test_a_rounded_term_cancelled_leaves_its_error():
    x, c = jnp.array([1.0, -2.0, 3.0]), jnp.array([1e4, 1e4, 1e4])
    s = _scale(lambda x, c: (x + c) - c, x, c)  # x + c rounds at 1e4: eps·1e4 ≈ 1.2e-3
    assert np.all((s > 1e-4) & (s < 1e-2)), s


def test_errors_damp_in_a_converging_iteration():
    # combined in quadrature, correlated errors grew 16x per 10 steps, so any answer passed (a review)
    A, b = jnp.array([[3.0, 1.0], [1.0, 2.0]]), jnp.array([1.0, 1.0])

    def solve(A, b, x0):
        return lax.fori_loop(0, 200, lambda i, x: x - 0.2 * (A @ x - b), x0)

    x0 = jnp.zeros(2)
    s, x = _scale(solve, A, b, x0), np.asarray(solve(A, b, x0))
    assert np.all(s < 10 * np.abs(x)), (s, x)


def test_non_finite_values_and_literals_carry_no_error():
    z = jax.random.normal(jax.random.key(4), (8,))
    s = _scale(lambda z: jax.nn.softmax(z) - 0.125, z)  # a max with a -inf literal inside
    assert np.all(np.isfinite(s)) and np.all(s > 0)
    s = _scale(lambda z: jnp.where(z > 0, z, -jnp.inf) * 2, z)
    assert np.all(np.isfinite(s))


def test_large_and_tiny_values_do_not_overflow_their_scales():
    for mag in (1e30, 1e-30):
        A = jax.random.normal(jax.random.key(5), (4, 4)) * mag
        s = _scale(lambda A: A @ jnp.ones(4) - A.sum(1), A)  # squared, the terms left float32's range
        assert np.all(np.isfinite(s)) and np.all(s > 0), (mag, s)


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
    got, want = _scale(looped, A, c), _scale(written_out, A, c)  # other draws: alike, not equal
    ratio = np.linalg.norm(got) / np.linalg.norm(want)
    assert 0.5 < ratio < 2, ratio


def test_calls_out_skip_prints_and_refuse_results(capsys):
    x = jnp.arange(4.0)

    def prints(x):
        jax.debug.print("x0 {}", x[0])
        return x * 2

    (s,) = scales_function(prints, [x])(x)
    assert capsys.readouterr().out == ""  # the scales do not print again
    eps = float(jnp.finfo(jnp.float32).eps)
    ratio = np.asarray(s)[1:] / (eps * 2 * np.asarray(x)[1:])  # one rounding of x·2 (x, 2 exact)
    assert np.all((ratio > 0.2) & (ratio < 5)), ratio

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
    eps = float(jnp.finfo(jnp.float32).eps)
    assert np.all(s >= 0.1 * eps * terms)  # of the order of the terms, however small the result
    assert np.all(np.isfinite(s))


def test_an_integer_operand_of_a_dot_is_exact():
    # int8 x float32 (preferred float32): the accumulation's epsilon was asked of int8, which raised,
    # so verify fell back to the plain check
    a, b = jnp.arange(12, dtype=jnp.int8).reshape(3, 4), jax.random.normal(jax.random.key(6), (4, 2))

    def f(a, b):
        return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    s = _scale(f, a, b)
    assert np.all(np.isfinite(s)) and np.all(s > 0)

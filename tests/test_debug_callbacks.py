"""Programs with jax.debug calls (rewrite/effects.py): the rest of the program is rewritten, each
call is made once per call of the function (per step, in a loop's body), with the values jax.jit's
program gives it (ordered ones in their order); a cond or loop with no output (one that only
prints) is made whole after the rest; calls in checkpoint regions and ordered calls whose order a
rewrite could change keep the program as written (a fallback, or JaxrwError under strict)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrw
from jaxrw.errors import UnsupportedProgramError
from jaxrw.schedule import ScheduleUnavailableError
from tests.debug_calls import _calls, _chain, _loop, _record, _under_transforms


def _same_logs(want, got, rtol):
    """The same entries, each kind (tuple or array) in its order: unordered calls of two
    callbacks may come in either order (jax promises none)."""
    assert len(got) == len(want)
    by_kind = [
        [x for x in log if isinstance(x, tuple)] + [x for x in log if not isinstance(x, tuple)]
        for log in (want, got)
    ]
    for w, g in zip(*by_kind, strict=True):
        if isinstance(w, tuple):
            np.testing.assert_allclose(g, w, rtol=rtol)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())


@pytest.mark.parametrize("seed", range(3))
def test_a_program_with_debug_calls_is_rewritten_and_calls_them_once(seed):
    rng = np.random.default_rng(seed)
    n, m, k = (int(x) for x in rng.integers(24, 64, 3))
    A = jnp.asarray(rng.standard_normal((n, m)), jnp.float32)
    B = jnp.asarray(rng.standard_normal((m, m)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((m, k % 3 + 1)), jnp.float32)
    (want, want_log, _), (got, got_log, f) = _calls(_chain, A, B, v)
    A64, B64, v64 = (np.asarray(x, np.float64) for x in (A, B, v))
    exact = A64 @ B64 @ B64 @ v64  # the float64 reference
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max())
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(exact).max())
    _same_logs(want_log, got_log, 1e-4)
    opt = jaxrw.optimize(f)
    report = opt.report(A, B, v)
    assert report.rewritten and not report.fallback
    assert report.n_outputs == 1


def test_each_call_makes_the_calls_again():
    log, f = _record(_chain)
    opt = jaxrw.optimize(f)
    A, B, v = jnp.ones((8, 8)), jnp.eye(8), jnp.ones((8, 2))
    for _ in range(3):
        opt(A, B, v)
    jax.effects_barrier()
    assert [x for x in log if isinstance(x, tuple)] == [(64.0, 3)] * 3
    assert len(log) == 6


def test_a_callback_of_an_argument_and_a_print_of_a_literal():
    def build(log):
        def f(x, W):
            jax.debug.callback(lambda a, b: log.append((np.asarray(a).sum(), np.asarray(b).sum())), x, x)
            jax.debug.print("{}", 2.5)  # a literal operand, printed (not recorded)
            return (x @ W) @ W.T

        return f

    x, W = jnp.arange(12.0).reshape(3, 4), jnp.ones((4, 6))
    (want, want_log, _), (got, got_log, _) = _calls(build, x, W)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    _same_logs(want_log, got_log, 0)


def test_hoisting_is_left_off_with_a_warning_and_results_stay_right():
    log, f = _record(_chain)
    A, B, v = jnp.ones((8, 8)), 0.5 * jnp.eye(8), jnp.ones((8, 2))
    opt = jaxrw.optimize(f, hoist_argnums=(0, 1))
    with pytest.warns(UserWarning, match="not hoisted: the function makes jax.debug calls"):
        got = opt(A, B, v)
    np.testing.assert_allclose(got, A @ B @ B @ v, rtol=1e-6)
    jax.effects_barrier()
    assert len(log) == 2


def test_gradients_and_vmap_call_as_jax_jit_does():
    def build(log):
        def f(A, v):
            jax.debug.callback(lambda s: log.append(float(np.asarray(s).sum())), (A @ A).sum())
            return jnp.sum((A @ A @ v) ** 2)

        return f

    A = jnp.asarray(np.random.default_rng(5).standard_normal((16, 16)), jnp.float32) / 4
    v = jnp.ones((16, 2))
    for want, want_log, got, got_log in _under_transforms(build, A, v):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_log, want_log, rtol=1e-4)


def test_calls_in_nested_jits_are_made_as_jax_jit_makes_them():
    def build(log):
        @jax.jit
        def inner(x):
            jax.debug.callback(lambda d: log.append(("max", float(d))), x.max())
            return 2 * x

        @jax.jit
        def outer(x):
            jax.debug.callback(lambda d: log.append(("sum", float(d))), x.sum())
            return inner(x) @ x

        return lambda A, v: outer(A) @ A @ v

    A = jnp.asarray(np.random.default_rng(7).standard_normal((32, 32)), jnp.float32)
    v = jnp.ones((32, 3))
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # unordered calls: jax promises no order among them (nor did XLA keep one here)
    got_log, want_log = sorted(got_log), sorted(want_log)
    assert [k for k, _ in got_log] == [k for k, _ in want_log] == ["max", "sum"]
    np.testing.assert_allclose([x for _, x in got_log], [x for _, x in want_log], rtol=1e-5)
    assert jaxrw.optimize(f, strict=True).report(A, v).rewritten


def test_ordered_calls_keep_their_order_across_calls():
    def build(log):
        def f(A, v):
            for k in range(5):
                jax.debug.callback(lambda s, k=k: log.append((k, float(s))), (k * A).sum(), ordered=True)
            return A @ A @ v

        return f

    A = jnp.asarray(np.random.default_rng(3).standard_normal((32, 32)), jnp.float32)
    v = jnp.ones((32, 2))
    log, f = _record(build)
    opt = jaxrw.optimize(f, strict=True)
    for _ in range(3):
        opt(A, v)
    jax.effects_barrier()
    assert [k for k, _ in log] == list(range(5)) * 3
    np.testing.assert_allclose([s for _, s in log[:5]], [k * float(A.sum()) for k in range(5)], rtol=1e-5)
    assert opt.report(A, v).rewritten


def test_verify_makes_each_call_once():
    # its reference run was jax.jit's, which made the calls a second time (a review's repro)
    log, f = _record(_chain)
    A, B, v = jnp.eye(8) * 0.5, jnp.eye(8), jnp.ones((8, 2))
    opt = jaxrw.optimize(f, verify=True)
    for _ in range(3):
        np.testing.assert_allclose(opt(A, B, v), A @ B @ B @ v, rtol=1e-6)
    jax.effects_barrier()
    assert len(log) == 6  # two callbacks, three calls


def _asserting(calls, fails):
    def check(x):  # a user's assertion made from the program
        calls.append(float(x))
        if fails(calls):
            raise ValueError("negative sum")

    def f(A, v):
        jax.debug.callback(check, v.sum())
        return A @ A @ v

    return f


@pytest.mark.parametrize("opts", [{}, {"verify": True}], ids=["plain", "verify"])
def test_a_callback_that_raises_raises_as_under_jax_jit_once(opts):
    # jaxrw ran jax.jit again to place the fault: every call made twice (a review's repro)
    calls: list = []
    A, v = jnp.ones((16, 16)), -jnp.ones((16, 2))
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, strict=True, **opts)):
        calls.clear()
        g = wrap(_asserting(calls, lambda c: c[-1] < 0))
        for _ in range(2):
            with pytest.raises(Exception, match="negative sum") as got:
                jax.block_until_ready(g(A, v))
            assert not isinstance(got.value, jaxrw.JaxrwError)
        jax.effects_barrier()
        assert len(calls) == 2


def test_a_callback_that_raises_once_leaves_the_rewrite_in_place():
    calls: list = []
    A, v = jnp.ones((64, 64)) / 64, jnp.ones((64, 2))  # large enough for the rewrite to pay
    opt = jaxrw.optimize(_asserting(calls, lambda c: len(c) == 1), strict=True)
    with pytest.raises(Exception, match="negative sum"):
        jax.block_until_ready(opt(A, v))
    np.testing.assert_allclose(opt(A, v), A @ A @ v, rtol=1e-6)
    jax.effects_barrier()
    assert len(calls) == 2 and opt.report(A, v).rewritten and not opt.report(A, v).fallback


def test_verify_donates_what_jax_jit_donates():
    # the reference without the calls took no donation options (a review's repro)
    def f(A, v):
        jax.debug.print("sum {}", v.sum())
        return A @ A @ v + 1.0

    for wrap in (
        lambda h: jax.jit(h, donate_argnums=1),
        lambda h: jaxrw.optimize(h, donate_argnums=1, verify=True),
    ):
        A, v = jnp.ones((16, 16)), jnp.ones((16, 16))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            jax.block_until_ready(wrap(f)(A, v))
        assert v.is_deleted()


def test_explain_numbers_equations_as_the_program_has_them():
    def f(A, B, v):
        jax.debug.print("bv {}", (B @ v).sum())
        return 2.0 * (A @ B @ (B @ v))

    rng = np.random.default_rng(0)
    A, B = (jnp.asarray(rng.standard_normal((64, 64)), jnp.float32) for _ in range(2))
    ex = jaxrw.explain(f, A, B, jnp.ones((64, 2)))
    rows = [(e.index, e.primitive, e.status) for e in ex.equations]
    traced = jax.make_jaxpr(f)(A, B, jnp.ones((64, 2))).jaxpr
    assert [p for _, p, _ in rows] == [e.primitive.name for e in traced.eqns]
    assert rows[2] == (2, "debug_print", "kept") and rows[-1][1:] == ("mul", "rewritten")
    assert [i for i, _, _ in rows] == list(range(len(rows))) and ex.report["n_equations"] == len(rows)


def _in_a_checkpoint(A, v):
    @jax.checkpoint  # a region of its own (gradients rematerialize it): not taken apart
    def g(x):
        jax.debug.print("{}", x.sum())
        return x @ x

    return g(A) @ v


def _ordered_cond_before_an_ordered_loop(A, v):
    # the cond is made whole after the rewritten program: after the loop's, which jax makes first
    jax.lax.cond(v.sum() > 0, lambda x: jax.debug.print("{}", x.sum(), ordered=True), lambda x: None, v)
    return _loop("scan", ordered=True)(A, v)


def _ordered_before_an_ordered_loop(A, v):
    # the call is made after the rewritten program: after the loop's, which jax makes first
    jax.debug.print("first {}", v.sum(), ordered=True)
    return _loop("scan", ordered=True)(A, v)


def _two_ordered_loops(A, v):
    # decode binds independent equations in an order of its own: the two loops' could swap
    return _loop("scan", ordered=True)(A, v) + _loop("while", ordered=True)(A, v)


def _io_callback_in_a_scan(A, v):
    def body(c, _):
        c = io_callback(lambda x: np.asarray(x), jax.ShapeDtypeStruct(c.shape, c.dtype), c)
        return A @ A @ c, None

    return jax.lax.scan(body, v, None, length=2)[0]


@pytest.mark.parametrize(
    "fn",
    [
        _in_a_checkpoint,
        _ordered_before_an_ordered_loop,
        _ordered_cond_before_an_ordered_loop,
        _two_ordered_loops,
        _io_callback_in_a_scan,
    ],
)
def test_other_effects_keep_the_program_as_written(fn):
    A, v = jnp.eye(4), jnp.ones((4, 1))
    with pytest.raises(UnsupportedProgramError, match="side effects are not rewritten"):
        jaxrw.optimize(fn, strict=True)(A, v)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = jaxrw.optimize(fn)(A, v)
    assert any("falling back to jax.jit" in str(w.message) for w in seen)
    np.testing.assert_allclose(got, jax.jit(fn)(A, v))


# --- calls in the bodies of scan, while and cond (at any depth) ---------------------------------


@pytest.mark.parametrize("where", ["top", "scan"])
def test_a_call_sees_jax_jits_non_finite_values(where):
    # a call is user code the e-graph does not model: what it reads stays out of inexact rules
    # (x@W + x@V factored gave the call -inf where jax.jit gives nan; a review's repro)
    x = jnp.zeros((4, 4)).at[0, 0].set(jnp.inf)
    W, V = jnp.eye(4), -2 * jnp.eye(4)

    def build(log):
        def seen(s):
            log.append(float(s[0, 0]))

        def f(x, W, V):
            if where == "top":
                jax.debug.callback(seen, x @ W + x @ V)
                return x + 1.0

            def step(c, _):
                jax.debug.callback(seen, c @ W + c @ V)
                return c + 1.0, None

            return jax.lax.scan(step, x, None, length=1)[0]

        return f

    (_, want_log, _), (_, got_log, _) = _calls(build, x, W, V, limits=jaxrw.Limits(min_gain=0))
    assert np.isnan(want_log).all() and np.isnan(got_log).all() and len(got_log) == len(want_log) == 1


def test_streams_asked_for_off_cuda_is_refused_with_calls_too():
    # the calls made auto's "xla" replace any schedule asked for, so no error said streams cannot run
    def f(A, v):
        jax.debug.callback(lambda s: None, v.sum())
        return A @ A @ v

    with pytest.raises(ScheduleUnavailableError, match="needs a CUDA device|needs jax.experimental.thunky"):
        jaxrw.optimize(f, schedule="streams", strict=True)(jnp.eye(8), jnp.ones((8, 2)))

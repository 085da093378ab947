"""Programs with jax.debug calls (rewrite/effects.py): the rest of the program is rewritten, each
call is made once per call of the function (per step, in a loop's body), with the values jax.jit's
program gives it (ordered ones in their order); calls in checkpoint regions, conds without
outputs, and ordered calls whose order a rewrite could change keep the program as written (a
fallback, or JaxrwError under strict)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrw
from jaxrw.errors import UnsupportedProgramError
from jaxrw.rewrite.profiles import default_profile
from jaxrw.rewrite.run import rewrite_jaxpr


def _record(fn_of_log):
    """(log, fn): `fn` built by `fn_of_log(log)` appends what its jax.debug.callback calls see."""
    log: list = []
    return log, fn_of_log(log)


def _chain(log):
    def f(A, B, v):
        jax.debug.callback(lambda s, c: log.append((float(s), int(c))), A.sum(), 3)
        jax.debug.callback(lambda x: log.append(np.asarray(x)), B @ v)
        return A @ B @ (B @ v)  # best as A @ (B @ (B @ v)), B @ v shared with the callback

    return f


def _calls(build, *args, **opts):
    """What jax.jit's and optimize's programs give and what their callbacks saw, in this order."""
    out = []
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, **opts)):
        log, f = _record(build)
        got = wrap(f)(*args)
        jax.effects_barrier()
        out.append((got, log, f))
    return out


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
    for transform in (jax.grad, lambda f: jax.vmap(f, in_axes=(0, None))):
        args = (A, v) if transform is jax.grad else (jnp.stack([A, 2 * A]), v)
        outs = []
        for wrap in (jax.jit, jaxrw.optimize):
            log, f = _record(build)
            got = transform(wrap(f))(*args)
            jax.effects_barrier()
            outs.append((got, log))
        (want, want_log), (got, got_log) = outs
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


def _in_a_cond_without_outputs(A, v):
    # jax forwards the operand: the cond has no output to keep it by, so extraction would drop it
    jax.lax.cond(v.sum() > 0, lambda x: jax.debug.print("{}", x.sum()), lambda x: None, v)
    return A @ A @ v


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
        _in_a_cond_without_outputs,
        _ordered_before_an_ordered_loop,
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


def _tap(log, x, key=None):
    """`x`, after a call back that records its sum in `log` (with `key`, if given)."""
    jax.debug.callback(lambda s: log.append(float(s) if key is None else (key, float(s))), x.sum())
    return x


def _loop(kind, log=None, ordered=False, steps=3):
    """(A, v) -> A @ A @ ... v by `kind` (scan, while, fori), each step calling back with the
    step's carry sum (recorded in `log`, or printed)."""

    def step(A, c):
        if log is None:
            jax.debug.print("c {}", c.sum(), ordered=ordered)
        else:
            jax.debug.callback(lambda s: log.append(float(s)), c.sum(), ordered=ordered)
        return A @ A @ c  # rewritten as A @ (A @ c)

    def f(A, v):
        if kind == "scan":
            return jax.lax.scan(lambda c, _: (step(A, c), None), v, None, length=steps)[0]
        if kind == "fori":
            return jax.lax.fori_loop(0, steps, lambda i, c: step(A, c), v)
        cond = lambda ic: ic[0] < steps  # noqa: E731
        return jax.lax.while_loop(cond, lambda ic: (ic[0] + 1, step(A, ic[1])), (0, v))[1]

    return f


def _matrices(n=48, k=2, seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32)
    return A, jnp.asarray(rng.standard_normal((n, k)), jnp.float32)


def _same_calls(want, got, rtol=1e-4):
    assert len(got) == len(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("kind", ["scan", "while", "fori"])
def test_calls_in_a_loop_body_are_made_each_step_with_jax_jits_values(kind):
    A, v = _matrices()
    # verify=True: its reference is the program without its calls, in loop bodies too
    (want, want_log, _), (got, got_log, f) = _calls(
        lambda log: _loop(kind, log), A, v, strict=True, verify=True
    )
    A64, c = np.asarray(A, np.float64), np.asarray(v, np.float64)
    sums = []
    for _ in range(3):
        sums.append(c.sum())
        c = A64 @ A64 @ c
    np.testing.assert_allclose(got, c, rtol=1e-3, atol=1e-3 * np.abs(c).max())  # the float64 reference
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(c).max())
    _same_calls(want_log, got_log)
    np.testing.assert_allclose(got_log, sums, rtol=1e-3, atol=1e-3)
    report = jaxrw.optimize(f, strict=True).report(A, v)
    assert report.bodies and report.bodies[0].rewritten and not report.fallback
    assert report.n_outputs == 1  # the loop's hidden output is not the function's


def test_calls_in_nested_loops_and_conds_are_made_as_jax_jit_makes_them():
    def build(log):
        def f(A, v):
            def inner(c, _):
                return A @ A @ _tap(log, c, "inner"), None

            def outer(c, _):
                c = jax.lax.scan(inner, c, None, length=2)[0]
                return jax.lax.cond(c.sum() > 0, lambda x: 2 * _tap(log, x, "cond"), lambda x: -x, c), None

            return jax.lax.scan(outer, v, None, length=3)[0]

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True, verify=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert [k for k, _ in got_log] == [k for k, _ in want_log]  # one body's calls: in its order
    _same_calls([x for _, x in want_log], [x for _, x in got_log])
    assert jaxrw.optimize(f, strict=True).report(A, v).bodies[0].rewritten


def test_a_loop_whose_results_are_unused_and_its_twin_are_each_made():
    # an unused loop is what extraction drops, and two identical ones what an e-graph merges
    def build(log):
        loop = _loop("fori", log)
        return lambda A, v: (loop(A, v), loop(A, v), A @ A @ v)[-1]

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(got_log) == len(want_log) == 6
    _same_calls(want_log, got_log)
    result = rewrite_jaxpr(jax.make_jaxpr(f)(A, v), profile=default_profile("cpu"))
    assert result.fn is not None and [e.primitive.name for e in result.program.eqns] == ["scan", "scan"]


def test_calls_at_the_top_in_nested_jits_and_in_loops_together():
    def build(log):
        @jax.jit
        def inner(A, v):
            jax.debug.callback(lambda s: log.append(("jit", float(s))), v.sum())
            return _loop("scan", [])(A, v)  # its own log: counted below

        def f(A, v):
            jax.debug.callback(lambda s: log.append(("top", float(s))), (A @ A @ v).sum())
            return inner(A, v) @ jnp.ones((v.shape[1], 3))

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, _) = _calls(build, A, v, strict=True, verify=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert sorted(k for k, _ in got_log) == sorted(k for k, _ in want_log) == ["jit", "top"]
    _same_calls(sorted(x for _, x in want_log), sorted(x for _, x in got_log))


def test_ordered_calls_in_a_loop_and_after_it_keep_their_order():
    def build(log):
        def f(A, v):
            def body(c, _):
                for k in range(3):
                    jax.debug.callback(lambda s, k=k: log.append((k, float(s))), (k * c).sum(), ordered=True)
                return A @ A @ c, None

            c = jax.lax.scan(body, v, None, length=2)[0]
            jax.debug.callback(lambda s: log.append(("end", float(s))), c.sum(), ordered=True)
            return c

        return f

    A, v = _matrices()
    log, f = _record(build)
    opt = jaxrw.optimize(f, strict=True)
    for _ in range(3):
        opt(A, v)
    jax.effects_barrier()
    assert [k for k, _ in log] == [0, 1, 2, 0, 1, 2, "end"] * 3
    want_log, g = _record(build)
    jax.jit(g)(A, v)
    jax.effects_barrier()
    _same_calls([s for _, s in want_log], [s for _, s in log[:7]])
    assert opt.report(A, v).bodies[0].rewritten


def test_a_callback_that_raises_in_a_loop_raises_as_under_jax_jit_once():
    A, v = jnp.ones((16, 16)), -jnp.ones((16, 2))
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, strict=True, verify=True)):
        g = wrap(_loop("scan", calls := _Raising()))
        with pytest.raises(Exception, match="negative sum") as got:
            jax.block_until_ready(g(A, v))
        assert not isinstance(got.value, jaxrw.JaxrwError)
        jax.effects_barrier()
        assert len(calls) == 1  # the step's call raised: jax makes no more


class _Raising(list):
    """A log whose append raises on a negative value (a user's assertion in a loop)."""

    def append(self, x):
        super().append(x)
        if x < 0:
            raise ValueError("negative sum")


def test_gradients_and_vmap_of_loops_with_calls_call_as_jax_jit_does():
    def build(log):
        loop = _loop("scan", log)
        return lambda A, v: jnp.sum(jnp.tanh(loop(A, v)) ** 2)

    A, v = _matrices(16)
    for transform in (jax.grad, lambda f: jax.vmap(f, in_axes=(0, None))):
        args = (A, v) if transform is jax.grad else (jnp.stack([A, 2 * A]), v)
        outs = []
        for wrap in (jax.jit, jaxrw.optimize):
            log, f = _record(build)
            got = transform(wrap(f))(*args)
            jax.effects_barrier()
            outs.append((got, log))
        (want, want_log), (got, got_log) = outs
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        _same_calls(np.sort(want_log), np.sort(got_log))


def test_hoisting_is_left_off_for_loops_with_calls():
    log, f = _record(lambda log: _loop("scan", log))
    A, v = _matrices()
    opt = jaxrw.optimize(f, hoist_argnums=(0,))
    with pytest.warns(UserWarning, match="not hoisted: the function makes jax.debug calls"):
        got = opt(A, v)
    got = opt(A, v)
    np.testing.assert_allclose(got, jax.jit(f)(A, v), rtol=1e-4, atol=1e-4)
    jax.effects_barrier()
    assert len(log) == 9  # two calls of opt, one of jax.jit's, three steps each


def test_a_rerun_with_exact_rules_makes_the_calls_once():
    # the non-finite guard rewrites the program again (run.py `again`): it is not split again
    def build(log):
        def f(a, b, c):
            loop = jax.lax.scan(lambda x, _: (_tap(log, x) + 1.0, None), c, None, length=2)[0]
            return (a @ b) @ c, jnp.tanh(a @ (b @ c)), loop

        return f

    a, b, c = jnp.ones((8, 8)).at[0, 0].set(jnp.inf), jnp.ones((8, 8)), jnp.ones((8, 3))
    force = jaxrw.Limits(min_gain=0)
    (want, want_log, _), (got, got_log, f) = _calls(build, a, b, c, strict=True, limits=force)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w))
    assert len(got_log) == len(want_log) == 2
    report = jaxrw.optimize(f, limits=force).report(a, b, c)
    assert "exact rules only" in report.nonfinite_note


def test_a_checkpoint_with_calls_in_a_loop_body_keeps_that_body_as_written():
    def build(log):
        def f(A, v):
            def body(c, _):
                g = jax.checkpoint(lambda x: A @ _tap(log, x))
                return A @ A @ g(c), None

            return jax.lax.scan(body, v, None, length=2)[0] @ jnp.ones((v.shape[1], 4))

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True, verify=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    _same_calls(want_log, got_log)
    body = jaxrw.optimize(f, strict=True).report(A, v).bodies[0]
    assert not body.rewritten and body.stop_reason.value == "side effects"


def test_explain_numbers_equations_with_loops_that_make_calls():
    def f(A, B, v):
        jax.debug.print("bv {}", (B @ v).sum())
        c = jax.lax.scan(lambda c, _: (A @ B @ _tap([], c), None), v, None, length=2)[0]
        return 2.0 * (A @ B @ (B @ c))

    A, B = _matrices(64)[0], _matrices(64, seed=1)[0]
    ex = jaxrw.explain(f, A, B, jnp.ones((64, 2)))
    rows = [(e.index, e.primitive, e.status) for e in ex.equations]
    traced = jax.make_jaxpr(f)(A, B, jnp.ones((64, 2))).jaxpr
    assert [p for _, p, _ in rows] == [e.primitive.name for e in traced.eqns]
    assert rows[2] == (2, "debug_print", "kept") and rows[3] == (3, "scan", "kept")
    assert [i for i, _, _ in rows] == list(range(len(rows))) and ex.report["n_equations"] == len(rows)


def test_the_encoder_takes_loops_with_calls_only_as_outputs():
    from jaxrw.rewrite.effects import bound_once, loops_only, split_callbacks
    from jaxrw.rewrite.encode import encode
    from jaxrw.rewrite.graph import Node

    A, v = _matrices(8)
    closed = jax.make_jaxpr(lambda A, v: (_loop("scan")(A, v), A @ v)[1])(A, v)
    assert not loops_only(closed)  # its loop is no output: extraction would drop it
    with pytest.raises(UnsupportedProgramError):
        encode(closed)
    pure, calls = split_callbacks(closed)
    assert loops_only(pure) and not calls.eqns and len(pure.jaxpr.outvars) == 2
    program = encode(pure)
    assert [e.primitive.name for e in program.eqns] == ["scan"]
    node = lambda k, kids: Node(f"n{k}", "opaque", f"c{k}", kids, (0, k))  # noqa: E731
    assert bound_once(program, [node(0, ("a",)), node(1, ("a",))])
    assert not bound_once(program, [])  # dropped
    assert not bound_once(program, [node(0, ("a",)), node(1, ("b",))])  # bound twice


@pytest.mark.parametrize("kind", ["scan", "cond"])
def test_a_body_that_makes_calls_keeps_the_non_finite_guard(kind):
    # the body's outputs that reach tanh outside were not passed on with the calls taken out:
    # c@W + c@V was factored, inf*(1-2) = -inf where jax.jit gives nan (a review's repro)
    x = jnp.zeros((4, 4)).at[0, 0].set(jnp.inf)
    W, V = jnp.eye(4), -2 * jnp.eye(4)

    def f(x, W, V):
        def step(c):
            jax.debug.callback(lambda s: None, c.sum())
            return c @ W + c @ V

        if kind == "scan":
            y = jax.lax.scan(lambda c, _: (step(c), None), x, None, length=1)[0]
        else:
            y = jax.lax.cond(x[1, 1] == 0, step, lambda c: c, x)
        return jnp.tanh(y)

    want = jax.jit(f)(x, W, V)
    got = jaxrw.optimize(f, strict=True)(x, W, V)
    jax.effects_barrier()
    assert bool(jnp.isnan(want[0, 0])) and bool(jnp.isnan(got[0, 0]))
    np.testing.assert_array_equal(got, want)

"""The direct executor: an effectful executable called without jax's Python dispatch gives jax's
results, falls back for arguments it cannot take, and keeps donation. On CPU an unordered
io_callback stands in for thunky's effectful custom call (same dispatch path in jax)."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from jaxrw.schedule.direct import DirectExecutor, ThunkyProgram, direct_executor


def _effectful(n_args: int):
    """A jitted function of n arrays with an unordered effect (as a thunky program has) and a
    pytree of outputs."""

    def f(*xs):
        io_callback(lambda: None, None, ordered=False)
        total = sum(xs[1:], xs[0])
        return {"sum": total, "parts": [xs[0] * 2.0, jnp.tanh(total)]}

    return jax.jit(f)


def _args(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal((3, 5), dtype=np.float32)) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 4, 17])
def test_direct_matches_jit(n):
    jitted = _effectful(n)
    args = _args(n)
    direct, _ = direct_executor(jitted, args)
    assert isinstance(direct, DirectExecutor)
    want = jitted(*args)
    for seed in (1, 2):  # new arrays of the same signature go through it too
        fresh = _args(n, seed)
        got, want = direct(*fresh), jitted(*fresh)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_unused_arguments_are_dropped_as_jax_drops_them():
    jitted = jax.jit(lambda x, unused, y: (io_callback(lambda: None, None, ordered=False), x - y)[1])
    x, u, y = _args(3)
    direct, _ = direct_executor(jitted, [x, u, y])
    assert direct is not None
    np.testing.assert_array_equal(np.asarray(direct(x, u, y)), np.asarray(x - y))


def test_closed_over_arrays_reach_the_executable_with_unused_arguments_dropped():
    # jax >= 0.12.1 passes closed-over arrays over 1 KiB as hidden leading arguments (earlier
    # versions embed them): the executor passes them too, and drops unused arguments after them
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((64, 5)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)

    def f(x, unused, y):
        io_callback(lambda: None, None, ordered=False)
        return jnp.tanh(x @ v @ w) - y

    jitted = jax.jit(f)
    x, u, y = _args(3)
    direct, why = direct_executor(jitted, [x, u, y])
    assert direct is not None, why
    for seed in (4, 5):
        x, u, y = _args(3, seed)
        np.testing.assert_array_equal(np.asarray(direct(x, u, y)), np.asarray(jitted(x, u, y)))
    want = np.tanh(np.asarray(x, np.float64) @ np.asarray(v, np.float64) @ np.asarray(w, np.float64))
    np.testing.assert_allclose(np.asarray(direct(x, u, y)), want - np.asarray(y), rtol=1e-5, atol=1e-5)


def test_arguments_it_cannot_take_return_none():
    jitted = _effectful(2)
    args = _args(2)
    direct, _ = direct_executor(jitted, args)
    assert direct(np.asarray(args[0]), args[1]) is None  # numpy: jax must place it
    assert direct(args[0]) is None  # wrong count
    assert direct(args[0], jnp.zeros((3, 6), jnp.float32)) is None  # wrong shape
    assert direct(args[0], args[1].astype(jnp.float16)) is None  # wrong dtype
    gone = jnp.array(args[0])
    gone.delete()
    assert direct(gone, args[1]) is None  # deleted (donated): jax.jit's own error follows


def test_no_executor_for_ordered_effects_or_non_arrays():
    ordered = jax.jit(lambda x: (io_callback(lambda: None, None, ordered=True), x + 1)[1])
    assert direct_executor(ordered, _args(1)) == (None, "ordered effects")
    host = [np.ones((3, 5), np.float32)]
    assert direct_executor(_effectful(1), host) == (None, "arguments other than jax arrays")
    direct, why = direct_executor(_effectful(1), _args(1))
    assert isinstance(direct, DirectExecutor) and why is None


def test_thunky_program_says_why_it_has_no_executor(caplog):
    ordered = jax.jit(lambda x: (io_callback(lambda: None, None, ordered=True), x + 1)[1])
    program = ThunkyProgram(ordered)
    (x,) = _args(1)
    with caplog.at_level(logging.INFO, logger="jaxrw"):
        np.testing.assert_allclose(np.asarray(program(x)), np.asarray(x) + 1)
    assert program._direct is None and program.why_not_direct == "ordered effects"
    assert "no direct call (ordered effects); it runs through jax's dispatch" in caplog.text


def test_calls_the_executor_cannot_take_go_to_otherwise_when_given():
    # auto timed its pick through the executor: without it, XLA's program (`otherwise`) runs
    calls = []

    def xla(*a):
        calls.append(a)
        return {"sum": a[0] + a[1], "parts": [a[0] * 2.0, jnp.tanh(a[0] + a[1])]}

    args = _args(2)
    program = ThunkyProgram(_effectful(2), otherwise=xla)
    program(*args)
    assert isinstance(program._direct, DirectExecutor) and not calls
    host = [np.asarray(a) for a in args]
    out = program(*host)  # numpy: not the executor's; XLA's program takes it
    assert len(calls) == 1
    np.testing.assert_allclose(np.asarray(out["sum"]), host[0] + host[1], rtol=1e-6)
    traced = jax.jit(lambda a, b: program(a, b)["sum"])(*args)  # under a trace: the thunky program
    assert len(calls) == 1
    np.testing.assert_allclose(np.asarray(traced), host[0] + host[1], rtol=1e-6)
    with jax.debug_nans(True):  # no executor at all: every concrete call goes to XLA's program
        nanny = ThunkyProgram(_effectful(2), otherwise=xla)
        nanny(*args)
        assert nanny._direct is None and nanny.why_not_direct == "jax's NaN/Inf checks are on"
    assert len(calls) == 2


def test_donated_argument_is_consumed():
    jitted = jax.jit(
        lambda x, y: (io_callback(lambda: None, None, ordered=False), x + y)[1], donate_argnums=0
    )
    x, y = _args(2)
    direct, _ = direct_executor(jitted, [x, y])
    want = np.asarray(x) + np.asarray(y)
    np.testing.assert_allclose(np.asarray(direct(x, y)), want)
    if jax.default_backend() != "cpu":  # the CPU backend ignores donation
        assert x.is_deleted()


def test_thunky_program_uses_the_executor_and_falls_back():
    jitted = _effectful(2)
    program = ThunkyProgram(jitted)
    args = _args(2)
    out = program(*args)
    assert isinstance(program._direct, DirectExecutor)
    np.testing.assert_array_equal(np.asarray(out["sum"]), np.asarray(args[0] + args[1]))
    # numpy arguments and traced calls go to the jitted function, with the same results
    mixed = program(np.asarray(args[0]), args[1])
    np.testing.assert_array_equal(np.asarray(mixed["sum"]), np.asarray(out["sum"]))
    traced = jax.jit(lambda a, b: program(a, b)["sum"])(*args)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(out["sum"]))
    grads = jax.grad(lambda a: jnp.sum(program(a, args[1])["parts"][0]))(args[0])
    np.testing.assert_allclose(np.asarray(grads), 2.0)


def test_thunky_program_waits_for_concrete_arrays_before_building():
    program = ThunkyProgram(_effectful(1))
    (x,) = _args(1)
    program(np.asarray(x))  # numpy first: no executor yet, still answered
    assert program._direct is None and not program._tried
    program(x)
    assert isinstance(program._direct, DirectExecutor)


def test_no_executor_while_jax_checks_for_nans():
    with jax.debug_nans(True):
        assert direct_executor(_effectful(1), _args(1)) == (None, "jax's NaN/Inf checks are on")

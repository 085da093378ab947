"""Hoisted arguments that hold Python scalars beside the parameter arrays (`{"w": w, "scale":
0.5}`): the prologue values belong to the arrays alone, so a scalar that is a new object on each
call, or holds another value, reuses them, and the scalar reaches the main program as passed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxrw
from jaxrw import hoist
from tests.test_hoist import _call, _params, _x
from tests.test_hoist_two_sets import _no_full_path, refuse


def scaled(params, x):
    # A @ B depends on the arrays only (hoisted); the scale is read by the main program
    return jnp.tanh(x @ (params["A"] @ params["B"])) * params["scale"]


def _reference(params, x):
    p = {k: np.asarray(v, np.complex128 if type(v) is complex else np.float64) for k, v in params.items()}
    return np.tanh(np.asarray(x, np.float64) @ (p["A"] @ p["B"])) * p["scale"]


def _with(p, scale):
    return {"A": p["A"], "B": p["B"], "scale": scale}


def test_a_new_python_float_on_each_call_reuses_the_values_on_the_quick_path(monkeypatch):
    # HotPath compared the ids of every hoisted leaf, the float's too: a float made anew for each
    # call sent every call down the full call path (2.5x jax.jit's time on this CPU, a 10 µs
    # function) though the arrays, and so the values, were the cached ones. An equal float is now
    # the same leaf (compared by value: identity.scalar_key) and passed as an array made once
    opt = jaxrw.optimize(scaled, hoist_argnums=0)
    p, x = _params(700), _x(701)
    for i in range(3):
        params = _with(p, float(np.float64(0.5) + i * 0.0))  # equal value, a new object
        np.testing.assert_allclose(opt(params, x), _reference(params, x), rtol=1e-4, atol=1e-5)
    _no_full_path(monkeypatch, opt)
    monkeypatch.setattr(hoist, "run_proven", refuse)
    with monkeypatch.context() as quick_only:
        quick_only.setattr(hoist, "structure_hit", refuse)
        for _ in range(3):
            params = _with(p, float(np.float64(0.5)))
            np.testing.assert_allclose(opt(params, x), _reference(params, x), rtol=1e-4, atol=1e-5)
    # another value: the same arrays, found by their ids (structure_hit), the value passed as it is
    for scale in (0.25, -1.5, 0.0, -0.0, 3.0, 0.5):
        params = _with(p, float(np.float64(scale)))
        np.testing.assert_allclose(opt(params, x), _reference(params, x), rtol=1e-4, atol=1e-5)
    assert _call(opt).prologue_runs == 1


def test_a_scalar_of_another_type_is_not_taken_for_the_cached_one():
    # 2 and 2.0 compare equal in Python but trace to int32 and float32: the call with the other
    # type must not run the program traced for the first (jax.jit retraces; so does this)
    opt = jaxrw.optimize(scaled, hoist_argnums=0)
    p, x = _params(702), _x(703)
    for scale in (2.0, 2.0, 2, True, 2.0, complex(2, 0), 2.0):
        params = _with(p, scale)
        got, want = opt(params, x), jax.jit(scaled)(params, x)
        assert got.dtype == want.dtype, (scale, got.dtype, want.dtype)
        np.testing.assert_allclose(got, _reference(params, x), rtol=1e-4, atol=1e-5)


def test_new_arrays_beside_a_scalar_rerun_the_prologue_for_new_values():
    # only the arrays key the values: new arrays with the same scalar object must not reuse them
    opt = jaxrw.optimize(scaled, hoist_argnums=0)
    x, scale = _x(704), 0.75
    for seed in (705, 706, 705):
        params = _with(_params(seed), scale)
        np.testing.assert_allclose(opt(params, x), _reference(params, x), rtol=1e-4, atol=1e-5)


def test_the_first_call_inside_another_jit_then_plain_calls_stay_right():
    # the quick path may be built while an outer jit traces (concrete parameters closed over, the
    # data traced): the scalar it converts then must be a concrete array, not that trace's tracer
    opt = jaxrw.optimize(scaled, hoist_argnums=0)
    p, x = _params(707), _x(708)
    params = _with(p, 0.5)
    outer = jax.jit(lambda x: opt(params, x) + 1.0)
    np.testing.assert_allclose(outer(x), _reference(params, x) + 1.0, rtol=1e-4, atol=1e-5)
    for scale in (0.5, 0.5, 0.25):
        params = _with(p, scale)
        np.testing.assert_allclose(opt(params, x), _reference(params, x), rtol=1e-4, atol=1e-5)
    params = _with(p, 0.5)
    np.testing.assert_allclose(outer(_x(709)), _reference(params, _x(709)) + 1.0, rtol=1e-4, atol=1e-5)

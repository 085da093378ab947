"""Where the user's filters make warnings errors (`-W error`, pytest's filterwarnings = error), a
jaxrw warning is raised once, after the state it reports is kept; the next calls run quietly, as
jax.jit's do. A notice (an autotune choice that could not be saved) is not a failed build.

A new user's try (forty-second session): under `warnings.simplefilter("error")` an unwritable
autotune cache made every call raise "falling back to jax.jit ... optimize stage failed:
UserWarning: jaxrw: could not save ...", and so did every call of a function that fell back."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw


def _chain(a, b, v):
    return (a @ b) @ v


def _args():
    a, b = (jax.random.normal(k, (32, 32)) for k in jax.random.split(jax.random.key(0)))
    return a, b, jnp.ones((32, 2))


def _calls(opt, args, n=3):
    """Each call's result, or the warning it raised."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(n):
            try:
                out.append(opt(*args))
            except Warning as w:
                out.append(w)
    return out


def test_an_unsaved_autotune_choice_is_a_notice_not_a_fallback(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(blocker / "sub"))  # under a file: never writable
    args = _args()
    opt = jaxrw.optimize(_chain, autotune=True, limits=jaxrw.Limits(min_gain=0))
    first, *rest = _calls(opt, args)
    assert isinstance(first, UserWarning) and "could not save the autotune choice" in str(first)
    assert "falling back" not in str(first)
    for got in rest:
        np.testing.assert_allclose(got, jax.jit(_chain)(*args), rtol=1e-4, atol=1e-4)
    assert not opt.report(*args).fallback  # the build stood


@pytest.mark.parametrize("hoist", [False, True])
def test_a_fallback_warning_made_an_error_is_raised_once(hoist):
    args = _args()
    opt = jaxrw.optimize(_chain, rules="dot.no_such_rule", hoist_argnums=(1,) if hoist else None)
    first, *rest = _calls(opt, args)
    assert isinstance(first, UserWarning) and str(first).startswith("jaxrw: falling back to jax.jit")
    assert "UserWarning" not in str(first)  # not wrapped in a second fallback
    for got in rest:
        np.testing.assert_allclose(got, jax.jit(_chain)(*args), rtol=1e-4, atol=1e-4)
    assert "no_such_rule" in opt.report(*args).fallback


def test_a_failed_first_call_warns_once(monkeypatch):
    from jaxrw import api

    real = api.rewrite_jaxpr

    def broken(*a, **k):  # a rewritten program that fails when it runs
        res = real(*a, **{**k, "force": True})
        res.fn = lambda *xs: (_ for _ in ()).throw(RuntimeError("boom"))
        return res

    monkeypatch.setattr(api, "rewrite_jaxpr", broken)
    args = _args()
    opt = jaxrw.optimize(_chain)
    first, *rest = _calls(opt, args)
    assert isinstance(first, UserWarning) and "boom" in str(first) and "UserWarning" not in str(first)
    for got in rest:
        np.testing.assert_allclose(got, jax.jit(_chain)(*args), rtol=1e-4, atol=1e-4)


def test_the_happy_path_warns_nothing():
    args = _args()
    for opts in ({}, {"strict": True}, {"verify": True}, {"hoist_argnums": (1,)}):
        got = _calls(jaxrw.optimize(_chain, **opts), args)
        assert all(not isinstance(g, Warning) for g in got), (opts, got)

"""Rewrites work on e-graphs lent from templates (rewrite/lease.py): each program is taken away
again when its rewrite ends, however it ends, nested rewrites (control-flow bodies, reruns) each
get a template of their own, and results are those of a fresh e-graph per program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite import lease
from jaxrw.rewrite.profiles import default_profile
from jaxrw.rewrite.run import rewrite_jaxpr


def _sizes(eg) -> dict:
    return {name: n for name, n in eg.all_function_sizes() if n}


def _templates_as_made() -> None:
    """Every template holds what a fresh one holds, and none is lent."""
    assert lease.current() is None and lease._lent == []
    fresh = _sizes(lease.program_egraph())
    assert lease._templates and all(_sizes(t) == fresh for t in lease._templates if t is not None)


def _chain(a, b, c, v):
    return a @ b @ c @ v


def _scan_of_chains(a, b, v):
    def body(carry, _):
        return jnp.tanh(a @ b @ carry), None

    return jax.lax.scan(body, v, None, length=3)[0]


def _args(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32) / 8) for s in shapes]


def test_a_program_is_gone_from_its_template_when_its_rewrite_ends():
    args = _args(0, (32, 32), (32, 32), (32, 32), (32, 2))
    result = rewrite_jaxpr(jax.make_jaxpr(_chain)(*args), profile=default_profile("cpu"))
    assert result.report.rewritten and result.program.egraph is None  # lent: nothing to keep
    _templates_as_made()


def test_nested_rewrites_each_have_a_template():
    # a scan body is rewritten while its loop's program is encoded: depth 1 inside depth 0
    args = _args(1, (24, 24), (24, 24), (24, 3))
    opt = jaxrw.optimize(_scan_of_chains)
    np.testing.assert_allclose(opt(*args), jax.jit(_scan_of_chains)(*args), rtol=2e-5, atol=1e-6)
    assert opt.report(*args).bodies
    assert len(lease._templates) >= 2
    _templates_as_made()


def test_a_failed_rewrite_still_returns_its_e_graph(monkeypatch):
    from jaxrw.rewrite import run

    def broken(*a, **k):
        raise RuntimeError("saturation broke")

    args = _args(2, (16, 16), (16, 16), (16, 16), (16, 2))
    monkeypatch.setattr(run, "saturate", broken)
    with pytest.warns(UserWarning, match="saturation broke"):
        out = jaxrw.optimize(_chain)(*args)
    np.testing.assert_allclose(out, jax.jit(_chain)(*args), rtol=2e-5, atol=1e-6)
    _templates_as_made()
    monkeypatch.undo()
    opt = jaxrw.optimize(_chain)  # the next rewrite gets a clean template
    np.testing.assert_allclose(opt(*args), jax.jit(_chain)(*args), rtol=2e-5, atol=1e-6)
    assert opt.report(*args).rewritten


def test_a_template_that_cannot_restore_is_replaced(monkeypatch):
    args = _args(3, (16, 16), (16, 16), (16, 16), (16, 2))
    rewrite_jaxpr(jax.make_jaxpr(_chain)(*args), profile=default_profile("cpu"))
    first = lease._templates[0]

    def refuses():
        raise RuntimeError("pop refused")

    monkeypatch.setattr(first, "pop", refuses)
    rewrite_jaxpr(jax.make_jaxpr(_chain)(*args), profile=default_profile("cpu"))
    assert lease._templates[0] is None  # dropped: the next rewrite makes a new one
    result = rewrite_jaxpr(jax.make_jaxpr(_chain)(*args), profile=default_profile("cpu"))
    assert result.report.rewritten and lease._templates[0] is not first
    _templates_as_made()


def test_rewrites_on_a_lent_e_graph_match_those_on_a_fresh_one():
    # the same program twice, and after other programs: the same e-graph, rules and choice
    args = _args(4, (32, 32), (32, 32), (32, 32), (32, 2))
    closed = jax.make_jaxpr(_chain)(*args)
    first = rewrite_jaxpr(closed, profile=default_profile("cpu"))
    rewrite_jaxpr(
        jax.make_jaxpr(_scan_of_chains)(*_args(5, (8, 8), (8, 8), (8, 1))), profile=default_profile("cpu")
    )
    again = rewrite_jaxpr(closed, profile=default_profile("cpu"))
    for r in (first, again):
        assert r.report.rewritten
    keys = ("egraph_nodes", "egraph_classes", "iterations", "rules_fired", "cost_after")
    assert [getattr(first.report, k) for k in keys] == [getattr(again.report, k) for k in keys]
    np.testing.assert_allclose(again.fn(*args)[0], _chain(*args), rtol=2e-5, atol=1e-6)

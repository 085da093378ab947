"""Ops that only place or copy a value (with_sharding_constraint, reshard, stop_gradient, copy:
nonfinite.VALUE_IDENTITIES) pass a NaN/Inf swap through unchanged, so under the default numerics
they do not stop a rewrite below them, as opaque ops do; below a saturating function they keep
its guard (a new user's try: a sharding constraint on activations kept every chain as written)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrw
from tests.test_bad_input import FORCE, _finite_parts_agree, _poisoned

_MESH = Mesh(np.array(jax.devices()[:1]), ("d",))
IDENTITIES = {
    "sharding_constraint": lambda y: jax.lax.with_sharding_constraint(y, NamedSharding(_MESH, P("d", None))),
    "stop_gradient": jax.lax.stop_gradient,
    "copy": jnp.copy,
}


@pytest.mark.parametrize("name", sorted(IDENTITIES))
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_an_identity_lets_rules_through_and_keeps_the_guard_of_what_saturates(name, poison):
    ident = IDENTITIES[name]

    def fn(a, b, c, x):  # the first sum reaches an output only; the second reaches tanh
        return ident(a @ b.T + a @ c.T), jnp.tanh(ident(x @ b.T - x @ c.T)).sum(0)

    traced = jax.make_jaxpr(fn)(*_poisoned([(8, 64), (64, 64), (64, 64), (8, 64)], 1.0, 0))
    assert (
        sum(
            e.primitive.name == jax.make_jaxpr(ident)(jnp.ones((2, 2))).eqns[0].primitive.name
            for e in traced.jaxpr.eqns
        )
        == 2
    )
    opt = jaxrw.optimize(fn, strict=True, limits=FORCE)
    for seed in range(3):
        args = _poisoned([(8, 64), (64, 64), (64, 64), (8, 64)], poison, seed)
        for got, want in zip(opt(*args), jax.jit(fn)(*args), strict=True):
            got, want = np.asarray(got), np.asarray(want)
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
            _finite_parts_agree(got, want)
    report = opt.report(*args)
    assert report.rewritten and "dot.factor_left" in report.rules_fired  # (where allowed: finiteness above)
    assert not report.nonfinite_note


def test_a_sharded_chain_under_a_constraint_is_reassociated():
    def fn(x, A, B, v):
        return IDENTITIES["sharding_constraint"](x @ A @ B @ v)

    x, A, B = (
        jnp.asarray(np.random.default_rng(i).standard_normal((128, 128)), jnp.float32) for i in range(3)
    )
    v = jnp.ones((128, 2))
    opt = jaxrw.optimize(fn, strict=True)
    got = opt(x, A, B, v)
    exact = np.asarray(x, np.float64) @ np.asarray(A, np.float64) @ np.asarray(B, np.float64) @ np.asarray(v)
    np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3 * np.abs(exact).max())
    assert opt.report(x, A, B, v).rewritten
    assert got.sharding.is_equivalent_to(jax.jit(fn)(x, A, B, v).sharding, got.ndim)

"""Plausible but false identities must not be derivable: with every rule, the two sides stay in
different e-classes, and numerically they differ (so the check would catch a rule deriving them).
A published StableHLO rule set shipped (X@Y)*(X@Z) -> X@(Y*Z)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from .harness import SMALL, rel_err, run_rules


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def _pos(rng, *shape):
    return jnp.asarray(rng.uniform(0.5, 2.0, size=shape).astype(np.float32))


def _neg(rng, *shape):
    return jnp.asarray(-rng.uniform(0.5, 2.0, size=shape).astype(np.float32))


FALSE_IDENTITIES = {
    "hadamard_of_products": (lambda x, y, z: ((x @ y) * (x @ z), x @ (y * z)), ("m", "m", "m")),
    "exp_of_sum": (lambda a, b: (jnp.exp(a + b), jnp.exp(a) + jnp.exp(b)), ("m", "m")),
    "sqrt_of_square_negative": (lambda a: (jnp.sqrt(a * a), a), ("neg",)),
    "transpose_of_product": (lambda a, b: ((a @ b).T, a.T @ b.T), ("m", "m")),
    "product_commutes": (lambda a, b: (a @ b, b @ a), ("m", "m")),
    "log_of_product_unknown_sign": (lambda a, b: (jnp.log(a * b), jnp.log(a) + jnp.log(b)), ("neg", "neg")),
    "exp_log_unknown_sign": (lambda a: (jnp.exp(jnp.log(a)), a), ("neg",)),
    "sum_of_product_is_not_product_of_sums": (
        lambda a, b: (jnp.sum(a @ b), jnp.sum(a) * jnp.sum(b)),
        ("m", "m"),
    ),
    "trace_of_product_is_not_product_of_traces": (
        lambda a, b: (jnp.trace(a @ b), jnp.trace(a) * jnp.trace(b)),
        ("m", "m"),
    ),
    "diag_scaling_side": (lambda v, a: (jnp.diag(v) @ a, a @ jnp.diag(v)), ("v", "m")),
    "max_of_sum": (lambda a, b: (jnp.max(a + b, 0), jnp.max(a, 0) + jnp.max(b, 0)), ("m", "m")),
}


@pytest.mark.parametrize("name", sorted(FALSE_IDENTITIES))
def test_false_identity_is_not_derived(name):
    fn, kinds = FALSE_IDENTITIES[name]
    rng = np.random.default_rng(0)
    make = {"m": lambda: _rand(rng, 12, 12), "v": lambda: _rand(rng, 12), "neg": lambda: _neg(rng, 12, 12)}
    args = tuple(make[k]() for k in kinds)
    lhs, rhs = (np.asarray(o, np.float64) for o in fn(*args))
    with np.errstate(invalid="ignore"):
        assert not np.allclose(lhs, rhs, equal_nan=False) or np.isnan(lhs).any() != np.isnan(rhs).any()
    sat = run_rules(fn, args, None, SMALL)
    out = sat.view.outputs
    assert out[0] != out[1], f"{name}: derived by {sorted(sat.report.rules_fired)}"


def test_true_identities_are_derived():
    # the same check finds identities that hold (so the negative tests are not vacuous)
    rng = np.random.default_rng(1)
    a, b, c = (_rand(rng, 12, 12) for _ in range(3))
    for fn, args in (
        (lambda a, b, c: (a @ b + a @ c, a @ (b + c)), (a, b, c)),
        (lambda a, b: ((a @ b).T, b.T @ a.T), (a, b)),
        (lambda a, b: (jnp.trace(a @ b), jnp.sum(a * b.T)), (a, b)),
        (lambda a, b, c: ((a @ b) @ c, a @ (b @ c)), (a, b, c)),
    ):
        sat = run_rules(fn, args, None, SMALL)
        assert sat.view.outputs[0] == sat.view.outputs[1]
        x, y = fn(*args)
        assert rel_err(x, y) < 1e-4

"""Programs with odd shapes: a dimension jax traces but XLA refuses gets jax.jit's own error,
and equations on empty values stay opaque while the rest of the program is rewritten."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrw

FORCE = jaxrw.Limits(min_gain=0)


def _rand(seed, *shapes, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes]


@pytest.mark.parametrize("strict", [False, True])
def test_a_negative_dimension_gets_jax_jit_s_own_error(strict):
    # jax traces jax.random.normal(k, (-1,)); the cost model priced it below zero and optimize
    # warned of an extract-stage failure (strict: RewriteStageError) before jax.jit's MLIRError
    f = lambda k: jax.random.normal(k, (-1,)) * 2.0 + 1.0  # noqa: E731
    with pytest.raises(Exception) as want:
        jax.jit(f)(jax.random.key(0))
    opt = jaxrw.optimize(f, strict=strict)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: it is kept as written
        with pytest.raises(type(want.value), match="invalid tensor dimension"):
            opt(jax.random.key(0))
    rep = opt.report(jax.random.key(0))
    assert rep.stop_reason.value == "negative dimension" and "(-1,)" in rep.guard_note


def test_equations_on_zero_size_values_stay_opaque():
    # concatenations of empty arrays have the shape of their parts: merge rules could grow the
    # e-graph without bound inside one saturation step (a hang found by make fuzz)
    def f(c, d, e):
        g = c @ d
        return jnp.concatenate([g, g, g], 0) + e @ d

    args = _rand(7, (0, 4), (4, 2), (0, 4))
    opt = jaxrw.optimize(f, strict=True, limits=FORCE)
    np.testing.assert_allclose(opt(*args), jax.jit(f)(*args))
    rep = opt.report(*args)
    assert rep.stop_reason.value == "saturated" and rep.rules_fired == {}


def test_empty_values_leave_the_rest_of_the_program_rewritten():
    # the whole program was kept as written for one empty value: lax.associative_scan over an
    # even length slices empty arrays, and the chain beside it was not reassociated (a new user)
    def f(xs, a, v):
        return lax.associative_scan(jnp.add, xs), (a @ a) @ v

    xs, a, v = jnp.arange(16.0), *_rand(8, (64, 64), (64,))
    opt = jaxrw.optimize(f, strict=True, limits=FORCE)
    for got, want in zip(opt(xs, a, v), jax.jit(f)(xs, a, v), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5)
    rep = opt.report(xs, a, v)
    assert rep.rewritten and rep.rules_fired.get("dot.assoc_right", 0) > 0, rep

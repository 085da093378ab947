"""Where optimize(fn) must behave as jax.jit(fn) does, found by a review that compared the two
call by call (the fourth review round): keyword names, configuration contexts, methods,
disable_jit, threads, donation under transformations, what a signature keeps alive."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw


def _r(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_a_keyword_named_self_reaches_the_function():
    # optimize(f)(x, self=3.0): "got multiple values for argument 'self'", then a fallback
    def scale(x, self):
        return x * self

    x = jnp.ones(2)
    got = jaxrw.optimize(scale, strict=True)(x, self=3.0)
    np.testing.assert_array_equal(got, jax.jit(scale)(x, self=3.0))
    assert jaxrw.optimize(scale, strict=True).report(x, self=3.0) is not None


def _mixed_types(A, v, h):
    return (A @ A) @ v + h  # float32 + bfloat16: promoted by default, an error under "strict"


def _mixed_ranks(A, v, h):
    return (A @ A) @ A + v  # (n, n) + (n,): broadcast by default, an error under "raise"


@pytest.mark.parametrize(
    "fn, context",
    [
        (_mixed_types, lambda: jax.numpy_dtype_promotion("strict")),
        (_mixed_ranks, lambda: jax.numpy_rank_promotion("raise")),
    ],
    ids=["dtype", "rank"],
)
def test_promotion_contexts_are_part_of_the_signature(fn, context):
    # a signature built under the default promotion was reused inside the context: no error
    A, v = _r(0, 64, 64), _r(1, 64)
    args = (A, v, v.astype(jnp.bfloat16))
    opt = jaxrw.optimize(fn)
    np.testing.assert_allclose(opt(*args), jax.jit(fn)(*args), rtol=1e-2)  # built here
    with context():
        with pytest.raises(Exception) as jitted:
            jax.jit(fn)(*args)
        with pytest.raises(type(jitted.value)):
            opt(*args)

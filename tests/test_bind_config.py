"""A bound function (`Optimized.bind`) called under other jax config runs, as a compiled
executable does. A new user's try (forty-second session): under `jax.default_matmul_precision`,
`numpy_rank_promotion("raise")`, `numpy_dtype_promotion("strict")` or x64 it raised "called with
arguments of another structure, shape or dtype" for the very arguments it was bound with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.errors import InvalidOptionError
from jaxrw.signature import split_statics, trace_config, without_config


def _mlp(p, x):
    return jax.nn.relu(x @ p["a"] + x @ p["b"]) @ p["c"] @ p["d"]


def _params():
    keys = jax.random.split(jax.random.key(0), 5)
    return {
        k: jax.random.normal(kk, (16, 16)) / 4 for k, kk in zip("abcd", keys, strict=False)
    }, jax.random.normal(keys[4], (8, 16))


CONTEXTS = {
    "precision": lambda: jax.default_matmul_precision("highest"),
    "rank-promotion": lambda: jax.numpy_rank_promotion("raise"),
    "dtype-promotion": lambda: jax.numpy_dtype_promotion("strict"),
    "x64": lambda: jax.enable_x64(True),
}


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_a_bound_function_runs_under_other_config(context):
    p, x = _params()
    bound = jaxrw.optimize(_mlp, hoist_argnums=0).bind(p, x)
    want = jax.jit(_mlp)(p, x)
    with CONTEXTS[context]():
        got = bound(x)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bound(x), want, rtol=1e-4, atol=1e-4)  # and after, as before


def test_other_arguments_are_still_refused():
    p, x = _params()
    bound = jaxrw.optimize(_mlp, hoist_argnums=0).bind(p, x)
    with pytest.raises(InvalidOptionError, match="another structure, shape or dtype"):
        bound(jnp.ones((4, 16), jnp.bfloat16))


def test_the_config_items_come_last_and_are_four():
    args = (1, jnp.ones(2))
    _, statics = split_statics(args, {}, (0,), ())
    assert len(trace_config()) == 4 and statics[-4:] == trace_config()
    assert without_config(statics) == ((0, (int, 1)),)

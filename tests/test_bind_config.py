"""A bound function (`Optimized.bind`) called under another matmul precision or promotion rules
runs, as a compiled executable does; under another x64 setting or mesh (types and placement
change) it is refused, saying so. A new user's try (forty-second session): under
`jax.default_matmul_precision`, `numpy_rank_promotion("raise")` or `numpy_dtype_promotion("strict")`
it raised "called with arguments of another structure, shape or dtype" for the very arguments it
was bound with; a review then found that running under another x64 setting gave jax's own dtype
errors (bound under x64, called without)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.errors import InvalidOptionError
from jaxrw.signature import as_bound, split_statics, trace_config


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


def test_another_x64_setting_is_refused_by_name():
    def f(p, x):
        return x @ p @ p + jnp.arange(4) * 0.5

    with jax.enable_x64(True):
        p, x = jnp.ones((4, 4)), jnp.ones((2, 4))  # float64
        bound = jaxrw.optimize(f, hoist_argnums=0).bind(p, x)
        assert bound(x).dtype == jnp.float64
    with pytest.raises(InvalidOptionError, match="another jax_enable_x64 or mesh"):
        bound(x)  # jax's own TypeError (float64 + float32) from inside the bound program before


def test_a_bound_key_leaves_out_only_precision_and_promotion():
    args = (1, jnp.ones(2))
    _, statics = split_statics(args, {}, (0,), ())
    assert statics[-len(trace_config()) :] == trace_config()
    kept = [c[0] for c in as_bound(statics)[1:]]
    assert as_bound(statics)[0] == (0, (int, 1)) and kept == ["x64", "mesh"]

"""Hoisted leaves read only for their shape or dtype (`zeros_like(p["state"])`): no variable of the
program, so they reach the main program only through the signature. A call where such a leaf has
another kind must run that kind's program, whichever layout serves it, and a new array that takes
a dead one's id must not pass for it. (A session's attempt to key the prologue's cache by its own
inputs broke both; a review's repros, kept as guards. docs/reliability.md, thirty-seventh session.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jaxrw


def _params(seed: int, d: int = 16) -> dict:
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32) for _ in range(2))
    return {"A": a, "B": b}


def shaped(p, x):
    # `like` is read for its shape and dtype alone: no variable of the program, in no key but the
    # signature's (a review's repros: its new kind was served the old one's program)
    y = jnp.tanh(x @ (p["A"] @ p["B"])).sum()
    return jnp.broadcast_to(y, p["like"].shape).astype(p["like"].dtype)


def test_a_leaf_read_for_its_shape_alone_is_of_the_signature_kind():
    p = _params(930)
    x = jnp.asarray(np.random.default_rng(931).standard_normal((3, 16)), jnp.float32)

    def second(x, p):  # the parameters second: HotPath.__call__'s flatten branch serves them
        return shaped(p, x)

    by_position = (jaxrw.optimize(second, hoist_argnums=1), lambda f, q: f(x, q))
    by_name = (jaxrw.optimize(shaped, hoist_argnames="p"), lambda f, q: f(p=q, x=x))
    for opt, run in (by_position, by_name):
        for _ in range(3):
            run(opt, {**p, "like": jnp.zeros(3)})
        for n, dtype in ((5, jnp.float32), (7, jnp.float16), (3, jnp.float32), (5, jnp.bfloat16)):
            q = {**p, "like": jnp.zeros(n, dtype)}
            got, want = run(opt, q), shaped(q, x)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2)


def test_a_shape_only_leaf_replaced_in_place_never_passes_for_a_dead_ones_id():
    # the usual layout's identity check compares ids; the leaf's death is asked of its weak
    # reference (no finalizer watches it): a new array of another shape may take the id
    opt = jaxrw.optimize(shaped, hoist_argnums=0)
    p = {**_params(940), "like": jnp.zeros(3)}
    x = jnp.asarray(np.random.default_rng(941).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        opt(p, x)
    for i in range(300):
        p["like"] = jnp.zeros(3 if i % 3 == 0 else 5)
        assert opt(p, x).shape == shaped(p, x).shape

"""platform_conds: reading what an index computation holds. `constant_value` evaluates iotas,
comparisons, selects, broadcasts and concatenations in NumPy (jax compiled a program per new
primitive and shape: 0.5 s of a first build), and its values are jax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite import platform_conds
from jaxrw.rewrite.platform_conds import constant_value, diagonal_gather


def _gathers(jaxpr):
    for e in jaxpr.eqns:
        if e.primitive.name == "gather":
            yield jaxpr, e
        for p in e.params.values():
            for j in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(j, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    yield from _gathers(inner)


PROGRAMS = [
    (lambda x: jnp.diagonal(x), (7, 7)),
    (lambda x: jnp.diagonal(x), (5, 9)),
    (lambda x: jnp.diagonal(x, axis1=1, axis2=2), (3, 6, 4)),
    (jax.vmap(jnp.diagonal), (2, 6, 6)),
    (lambda x: jnp.diagonal(x, offset=-2), (6, 6)),
    (lambda x: x[jnp.arange(5), 4 - jnp.arange(5)], (5, 5)),
    (lambda x: x[jnp.arange(6, dtype=jnp.uint8), jnp.arange(6, dtype=jnp.int16)], (6, 6)),
]


@pytest.mark.parametrize("fn,shape", PROGRAMS)
def test_indices_read_in_numpy_are_jaxs(monkeypatch, fn, shape):
    jaxpr = jax.make_jaxpr(fn)(jnp.ones(shape)).jaxpr
    found = list(_gathers(jaxpr))
    assert found
    for inner, eqn in found:
        fast = constant_value(inner, None, eqn.invars[1])
        with monkeypatch.context() as m:
            m.setattr(platform_conds, "_in_numpy", lambda eqn, args: None)
            slow = constant_value(inner, None, eqn.invars[1])
            slow_diagonal = diagonal_gather(inner, None, eqn)
        assert fast is not None and fast.dtype == slow.dtype
        np.testing.assert_array_equal(fast, slow)
        assert diagonal_gather(inner, None, eqn) == slow_diagonal


def test_the_diagonal_s_indices_need_no_compiled_program(monkeypatch):
    jaxpr = jax.make_jaxpr(lambda x: jnp.diagonal(x, axis1=1, axis2=2))(jnp.ones((2, 9, 9))).jaxpr
    ((inner, eqn),) = _gathers(jaxpr)

    def refused(*args, **kw):
        raise AssertionError("jax evaluated an index equation")

    for e in inner.eqns:
        if e is not eqn:
            monkeypatch.setattr(e.primitive, "bind", refused)
    assert diagonal_gather(inner, None, eqn)

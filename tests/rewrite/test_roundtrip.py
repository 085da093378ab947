"""encode -> decode without rewrites reproduces every corpus program bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite.encode import encode
from jaxrw.rewrite.profiles import CPU
from jaxrw.rewrite.run import rewrite_jaxpr
from tests.corpus import CORPUS


def _bits(x):
    """The raw bytes of an array (so NaN payloads and -0.0 compare exactly); keys by their data."""
    if "key" in str(x.dtype):
        x = jax.random.key_data(x)
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_round_trip_is_bit_exact(name):
    rng = np.random.default_rng(0)
    fn, args = CORPUS[name](rng)
    leaves, in_tree = jax.tree_util.tree_flatten(args)

    def flat(*xs):
        return fn(*jax.tree_util.tree_unflatten(in_tree, xs))

    closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*leaves)
    res = rewrite_jaxpr(closed, rules=[], profile=CPU, force=True)
    assert res.fn is not None and res.report.rewritten
    got = jax.jit(res.fn)(*leaves)
    want = jax.tree_util.tree_leaves(jax.jit(flat)(*leaves))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(_bits(g), _bits(w))
    # same output avals, weak types included
    got_avals = [jax.typeof(x) for x in jax.eval_shape(res.fn, *leaves)]
    assert [(a.shape, a.dtype, a.weak_type) for a in got_avals] == [
        (v.aval.shape, v.aval.dtype, v.aval.weak_type) for v in closed.jaxpr.outvars
    ]
    del out_shape


def test_opaque_equations_are_kept_and_calls_inlined():
    rng = np.random.default_rng(1)
    fn, args = CORPUS["scan_rnn"](rng)
    closed = jax.make_jaxpr(fn)(*args)
    prog = encode(closed)
    assert [e.primitive.name for e in prog.eqns] == ["scan"]
    fn2, args2 = CORPUS["attention"](rng)
    prog2 = encode(jax.make_jaxpr(fn2)(*args2))
    assert "jit" not in prog2.primitives and "pjit" not in prog2.primitives
    assert prog2.primitives["dot_general"] >= 6


def test_effects_are_refused_with_a_clear_error():
    from jaxrw.errors import UnsupportedProgramError

    def f(x):
        jax.debug.print("x={x}", x=x)
        return x * 2

    closed = jax.make_jaxpr(f)(np.ones(3, np.float32))
    with pytest.raises(UnsupportedProgramError, match="side effects"):
        encode(closed)


def _like_terms(x):
    y = x @ x
    return y * 3.0 + y


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x: x @ jnp.ones((4,)), (3, 4)),  # x @ ones -> sum(x): the result stays strong
        (_like_terms, (64, 64)),  # y*3 + y -> y*4, a strong 4: the result stays weak
    ],
    ids=["drops_strong", "adds_strong"],
)
def test_rewritten_outputs_keep_the_traced_weak_type(fn, shape):
    # a weak input (jnp.full with a Python float): the rewrites changed the output's weak type, so
    # the decode check refused them (a fallback to jax.jit; strict raised)
    x = jnp.full(shape, 1.5)
    opt = jaxrw.optimize(fn, strict=True, limits=dict(min_gain=0.0))  # kept however small the gain
    got, want = opt(x), jax.jit(fn)(x)
    assert opt.report(x).rewritten
    assert got.weak_type == want.weak_type and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_concatenate_of_a_thousand_arrays_decodes():
    # the encoder's left-nested chain of 1,099 links was flattened recursively: RecursionError in
    # decode (strict raised; otherwise a fallback to jax.jit)
    def f(xs):
        return jnp.concatenate([x * 2.0 for x in xs]) @ jnp.ones((4,))

    xs = [jnp.full((1, 4), float(i), dtype=jnp.float32) for i in range(1100)]
    opt = jaxrw.optimize(f, strict=True, limits=dict(min_gain=0.0))
    np.testing.assert_allclose(opt(xs), jax.jit(f)(xs), rtol=1e-6)
    assert opt.report(xs).rewritten


def test_a_user_primitive_named_like_a_lax_one_stays_itself():
    # Primitive("exp") computing 2x was encoded as Tensor.unary("exp") and decoded to lax.exp
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    from jaxrw.rewrite.encode import impostor

    double = Primitive("exp")
    double.def_impl(lambda x: x * 2)
    double.def_abstract_eval(lambda x: x)
    mlir.register_lowering(double, mlir.lower_fun(lambda x: x * 2, multiple_results=False))
    assert impostor(double) and not impostor(jax.lax.exp_p)

    def f(A, B, v):
        return double.bind(A) @ B @ v

    rng = np.random.default_rng(0)
    A = jnp.asarray(rng.standard_normal((64, 64)) * 0.1, jnp.float32)
    v = jnp.ones((64, 2))
    opt = jaxrw.optimize(f, strict=True)
    np.testing.assert_allclose(opt(A, A, v), jax.jit(f)(A, A, v), rtol=1e-4, atol=1e-5)
    assert opt.report(A, A, v).rewritten  # the chain around it still is

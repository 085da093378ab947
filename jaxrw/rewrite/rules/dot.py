"""Dot algebra: associativity and distributivity of matmul-form dots.

A matmul-form dot contracts the last axis of its left operand with the first non-batch axis of
its right operand, with the same `nb` leading batch axes on both sides: `A @ B` for matrices,
`x @ W` for activations of any rank, batched `@`, matrix-vector products. Rules keep the dot's
configuration (`cfg`: precision, preferred element type) and fire only where all operands and
the result share one dtype, so no rewrite changes a type.
"""

from __future__ import annotations

import numpy as np
from egglog import String, eq, i64, rewrite, vars_

from ..terms import Tensor, dtype, shape
from . import Rule, register_rule

A, B, C, T = vars_("A B C T", Tensor)
nb, l, r, c = vars_("nb l r c", i64)
(d,) = vars_("d", String)


def _same_dtype(*ts):
    return [eq(dtype(t)).to(d) for t in ts]


def _rand(rng, shape_, dt):
    import jax.numpy as jnp

    return jnp.asarray(rng.standard_normal(shape_).astype(np.float32)).astype(dt)


# --- associativity -------------------------------------------------------------------------------


def _assoc_right():
    # (A@B)@C -> A@(B@C)   [A contracted on its last axis; B a matrix per batch]
    lhs = Tensor.dot(Tensor.dot(A, B, nb, l, nb, c), C, nb, l, nb, c)
    rhs = Tensor.dot(A, Tensor.dot(B, C, nb, nb + 1, nb, c), nb, l, nb, c)
    return [rewrite(lhs).to(rhs, eq(l).to(shape(A).length() - 1), eq(shape(B).length()).to(nb + 2),
                            *_same_dtype(A, B, C))]


def _assoc_left():
    # A@(B@C) -> (A@B)@C
    lhs = Tensor.dot(A, Tensor.dot(B, C, nb, nb + 1, nb, c), nb, l, nb, c)
    rhs = Tensor.dot(Tensor.dot(A, B, nb, l, nb, c), C, nb, l, nb, c)
    return [rewrite(lhs).to(rhs, eq(l).to(shape(A).length() - 1), eq(shape(B).length()).to(nb + 2),
                            *_same_dtype(A, B, C))]


def _chain_example(rng, dt):
    n = int(rng.integers(24, 64))
    A_, B_, C_ = (_rand(rng, (n, n), dt) for _ in range(3))
    v = _rand(rng, (n, int(rng.integers(1, 4))), dt)
    return (lambda a, b, c_, x: ((a @ b) @ c_) @ x), (A_, B_, C_, v)


def _chain_left_example(rng, dt):
    m = int(rng.integers(24, 64))
    u = _rand(rng, (int(rng.integers(1, 4)), m), dt)
    A_, B_ = (_rand(rng, (m, m), dt) for _ in range(2))
    return (lambda x, a, b: x @ (a @ b)), (u, A_, B_)


register_rule(Rule("dot.assoc_right", "dot", "(A@B)@C -> A@(B@C)", exact=False, build=_assoc_right,
                   conditions="matmul-form dots, same cfg, one dtype", example=_chain_example))
register_rule(Rule("dot.assoc_left", "dot", "A@(B@C) -> (A@B)@C", exact=False, build=_assoc_left,
                   conditions="matmul-form dots, same cfg, one dtype", example=_chain_left_example))


# --- distributivity ------------------------------------------------------------------------------


def _factor_left():
    # A@B + A@C -> A@(B+C);  A@B - A@C -> A@(B-C)   [B, C of one shape]
    out = []
    for combine in (Tensor.add, Tensor.sub):
        lhs = combine(Tensor.dot(A, B, nb, l, r, c), Tensor.dot(A, C, nb, l, r, c))
        rhs = Tensor.dot(A, combine(B, C), nb, l, r, c)
        out.append(rewrite(lhs).to(rhs, eq(shape(B)).to(shape(C)), *_same_dtype(A, B, C)))
    return out


def _factor_right():
    # A@C + B@C -> (A+B)@C;  A@C - B@C -> (A-B)@C   [A, B of one shape]
    out = []
    for combine in (Tensor.add, Tensor.sub):
        lhs = combine(Tensor.dot(A, C, nb, l, r, c), Tensor.dot(B, C, nb, l, r, c))
        rhs = Tensor.dot(combine(A, B), C, nb, l, r, c)
        out.append(rewrite(lhs).to(rhs, eq(shape(A)).to(shape(B)), *_same_dtype(A, B, C)))
    return out


def _expand_left():
    # A@(B+C) -> A@B + A@C
    out = []
    for combine in (Tensor.add, Tensor.sub):
        lhs = Tensor.dot(A, combine(B, C), nb, l, r, c)
        rhs = combine(Tensor.dot(A, B, nb, l, r, c), Tensor.dot(A, C, nb, l, r, c))
        out.append(rewrite(lhs).to(rhs, eq(shape(B)).to(shape(C)), *_same_dtype(A, B, C)))
    return out


def _factor_left_example(rng, dt):
    m, k, n = (int(x) for x in rng.integers(8, 48, size=3))
    return (lambda a, b, c_: a @ b + a @ c_ - a @ (b * 0.5)), tuple(
        _rand(rng, s, dt) for s in ((m, k), (k, n), (k, n)))


def _factor_right_example(rng, dt):
    m, k, n = (int(x) for x in rng.integers(8, 48, size=3))
    return (lambda a, b, c_: a @ c_ - b @ c_), tuple(_rand(rng, s, dt) for s in ((m, k), (m, k), (k, n)))


def _expand_example(rng, dt):
    m, k, n = (int(x) for x in rng.integers(8, 48, size=3))
    return (lambda a, b, c_: a @ (b + c_)), tuple(_rand(rng, s, dt) for s in ((m, k), (k, n), (k, n)))


register_rule(Rule("dot.factor_left", "dot", "A@B ± A@C -> A@(B±C)", exact=False, build=_factor_left,
                   conditions="same dot dims and cfg; B, C one shape; one dtype", example=_factor_left_example))
register_rule(Rule("dot.factor_right", "dot", "A@C ± B@C -> (A±B)@C", exact=False, build=_factor_right,
                   conditions="same dot dims and cfg; A, B one shape; one dtype", example=_factor_right_example))
register_rule(Rule("dot.expand_left", "dot", "A@(B±C) -> A@B ± A@C", exact=False, build=_expand_left,
                   conditions="B, C one shape; one dtype", example=_expand_example))


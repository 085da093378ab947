"""Dot algebra: associativity, distributivity, scalars, like terms, transposes, zeros, identities.

A matmul-form dot contracts the last axis of its left operand with the first non-batch axis of
its right operand, with the same `nb` leading batch axes on both sides: `A @ B` for matrices,
`x @ W` for activations of any rank, batched `@`, matrix-vector products. `dot.assoc_2d` covers
the other contracting axes of 2-D operands (transposes absorbed into dimension numbers). Rules
keep the dot's configuration (`cfg`: precision, preferred element type) and fire only where all
operands and the result share one dtype, so no rewrite changes a type.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rewrite, rule, union

from ..terms import DEFAULT_CFG, Tensor, float_dtype, is_eye, plain_cfg, shape, structured
from ..terms import fill as fill_
from . import Rule, register_rule
from ._util import RING, V, not_own_term, rand, rank, same_dtype, sizes

A, B, C, X, S, Z, E, x = V.A, V.B, V.C, V.X, V.S, V.Z, V.E, V.x
nb, l, r, c, q, d, so = V.nb, V.l, V.r, V.c, V.q, V.d, V.so
dot = Tensor.dot


def _reg(name, identity, exact, build, conditions, example, dtypes=RING):
    register_rule(Rule(f"dot.{name}", "dot", identity, exact, build, conditions, example, dtypes))


def _last(t, axis):
    return eq(axis).to(shape(t).length() - 1)


def _scalar(t):
    return eq(shape(t)).to(Vec[i64].empty())


# --- associativity -------------------------------------------------------------------------------


def _assoc_right():
    # (A@B)@C -> A@(B@C)   [A contracted on its last axis; B a matrix per batch]
    inner = dot(A, B, nb, l, nb, c)
    lhs = dot(inner, C, nb, l, nb, c)
    rhs = dot(A, dot(B, C, nb, nb + 1, nb, c), nb, l, nb, c)
    conds = [_last(A, l), eq(shape(B).length()).to(nb + 2), *same_dtype(A, B, C, inner, lhs)]
    # (A@B)@v with A, B batched and v shared: (A@B) contracted with v unbatched -> A@(B@v), the
    # batch axes of B kept as free axes of B@v (A[4,n,n]@B[4,n,n]@v[n]: 4n^3 -> 8n^2 multiplies)
    shared = dot(inner, C, 0, l, 0, c)
    shared_rhs = dot(A, dot(B, C, 0, nb + 1, 0, c), nb, l, nb, c)
    return [
        rewrite(lhs).to(rhs, *conds),
        rewrite(shared).to(shared_rhs, nb > 0, *conds[:2], *same_dtype(A, B, C, inner, shared)),
    ]


def _assoc_left():
    # A@(B@C) -> (A@B)@C
    inner = dot(B, C, nb, nb + 1, nb, c)
    lhs = dot(A, inner, nb, l, nb, c)
    rhs = dot(dot(A, B, nb, l, nb, c), C, nb, l, nb, c)
    conds = [_last(A, l), eq(shape(B).length()).to(nb + 2), *same_dtype(A, B, C, inner, lhs)]
    # A@(B@v), A and B batched, v shared -> (A@B)@v (the way back of assoc_right's second form)
    shared_inner = dot(B, C, 0, nb + 1, 0, c)
    shared = dot(A, shared_inner, nb, l, nb, c)
    shared_rhs = dot(dot(A, B, nb, l, nb, c), C, 0, l, 0, c)
    same = same_dtype(A, B, C, shared_inner, shared)
    return [rewrite(lhs).to(rhs, *conds), rewrite(shared).to(shared_rhs, nb > 0, *conds[:2], *same)]


def _assoc_2d():
    # Any contracting axes of 2-D operands, both directions (a·b contracts a's axis l, b's r):
    #   dot(dot(A,B,l,r),C,1,q) -> dot(A, dot(B,C,1-r,q), l, 0)   (C meets B's free axis)
    #   dot(dot(A,B,l,r),C,0,q) -> dot(B, dot(A,C,1-l,q), r, 0)   (C meets A's free axis)
    #   dot(A,dot(B,C,s,t),l,0) -> dot(dot(A,B,l,1-s),C,1,t)
    #   dot(A,dot(B,C,s,t),l,1) -> dot(dot(A,C,l,1-t),B,1,s)
    # C may have more free axes (2 or 3 more: a batch jax.vmap added, A @ B @ x of each x), which
    # every form but the last carries through in order
    s, t = V.s0, V.s1
    two = [rank(A, 2), rank(B, 2)]
    wide = [shape(C).length() >= 2, shape(C).length() <= 4]
    out = []
    inner = dot(A, B, 0, l, r, c)
    for p, rhs in (
        (1, dot(A, dot(B, C, 0, 1 - r, q, c), 0, l, 0, c)),
        (0, dot(B, dot(A, C, 0, 1 - l, q, c), 0, r, 0, c)),
    ):
        lhs = dot(inner, C, 0, p, q, c)
        out.append(rewrite(lhs).to(rhs, *two, *wide, *same_dtype(A, B, C, inner, lhs)))
    inner = dot(B, C, 0, s, t, c)
    for p, rhs, c_rank in (
        (0, dot(dot(A, B, 0, l, 1 - s, c), C, 0, 1, t, c), wide),
        (1, dot(dot(A, C, 0, l, 1 - t, c), B, 0, 1, s, c), [rank(C, 2)]),
    ):
        lhs = dot(A, inner, 0, l, p, c)
        out.append(rewrite(lhs).to(rhs, *two, *c_rank, *same_dtype(A, B, C, inner, lhs)))
    return out


def _chain_example(rng, dt):
    n = sizes(rng, 1, 16, 64)[0]
    A_, B_, C_ = (rand(rng, (n, n), dt) for _ in range(3))
    v = rand(rng, (n, sizes(rng, 1, 1, 4)[0]), dt)
    stacked = _mats(rng, dt, (3, n, n), (3, n, n))  # and a batched chain times v (shared)
    return (lambda a, b, c_, v_, sa, sb: (((a @ b) @ c_) @ v_, (sa @ sb) @ v_[:, 0])), (
        A_,
        B_,
        C_,
        v,
        *stacked,
    )


def _chain_left_example(rng, dt):
    m = sizes(rng, 1, 16, 64)[0]
    u = rand(rng, (sizes(rng, 1, 1, 4)[0], m), dt)
    A_, B_ = (rand(rng, (m, m), dt) for _ in range(2))
    stacked = _mats(rng, dt, (2, m, m), (2, m, m))  # and a batched A@(B@v), v = uᵀ shared
    return (lambda u_, a, b, sa, sb: (u_ @ (a @ b), sa @ (sb @ u_.T))), (u, A_, B_, *stacked)


def _dg(a, b, lc, rc):
    from jax import lax

    return lax.dot_general(a, b, (((lc,), (rc,)), ((), ())))


def _assoc_2d_example(rng, dt):
    m, k, n, p = sizes(rng, 4)

    def f(a, b, c_, e, g):
        left = _dg(_dg(a, b, 0, 0), c_, 0, 0)  # (aᵀb)ᵀc: c meets a's free axis -> [n, p]
        right = _dg(e, _dg(b, g, 1, 0), 1, 1)  # e(bg)ᵀ: e meets g's free axis -> [p, k]
        return left, right

    shapes = ((k, m), (k, n), (m, p), (p, m), (n, m))

    def g(a, b, c_, e, g_, x, y):
        import jax

        vmapped = jax.vmap(lambda x_: (a.T @ b) @ x_)(x)  # (aᵀb)·x over x's middle axis, x [3, n, 2]
        twice = jax.vmap(jax.vmap(lambda y_: e @ (g_.T @ y_)))(y)  # e·(gᵀ·y), y [2, 2, n, 3]
        return (*f(a, b, c_, e, g_), vmapped, twice)

    return g, (*_mats(rng, dt, *shapes), *_mats(rng, dt, (3, n, 2), (2, 2, n, 3)))


_reg(
    "assoc_right",
    "(A@B)@C -> A@(B@C), also for batched A, B and a C shared by the batch",
    False,
    _assoc_right,
    "matmul-form dots, same cfg, one dtype",
    _chain_example,
)
_reg(
    "assoc_left",
    "A@(B@C) -> (A@B)@C, also for batched A, B and a C shared by the batch",
    False,
    _assoc_left,
    "matmul-form dots, same cfg, one dtype",
    _chain_left_example,
)
_reg(
    "assoc_2d",
    "(A·B)·C <-> A·(B·C) over any contracting axes",
    False,
    _assoc_2d,
    "2-D A and B, C with up to two more free axes (a vmapped chain), no batch axes, same cfg, one dtype",
    _assoc_2d_example,
)


def _adopt_cfg():
    # dot(A, B, DEFAULT) -> dot(A, B, c)  for a configuration c of the program that computes the same
    # (dots that rules create get DEFAULT_CFG; adopting the program's lets them reassociate with it)
    lhs = dot(A, B, nb, l, r, DEFAULT_CFG)
    return [
        rule(eq(x).to(lhs), *same_dtype(A, B), plain_cfg(c, d)).then(union(x).with_(dot(A, B, nb, l, r, c)))
    ]


def _adopt_cfg_example(rng, dt):
    m, n = sizes(rng, 2)
    return (lambda a, b, w: ((a * w[:, None]).sum(0), a @ b)), _mats(rng, dt, (m, n), (n, m), (m,))


_reg(
    "adopt_cfg",
    "dot(A,B, default cfg) -> dot(A,B, the program's plain cfg)",
    False,
    _adopt_cfg,
    "the program has a dot configuration without precision override whose output dtype is the operands'",
    _adopt_cfg_example,
)


# --- distributivity ------------------------------------------------------------------------------


def _factor(side):
    # A@B ± A@C -> A@(B±C)  (left);  A@C ± B@C -> (A±B)@C  (right)
    out = []
    for combine in (Tensor.add, Tensor.sub):
        if side == "left":
            x1, x2 = dot(A, B, nb, l, r, c), dot(A, C, nb, l, r, c)
            rhs, same = dot(A, combine(B, C), nb, l, r, c), (B, C)
        else:
            x1, x2 = dot(A, C, nb, l, r, c), dot(B, C, nb, l, r, c)
            rhs, same = dot(combine(A, B), C, nb, l, r, c), (A, B)
        conds = [eq(shape(same[0])).to(shape(same[1])), *same_dtype(A, B, C, x1, x2), *not_own_term(x1, x2)]
        out.append(rule(eq(x).to(combine(x1, x2)), *conds).then(union(x).with_(rhs)))
    return out


def _expand(side):
    # A@(B±C) -> A@B ± A@C  (left);  (A±B)@C -> A@C ± B@C  (right)   [one summand structured]
    # Distributing over any sum would multiply products down every residual stream (x_{k+1} =
    # x_k + f(x_k)): it is kept to sums with a cheap-to-multiply part, e.g. low-rank updates
    # (A + u vᵀ)@X -> A@X + u (vᵀX).
    out = []
    for combine in (Tensor.add, Tensor.sub):
        if side == "left":
            lhs = dot(A, combine(B, C), nb, l, r, c)
            rhs, same = combine(dot(A, B, nb, l, r, c), dot(A, C, nb, l, r, c)), (B, C)
        else:
            lhs = dot(combine(A, B), C, nb, l, r, c)
            rhs, same = combine(dot(A, C, nb, l, r, c), dot(B, C, nb, l, r, c)), (A, B)
        conds = [eq(shape(same[0])).to(shape(same[1])), *same_dtype(A, B, C, lhs)]
        for part in same:
            out.append(rewrite(lhs).to(rhs, *conds, structured(part)))
    return out


def _mats(rng, dt, *shapes):
    return tuple(rand(rng, s, dt) for s in shapes)


def _factor_left_example(rng, dt):
    m, k, n = sizes(rng, 3)
    return (lambda a, b, c_: a @ b + a @ c_ - a @ (b * 3)), _mats(rng, dt, (m, k), (k, n), (k, n))


def _factor_right_example(rng, dt):
    m, k, n = sizes(rng, 3)
    return (lambda a, b, c_: a @ c_ - b @ c_), _mats(rng, dt, (m, k), (m, k), (k, n))


def _expand_left_example(rng, dt):
    import jax.numpy as jnp

    m, k, n = sizes(rng, 3)
    return (lambda a, b, u, v: a @ (b + jnp.outer(u, v))), _mats(rng, dt, (m, k), (k, n), (k,), (n,))


def _expand_right_example(rng, dt):
    import jax.numpy as jnp

    m, k, n = sizes(rng, 3)
    return (lambda a, u, v, c_: (a - jnp.outer(u, v)) @ c_), _mats(rng, dt, (m, k), (m,), (k,), (k, n))


_reg(
    "factor_left",
    "A@B ± A@C -> A@(B±C)",
    False,
    lambda: _factor("left"),
    "same dot dims and cfg; B, C one shape; one dtype",
    _factor_left_example,
)
_reg(
    "factor_right",
    "A@C ± B@C -> (A±B)@C",
    False,
    lambda: _factor("right"),
    "same dot dims and cfg; A, B one shape; one dtype",
    _factor_right_example,
)
_reg(
    "expand_left",
    "A@(B±C) -> A@B ± A@C",
    False,
    lambda: _expand("left"),
    "B, C one shape, one of them structured (broadcast, outer product, fill, identity); one dtype",
    _expand_left_example,
)
_reg(
    "expand_right",
    "(A±B)@C -> A@C ± B@C",
    False,
    lambda: _expand("right"),
    "A, B one shape, one of them structured (broadcast, outer product, fill, identity); one dtype",
    _expand_right_example,
)


# --- scalars -------------------------------------------------------------------------------------


def _scalar_out():
    # (sA)@B -> s(A@B);  A@(sB) -> s(A@B);  (A/s)@B -> (A@B)/s;  A@(B/s) -> (A@B)/s   [s rank 0]
    out = []
    for scaled in (Tensor.mul(A, S), Tensor.mul(S, A)):
        for side in (True, False):
            lhs = dot(scaled, B, nb, l, r, c) if side else dot(B, scaled, nb, l, r, c)
            plain = dot(A, B, nb, l, r, c) if side else dot(B, A, nb, l, r, c)
            out.append(rewrite(lhs).to(Tensor.mul(plain, S), _scalar(S), *same_dtype(A, B, S, lhs)))
    for side in (True, False):
        lhs = dot(Tensor.div(A, S), B, nb, l, r, c) if side else dot(B, Tensor.div(A, S), nb, l, r, c)
        plain = dot(A, B, nb, l, r, c) if side else dot(B, A, nb, l, r, c)
        conds = [_scalar(S), *same_dtype(A, B, S, lhs), float_dtype(d)]
        out.append(rewrite(lhs).to(Tensor.div(plain, S), *conds))
    return out


def _scalar_in():
    # s(A@B) -> (sA)@B  and  A@(sB);  (A@B)/s -> A@(B/s)   [s rank 0]
    out = []
    p = dot(A, B, nb, l, r, c)
    for lhs in (Tensor.mul(p, S), Tensor.mul(S, p)):
        conds = [_scalar(S), *same_dtype(A, B, S, p)]
        out.append(rewrite(lhs).to(dot(Tensor.mul(A, S), B, nb, l, r, c), *conds))
        out.append(rewrite(lhs).to(dot(A, Tensor.mul(B, S), nb, l, r, c), *conds))
    conds = [_scalar(S), *same_dtype(A, B, S, p), float_dtype(d)]
    out.append(rewrite(Tensor.div(p, S)).to(dot(A, Tensor.div(B, S), nb, l, r, c), *conds))
    return out


def _neg_out():
    # (-A)@B -> -(A@B);  A@(-B) -> -(A@B)   [the product in the operands' dtype: -a wraps in int8
    # (-(-128) = -128) where the negated int32 product of a preferred_element_type does not]
    lhs = (dot(Tensor.neg(A), B, nb, l, r, c), dot(A, Tensor.neg(B), nb, l, r, c))
    return [rewrite(t).to(Tensor.neg(dot(A, B, nb, l, r, c)), *same_dtype(A, B, t)) for t in lhs]


def _scalar_out_example(rng, dt):
    m, k, n = sizes(rng, 3)
    s = rand(rng, (), dt)
    fn = (
        (lambda a, b, s_: (s_ * a) @ b + a @ (b * s_) + (a / 2) @ b)
        if dt != "int32"
        else (lambda a, b, s_: (s_ * a) @ b + a @ (b * s_))
    )
    return fn, (*_mats(rng, dt, (m, k), (k, n)), s)


def _scalar_in_example(rng, dt):
    m, k, n = sizes(rng, 3)
    s = rand(rng, (), dt)
    fn = (lambda a, b, s_: s_ * (a @ b) - (a @ b) / 4) if dt != "int32" else (lambda a, b, s_: s_ * (a @ b))
    return fn, (*_mats(rng, dt, (m, k), (k, n)), s)


def _neg_example(rng, dt):
    m, k, n = sizes(rng, 3)
    return (lambda a, b: (-a) @ b + a @ (-b)), _mats(rng, dt, (m, k), (k, n))


_reg(
    "scalar_out",
    "(sA)@B -> s(A@B), A@(sB) -> s(A@B), (A/s)@B -> (A@B)/s",
    False,
    _scalar_out,
    "s rank 0; one dtype; division forms only for floating dtypes",
    _scalar_out_example,
)
_reg(
    "scalar_in",
    "s(A@B) -> (sA)@B | A@(sB), (A@B)/s -> A@(B/s)",
    False,
    _scalar_in,
    "s rank 0; one dtype; division form only for floating dtypes",
    _scalar_in_example,
)
# exact but for the sign of a zero: a sum of signed-zero terms ((-0) + (+0) = +0) negated is -0
# (found by make fuzz: an empty contraction gave -0 where jax.jit gives +0), so not for "strict"
_reg("neg_out", "(-A)@B -> -(A@B), A@(-B) -> -(A@B)", False, _neg_out, "one dtype", _neg_example)


# --- like terms ----------------------------------------------------------------------------------


def _double():
    # X + X -> 2X   (exact: doubling rounds nowhere)
    two = Tensor.mul(X, Tensor.scalar(2, 1, d))
    return [rule(eq(x).to(Tensor.add(X, X)), *not_own_term(X), *same_dtype(X)).then(union(x).with_(two))]


def _like_terms():
    # aX + bX -> (a+b)X;  aX - bX -> (a-b)X;  X + aX -> (a+1)X   [a, b rank 0]
    a_, b_ = S, V.T
    out = []
    for ax in (Tensor.mul(X, a_), Tensor.mul(a_, X)):
        for bx in (Tensor.mul(X, b_), Tensor.mul(b_, X)):
            for combine in (Tensor.add, Tensor.sub):
                conds = [*not_own_term(X, ax, bx), _scalar(a_), _scalar(b_), *same_dtype(X, a_, b_)]
                out.append(
                    rule(eq(x).to(combine(ax, bx)), *conds).then(
                        union(x).with_(Tensor.mul(X, combine(a_, b_)))
                    )
                )
        for lhs in (Tensor.add(X, ax), Tensor.add(ax, X)):
            conds = [*not_own_term(X, ax), _scalar(a_), *same_dtype(X, a_)]
            out.append(
                rule(eq(x).to(lhs), *conds).then(
                    union(x).with_(Tensor.mul(X, Tensor.add(a_, Tensor.scalar(1, 1, d))))
                )
            )
    return out


def _double_example(rng, dt):
    m, n = sizes(rng, 2)
    return (lambda a, b: a @ b + a @ b), _mats(rng, dt, (m, n), (n, m))


def _like_terms_example(rng, dt):
    m, n = sizes(rng, 2)
    s, t = rand(rng, (), dt), rand(rng, (), dt)
    return (lambda a, s_, t_: s_ * a + a * t_ - (a * s_ - t_ * a) + (a + a * t_)), (
        rand(rng, (m, n), dt),
        s,
        t,
    )


_reg("double", "X + X -> 2X", True, _double, "one dtype", _double_example)
_reg(
    "like_terms",
    "aX ± bX -> (a±b)X, X + aX -> (a+1)X",
    False,
    _like_terms,
    "a, b rank 0; one dtype",
    _like_terms_example,
)


# --- transposes ----------------------------------------------------------------------------------

T2, T3 = Vec[i64](i64(1), i64(0)), Vec[i64](i64(0), i64(2), i64(1))


def _transpose_out():
    # (A·B)ᵀ -> Bᵀ·Aᵀ as one dot with swapped operands: transpose(dot(A,B,l,r)) -> dot(B,A,r,l)
    return [
        rewrite(Tensor.transpose(dot(A, B, 0, l, r, c), T2)).to(
            dot(B, A, 0, r, l, c), rank(A, 2), rank(B, 2)
        ),
        rewrite(Tensor.transpose(dot(A, B, 1, l, r, c), T3)).to(
            dot(B, A, 1, r, l, c), rank(A, 3), rank(B, 3)
        ),
    ]


def _transpose_in():
    # Aᵀ·B -> A·B over the other axis of A (and of B): transposes folded into dimension numbers
    return [
        rewrite(dot(Tensor.transpose(A, T2), B, 0, l, r, c)).to(dot(A, B, 0, 1 - l, r, c), rank(A, 2)),
        rewrite(dot(A, Tensor.transpose(B, T2), 0, l, r, c)).to(dot(A, B, 0, l, 1 - r, c), rank(B, 2)),
        rewrite(dot(Tensor.transpose(A, T3), B, 1, l, r, c)).to(dot(A, B, 1, 3 - l, r, c), rank(A, 3)),
        rewrite(dot(A, Tensor.transpose(B, T3), 1, l, r, c)).to(dot(A, B, 1, l, 3 - r, c), rank(B, 3)),
    ]


def _transpose_transpose():
    # (Xᵀ)ᵀ -> X; transpose(transpose(X, p), q) -> transpose(X, p∘q); transpose(X, id) -> X
    p, qq = V.perm, V.dims
    composed = Vec[i64](p[qq[0]], p[qq[1]], p[qq[2]])
    return [
        rewrite(Tensor.transpose(Tensor.transpose(X, T2), T2)).to(X),
        rule(
            eq(x).to(Tensor.transpose(Tensor.transpose(X, p), qq)),
            eq(p.length()).to(i64(3)),
            eq(qq.length()).to(i64(3)),
            eq(so).to(composed),
        ).then(union(x).with_(Tensor.transpose(X, so))),
        rewrite(Tensor.transpose(X, Vec[i64](i64(0), i64(1), i64(2)))).to(X),
        rewrite(Tensor.transpose(X, Vec[i64](i64(0), i64(1)))).to(X),
    ]


def _transpose_out_example(rng, dt):
    import jax.numpy as jnp

    m, k, n = sizes(rng, 3)
    b = sizes(rng, 1, 2, 4)[0]
    return (lambda a, b_, x3, y3: ((a @ b_).T, jnp.swapaxes(x3 @ y3, 1, 2))), _mats(
        rng, dt, (m, k), (k, n), (b, m, k), (b, k, n)
    )


def _transpose_in_example(rng, dt):
    import jax.numpy as jnp

    m, k, n = sizes(rng, 3)
    return (lambda a, b_, e, x3: (a.T @ b_, b_ @ e.T, jnp.swapaxes(x3, 1, 2) @ x3)), _mats(
        rng, dt, (k, m), (k, n), (m, n), (2, k, m)
    )


def _transpose_transpose_example(rng, dt):
    import jax.numpy as jnp

    m, n = sizes(rng, 2)
    return (lambda a, x3: (a.T.T + 1, jnp.transpose(jnp.transpose(x3, (1, 2, 0)), (2, 0, 1)))), _mats(
        rng, dt, (m, n), (2, m, n)
    )


_reg(
    "transpose_out",
    "(A@B)ᵀ -> Bᵀ@Aᵀ (one dot, operands swapped)",
    True,
    _transpose_out,
    "2-D operands, or 3-D with one batch axis",
    _transpose_out_example,
)
_reg(
    "transpose_in",
    "Aᵀ@B -> dot over A's other axis",
    True,
    _transpose_in,
    "transposed operand 2-D (or 3-D batched, last two axes swapped)",
    _transpose_in_example,
)
_reg(
    "transpose_transpose",
    "(Xᵀ)ᵀ -> X, transposes compose",
    True,
    _transpose_transpose,
    "rank 2 or 3",
    _transpose_transpose_example,
)


# --- zeros and identities ------------------------------------------------------------------------


def _zero():
    # A@0 -> 0;  0@B -> 0   (inf·0 = NaN: exact only over the reals)
    out = []
    for lhs in (dot(A, Z, nb, l, r, c), dot(Z, A, nb, l, r, c)):
        zero = Tensor.broadcast_in_dim(Tensor.scalar(0, 1, d), so, Vec[i64].empty())
        out.append(
            rule(eq(x).to(lhs), eq(fill_(Z)).to(0.0), eq(so).to(shape(x)), *same_dtype(A, Z, x)).then(
                union(x).with_(zero)
            )
        )
    return out


def _identity():
    # I@A -> A;  A@I -> A   [I built in the program, e.g. jnp.eye; A's contracted axis outermost
    # (left) or last (right) so the output keeps A's axis order]
    out = []
    for e_ax in (0, 1):
        lhs = dot(E, A, 0, e_ax, 0, c)
        out.append(rule(eq(x).to(lhs), is_eye(E), *same_dtype(E, A, x)).then(union(x).with_(A)))
        lhs = dot(A, E, 0, l, e_ax, c)
        out.append(rule(eq(x).to(lhs), is_eye(E), _last(A, l), *same_dtype(E, A, x)).then(union(x).with_(A)))
    return out


def _zero_example(rng, dt):
    import jax.numpy as jnp

    m, k, n = sizes(rng, 3)
    return (lambda a, b: (a @ jnp.zeros((k, n), a.dtype) + b, jnp.zeros((n, m), a.dtype) @ a)), _mats(
        rng, dt, (m, k), (m, n)
    )


def _identity_example(rng, dt):
    import jax.numpy as jnp

    m, k = sizes(rng, 2)
    return (lambda a: jnp.eye(m, dtype=a.dtype) @ a + a @ jnp.eye(k, dtype=a.dtype)), _mats(rng, dt, (m, k))


_reg(
    "zero",
    "A@0 -> 0, 0@B -> 0",
    False,
    _zero,
    "0 a broadcast literal; one dtype (inf·0 is NaN)",
    _zero_example,
)
_reg(
    "identity",
    "I@A -> A, A@I -> A",
    False,
    _identity,
    "I an identity built in the program (iota == iota); one dtype (inf·0 is NaN)",
    _identity_example,
)

__all__: list[str] = []

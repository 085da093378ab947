"""Batching: independent dots of equal shapes become one batched dot on stacked operands, and back.

`batch.stack_dots` reads the equal-shape groups the analysis computes (terms.py:
`bfirst`/`bnext`: original unbatched dots of one level whose operands have the same shapes and
whose results may be used separately, such as per-head projections of separate inputs or small
experts); like the shared-operand merges it grows one run per group. When the program itself
stacks the results, `batch.expand_dot` and `batch.concat_batched` reach the same batched dot
without the multi-pattern. The way back composes `reduce.slice_dot` (a batch slice of a dot is a
dot of slices) with `batch.squeeze_batch` and `batch.squeeze_expand`.

All rules move data only: exact in floating point and in integer arithmetic.
"""

from __future__ import annotations

from egglog import Vec, eq, function, i64, rewrite, rule, set_, union, vars_

from ..terms import Tensor, bfirst, bnext, level, order, shape
from . import Rule, register_rule
from ._util import RING, V, rand, rank, same_dtype, sizes

A, B, C, D, M, X, Y = V.A, V.B, V.C, V.D, V.M, V.X, V.Y
x, y, w = V.x, V.y, V.w
l, r, c, n, o, p, lv = V.l, V.r, V.c, V.n, V.o, V.p, V.lv
sa, sb, sc, so = V.sa, V.sb, V.sc, V.so
dot, concat, slice_, squeeze = Tensor.dot, Tensor.concat, Tensor.slice, Tensor.squeeze


@function(merge=lambda old, new: old)
def brun(t: Tensor) -> i64:
    """Order of the last original dot folded into batched dot t."""


def _reg(name, identity, build, conditions, example, late=False):
    register_rule(Rule(f"batch.{name}", "batch", identity, True, build, conditions, example, RING, late=late))


def _lead(t, s, rk):
    """t (of shape s and rank rk) with a leading unit axis."""
    return Tensor.broadcast_in_dim(t, Vec[i64](i64(1)).append(s), Vec[i64](*[i64(i + 1) for i in range(rk)]))


def _stacked_as(t, s, rk):
    """Conditions: t has rank rk + 1 and its trailing axes are those of shape s (a stack of
    operands of shape s). An e-class can hold dots of other operand shapes with equal results
    ([3]@[3,1] and [1]@[1,1] are both [1]): a rule must bind the node it stacks by shape."""
    return [eq(shape(t).length()).to(i64(rk + 1)), *(eq(shape(t)[i + 1]).to(s[i]) for i in range(rk))]


def _index(t, i):
    return squeeze(slice_(t, 0, i, i + 1), 0)


# --- independent dots -> one batched dot ---------------------------------------------------------


def _stack_dots():
    # A1@B1, A2@B2, ... (one level, equal shapes) -> [A1;A2;..] @b [B1;B2;..], indexed per dot
    out = []
    for ra in (1, 2):
        for rb in (1, 2):
            shapes = (eq(sa).to(shape(A)), eq(sb).to(shape(B)), rank(A, ra), rank(B, rb))
            x1, y1 = dot(A, B, 0, l, r, c), dot(C, D, 0, l, r, c)
            sa_, sb_ = _lead(A, sa, ra), _lead(B, sb, rb)
            big = dot(concat(sa_, _lead(C, sa, ra), 0), concat(sb_, _lead(D, sb, rb), 0), 1, l + 1, r + 1, c)
            out.append(
                rule(
                    eq(x).to(x1),
                    eq(y).to(y1),
                    *shapes,
                    eq(shape(C)).to(sa),  # the node of y's class with the group's operand shapes
                    eq(shape(D)).to(sb),
                    eq(o).to(order(x)),
                    eq(lv).to(level(x)),
                    eq(bfirst(sa, sb, l, r, c, lv)).to(o),
                    eq(p).to(order(y)),
                    eq(bnext(x)).to(p),
                    *same_dtype(A, B, C, D, x, y),
                ).then(union(x).with_(_index(big, 0)), union(y).with_(_index(big, 1)), set_(brun(big)).to(p))
            )
            # grow a run: M = [..] @b [..] of n dots; the group's next dot joins it
            big = dot(concat(X, sa_, 0), concat(Y, sb_, 0), 1, l + 1, r + 1, c)
            out.append(
                rule(
                    eq(M).to(dot(X, Y, 1, V.i, V.j, c)),
                    eq(o).to(brun(M)),
                    eq(order(w)).to(o),
                    eq(p).to(bnext(w)),
                    eq(y).to(dot(A, B, 0, l, r, c)),
                    eq(order(y)).to(p),
                    eq(V.i).to(l + 1),
                    eq(V.j).to(r + 1),
                    *shapes,
                    *_stacked_as(X, sa, ra),
                    *_stacked_as(Y, sb, rb),
                    eq(n).to(shape(M)[0]),
                    *same_dtype(A, B, X, Y, y),
                ).then(
                    union(M).with_(slice_(big, 0, 0, n)),
                    union(y).with_(_index(big, n)),
                    set_(brun(big)).to(p),
                )
            )
    return out


def _experts_example(rng, dt):
    m_, k_, n_ = sizes(rng, 3, 2, 17)
    xs = [rand(rng, (m_, k_), dt) for _ in range(3)]
    ws = [rand(rng, (k_, n_), dt) for _ in range(3)]
    return (lambda *a: (a[0] @ a[3], (a[1] @ a[4]) * 2, a[2] @ a[5] + 1)), (*xs, *ws)


_reg(
    "stack_dots",
    "A1@B1, A2@B2, ... -> slices of [A1;A2;..] @batch [B1;B2;..]",
    _stack_dots,
    "unbatched dots of one level with equal operand shapes (rank <= 2), same cfg, one dtype",
    _experts_example,
)


# --- stacked results -----------------------------------------------------------------------------


def _expand_dot():
    # expand0(A@B) -> expand0(A) @batch expand0(B)   (a leading unit axis becomes a batch axis)
    out = []
    for ra in (1, 2):
        for rb in (1, 2):
            prod = dot(A, B, 0, l, r, c)
            conds = (eq(sa).to(shape(A)), eq(sb).to(shape(B)), rank(A, ra), rank(B, rb), eq(sc).to(shape(x)))
            dims = Vec[i64](*[i64(i + 1) for i in range(ra + rb - 2)])
            lhs = Tensor.broadcast_in_dim(prod, so, dims)
            out.append(
                rule(
                    eq(x).to(lhs),
                    *conds,
                    eq(so).to(Vec[i64](i64(1)).append(shape(prod))),
                    *same_dtype(A, B, prod),
                ).then(union(x).with_(dot(_lead(A, sa, ra), _lead(B, sb, rb), 1, l + 1, r + 1, c)))
            )
    return out


def _concat_batched():
    # [A1 @b B1 ; A2 @b B2 ; ..] -> [A1;A2;..] @b [B1;B2;..]   (along the leading batch axis; chains
    # of 2..4 links at once)
    as_ = list(vars_("a0 a1 a2 a3", Tensor))
    bs = list(vars_("b0 b1 b2 b3", Tensor))
    out = []
    for links in range(2, 5):
        parts = [dot(a, b, V.nb, l, r, c) for a, b in zip(as_[:links], bs[:links], strict=True)]
        lhs, left, right = parts[0], as_[0], bs[0]
        for part, a, b in zip(parts[1:], as_[1:links], bs[1:links], strict=True):
            lhs, left, right = concat(lhs, part, 0), concat(left, a, 0), concat(right, b, 0)
        conds = [V.nb >= 1]
        for a, b in zip(as_[1:links], bs[1:links], strict=True):
            conds += [
                eq(shape(a).remove(0)).to(shape(as_[0]).remove(0)),
                eq(shape(b).remove(0)).to(shape(bs[0]).remove(0)),
            ]
        conds += same_dtype(*as_[:links], *bs[:links], *parts)
        out.append(rewrite(lhs).to(dot(left, right, V.nb, l, r, c), *conds))
    return out


def _stacked_example(rng, dt):
    import jax.numpy as jnp

    m_, k_, n_ = sizes(rng, 3, 2, 17)
    xs = [rand(rng, (m_, k_), dt) for _ in range(3)]
    ws = [rand(rng, (k_, n_), dt) for _ in range(3)]
    return (lambda *a: jnp.concatenate([(a[i] @ a[3 + i])[None] for i in range(3)])), (*xs, *ws)


def _concat_batched_example(rng, dt):
    import jax.numpy as jnp

    b1, b2, m_, k_ = sizes(rng, 4, 2, 9)
    return (lambda a1, a2, w1, w2: jnp.concatenate([a1 @ w1, a2 @ w2], 0)), (
        rand(rng, (b1, m_, k_), dt),
        rand(rng, (b2, m_, k_), dt),
        rand(rng, (b1, k_, m_), dt),
        rand(rng, (b2, k_, m_), dt),
    )


_reg(
    "expand_dot",
    "expand0(A@B) -> expand0(A) @batch expand0(B)",
    _expand_dot,
    "unbatched dot of operands of rank <= 2, one dtype",
    _stacked_example,
)
_reg(
    "concat_batched",
    "[A1@B1 ; A2@B2] (batch axis) -> [A1;A2] @ [B1;B2]",
    _concat_batched,
    "batched dots of one form, concatenated along the leading batch axis; one dtype",
    _concat_batched_example,
)


# --- row blocks of one array -------------------------------------------------------------------


def _index_rows():
    # X[t] @ B (X of shape [n, m, k]) -> rows t*m:(t+1)*m of reshape(X, [n*m, k]) @ B: every index
    # of X multiplied by the same B is a row block of one product, which the extractor's sharing
    # pass computes once (as the hand-written NasRNN multiplies all steps' inputs in one GEMM)
    A = squeeze(slice_(X, 0, V.i, V.j), 0)
    flat = Tensor.reshape(X, Vec[i64](n * V.m, V.k))
    conds = (
        eq(V.so).to(shape(X)),
        eq(V.so.length()).to(i64(3)),
        eq(n).to(V.so[0]),
        eq(V.m).to(V.so[1]),
        eq(V.k).to(V.so[2]),
        eq(V.j).to(V.i + 1),
        rank(B, 2),
        *same_dtype(X, B),
    )
    return [
        rewrite(dot(A, B, 0, 1, r, c)).to(slice_(dot(flat, B, 0, 1, r, c), 0, V.i * V.m, V.j * V.m), *conds)
    ]


def _index_rows_example(rng, dt):
    n_, m_, k_, o_ = sizes(rng, 4, 1, 17)
    n_ = max(n_, 3)

    def f(xs, w, v):
        return xs[0] @ w, (xs[2] @ w) * 2, xs[1] @ v.T + 1

    return f, (rand(rng, (n_, m_, k_), dt), rand(rng, (k_, o_), dt), rand(rng, (o_, k_), dt))


_reg(
    "index_rows",
    "X[t] @ B -> (reshape(X, [n*m, k]) @ B)[t*m:(t+1)*m]",
    _index_rows,
    "X of rank 3 indexed on its first axis, B of rank 2, A's contracting axis last; one dtype",
    _index_rows_example,
    late=True,  # its row blocks, fed back to slice_dot and the merges, grow the e-graph 15x on NasRNN
)


# --- the way back --------------------------------------------------------------------------------


def _squeeze_batch():
    # squeeze0(A @b B) with one batch -> squeeze0(A) @ squeeze0(B)
    prod = dot(A, B, 1, l, r, c)
    conds = (eq(shape(A)[0]).to(i64(1)), *same_dtype(A, B, prod))
    return [rewrite(squeeze(prod, 0)).to(dot(squeeze(A, 0), squeeze(B, 0), 0, l - 1, r - 1, c), *conds)]


def _squeeze_expand():
    # squeeze(expand(a, ax), ax) -> a   (a broadcast that only inserts that unit axis)
    out = []
    for rk in range(4):
        for ax in range(rk + 1):
            dims = Vec[i64](*[i64(i if i < ax else i + 1) for i in range(rk)])
            conds = (eq(sa).to(shape(A)), rank(A, rk), eq(so.length()).to(i64(rk + 1)), eq(so[ax]).to(i64(1)))
            out.append(
                rule(
                    eq(x).to(squeeze(Tensor.broadcast_in_dim(A, so, dims), ax)),
                    *conds,
                    eq(sa).to(so.remove(ax)),
                ).then(union(x).with_(A))
            )
    return out


def _expand_squeeze():
    # expand(squeeze(Y, ax), ax) -> Y   (the unit axis put back where it was)
    out = []
    for rk in range(4):
        for ax in range(rk + 1):
            dims = Vec[i64](*[i64(i if i < ax else i + 1) for i in range(rk)])
            conds = (eq(sa).to(shape(Y)), eq(sa.length()).to(i64(rk + 1)))
            lhs = Tensor.broadcast_in_dim(squeeze(Y, ax), sa, dims)
            out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(Y)))
    return out


def _expand_squeeze_example(rng, dt):
    import jax.numpy as jnp

    b_, m_ = sizes(rng, 2, 2, 17)
    return (lambda y: (jnp.expand_dims(y[1], 0) * 2, y[:, 0][:, None] + 1)), (rand(rng, (b_, m_), dt),)


def _squeeze_batch_example(rng, dt):
    from jax import lax

    m_, k_, n_ = sizes(rng, 3, 2, 17)

    def f(a, b):
        return lax.squeeze(lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), (0,))

    return f, (rand(rng, (1, m_, k_), dt), rand(rng, (1, k_, n_), dt))


def _squeeze_expand_example(rng, dt):
    from jax import lax

    m_, n_ = sizes(rng, 2, 2, 17)
    return (lambda a: (lax.squeeze(a[None], (0,)) * 2, lax.squeeze(a[:, None], (1,)))), (
        rand(rng, (m_, n_), dt),
    )


_reg(
    "squeeze_batch",
    "squeeze0(A @batch B) -> squeeze0(A) @ squeeze0(B)",
    _squeeze_batch,
    "one batch axis of size 1; one dtype",
    _squeeze_batch_example,
)
_reg(
    "expand_squeeze",
    "expand(squeeze(Y, ax), ax) -> Y",
    _expand_squeeze,
    "rank <= 4",
    _expand_squeeze_example,
)
_reg(
    "squeeze_expand",
    "squeeze(expand(a, ax), ax) -> a",
    _squeeze_expand,
    "the broadcast only inserts the squeezed unit axis (rank <= 3)",
    _squeeze_expand_example,
)

__all__ = ["brun"]

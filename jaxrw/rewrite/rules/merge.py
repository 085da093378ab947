"""Shared operands and concatenation: dots that share an operand become one dot on a concatenation.

The multi-dot merges (`merge.shared_left`, `merge.shared_right`, Tensat's "multi-patterns") read
the groups the analysis computes (terms.py: `lfirst`/`lnext`): the original dots of one level
that share an operand, ordered by their position in the program. A merge starts at the first
member and grows one member at a time, so a group of k dots yields k-1 merged dots (each prefix)
instead of one per subset or ordering; the extractor picks how many to take. Dots of one level
cannot depend on each other, so a merge never feeds its own operand. The concatenation moves
(slice of concat, concat of slices, concat through elementwise ops, stack as concat) keep the
slices that merges leave cheap and let them cancel.

All rules here move data only: exact in floating point (a merged GEMM computes the same dot
products) and in integer arithmetic.
"""

from __future__ import annotations

from egglog import Vec, eq, function, i64, ne, rewrite, rule, set_, union, vars_

from ..terms import Tensor, level, lfirst, lnext, order, rfirst, rnext, shape
from . import Rule, register_rule
from ._util import RING, V, rand, rank, same_dtype, sizes

A, B, C, D, K, M, X, Y = V.A, V.B, V.C, V.D, V.K, V.M, V.X, V.Y
x, y, w = V.x, V.y, V.w
nb, l, r, c, ax, s0, s1 = V.nb, V.l, V.r, V.c, V.ax, V.s0, V.s1
n, m, k, o, p, lv = V.n, V.m, V.k, V.o, V.p, V.lv
sa, so = V.sa, V.so
dot, concat, slice_ = Tensor.dot, Tensor.concat, Tensor.slice


@function(merge=lambda old, new: old)
def lrun(t: Tensor) -> i64:
    """Order of the last original dot folded into merged dot t (left-shared run)."""


@function(merge=lambda old, new: old)
def rrun(t: Tensor) -> i64:
    """Order of the last original dot folded into merged dot t (right-shared run)."""


def _reg(name, identity, build, conditions, example, exact=True):
    register_rule(Rule(f"merge.{name}", "merge", identity, exact, build, conditions, example, RING))


def _one_free(t):
    return eq(shape(t).length()).to(nb + 2)


def _free_size(t, var, axis):
    return eq(var).to(shape(t)[axis])


# --- multi-dot merges -----------------------------------------------------------------------------


def _shared(side: str):
    # A@B, A@C, ... (one level, A shared) -> A@[B|C|...] sliced;  likewise B@A, C@A -> [B;C]@A
    left = side == "left"
    first_, next_, run_ = (lfirst, lnext, lrun) if left else (rfirst, rnext, rrun)

    def mk(u, v):
        return dot(u, v, nb, l, r, c) if left else dot(v, u, nb, l, r, c)

    fb = 2 * nb + 1 - r if left else 2 * nb + 1 - l  # the free axis of the non-shared operand
    out_axis = (eq(k).to(shape(A).length() - 1),) if left else (eq(k).to(nb),)
    start = rule(
        eq(x).to(mk(A, B)),
        eq(y).to(mk(A, C)),
        eq(o).to(order(x)),
        eq(lv).to(level(x)),
        eq(first_(A, nb, l, r, c, lv)).to(o),
        eq(p).to(order(y)),
        eq(next_(x)).to(p),
        _one_free(B),
        _one_free(C),
        _free_size(B, n, fb),
        _free_size(C, m, fb),
        *out_axis,
        *same_dtype(A, B, C, x, y),
    ).then(
        union(x).with_(slice_(mk(A, concat(B, C, fb)), k, 0, n)),
        union(y).with_(slice_(mk(A, concat(B, C, fb)), k, n, n + m)),
        set_(run_(mk(A, concat(B, C, fb)))).to(p),
    )
    grow = rule(
        eq(M).to(mk(A, K)),
        eq(o).to(run_(M)),
        eq(order(w)).to(o),
        eq(p).to(next_(w)),
        eq(y).to(mk(A, D)),
        eq(order(y)).to(p),
        _one_free(D),
        _free_size(K, n, fb),
        _free_size(D, m, fb),
        *out_axis,
        *same_dtype(A, K, D, y),
    ).then(
        union(M).with_(slice_(mk(A, concat(K, D, fb)), k, 0, n)),
        union(y).with_(slice_(mk(A, concat(K, D, fb)), k, n, n + m)),
        set_(run_(mk(A, concat(K, D, fb)))).to(p),
    )
    return [start, grow]


def _qkv_example(rng, dt):
    s_, d_ = sizes(rng, 2)
    w1, w2, w3 = (rand(rng, (d_, h), dt) for h in sizes(rng, 3))
    return (lambda x_, a, b, c_: (x_ @ a, x_ @ b, (x_ @ c_) * 2)), (rand(rng, (s_, d_), dt), w1, w2, w3)


def _shared_right_example(rng, dt):
    k_, n_ = sizes(rng, 2)
    w_ = rand(rng, (k_, n_), dt)
    xs = [rand(rng, (h, k_), dt) for h in sizes(rng, 3)]
    return (lambda w0, a, b, c_: (a @ w0, b @ w0 + 1, c_ @ w0)), (w_, *xs)


_reg(
    "shared_left",
    "A@B, A@C, ... -> slices of A@[B|C|...]",
    lambda: _shared("left"),
    "dots of one level sharing their left operand; B, C with one free axis; one dtype",
    _qkv_example,
)
_reg(
    "shared_right",
    "B@A, C@A, ... -> slices of [B;C;...]@A",
    lambda: _shared("right"),
    "dots of one level sharing their right operand; B, C with one free axis; one dtype",
    _shared_right_example,
)


# --- concatenations of dots ----------------------------------------------------------------------


# a chain of concatenated dots merges up to this many links per iteration. 3, not 4: the 4-link
# windows added nothing the 2- and 3-link ones do not reach (the same e-graph, and the same 98
# decisions and predictions of the bench cases, bench/results/cpu-2026-12-05-concat-chunk-*.json)
# while NasRNN's saturation spent 2.6x the time matching them; 2 links leave stacked_matvec_16's
# 16-dot chain unmerged in 12 iterations
CONCAT_CHUNK = 3


def _concat_dots():
    # [A@B | A@C | ..] -> A@[B|C|..]  (along B's free axis);  [B@A ; C@A ; ..] -> [B;C;..]@A
    # (left-nested chains of 2..CONCAT_CHUNK links at once, so long chains merge in few iterations)
    bs = list(vars_(" ".join(f"b{i}" for i in range(CONCAT_CHUNK)), Tensor))
    out = []
    for left in (True, False):
        fb = 2 * nb + 1 - r if left else 2 * nb + 1 - l
        out_axis = eq(ax).to(shape(A).length() - 1) if left else eq(ax).to(nb)
        for links in range(2, CONCAT_CHUNK + 1):
            parts = [dot(A, b, nb, l, r, c) if left else dot(b, A, nb, l, r, c) for b in bs[:links]]
            lhs, operands = parts[0], bs[0]
            for part, b in zip(parts[1:], bs[1:links], strict=True):
                lhs, operands = concat(lhs, part, ax), concat(operands, b, fb)
            rhs = dot(A, operands, nb, l, r, c) if left else dot(operands, A, nb, l, r, c)
            conds = [*(_one_free(b) for b in bs[:links]), out_axis, *same_dtype(A, *bs[:links], *parts)]
            out.append(rewrite(lhs).to(rhs, *conds))
    return out


def _split_dot():
    # A@[B|C] -> [A@B | A@C];  [B;C]@A -> [B@A ; C@A]   (the reverse: no per-call concatenation)
    out = []
    lhs = dot(A, concat(B, C, ax), nb, l, r, c)
    conds = [_one_free(B), eq(ax).to(2 * nb + 1 - r), eq(k).to(shape(A).length() - 1), *same_dtype(A, B, C)]
    out.append(
        rule(eq(x).to(lhs), *conds).then(
            union(x).with_(concat(dot(A, B, nb, l, r, c), dot(A, C, nb, l, r, c), k))
        )
    )
    lhs = dot(concat(B, C, ax), A, nb, l, r, c)
    conds = [_one_free(B), eq(ax).to(2 * nb + 1 - l), *same_dtype(A, B, C)]
    out.append(rewrite(lhs).to(concat(dot(B, A, nb, l, r, c), dot(C, A, nb, l, r, c), nb), *conds))
    return out


def _expand_dot():
    # A·v with a unit axis added = A·(v as a column) (or as a row): stacks of matrix-vector
    # products become concatenations of dots, which merge.concat_dots joins into one GEMM.
    e0, e1 = Vec[i64](i64(0)), Vec[i64](i64(1))
    out = []
    mv = dot(A, B, 0, l, 0, c)  # A (rank 2) · v (rank 1) -> [n]
    conds = [rank(A, 2), rank(B, 1), eq(n).to(shape(B)[0]), *same_dtype(A, B, mv)]
    col = Tensor.broadcast_in_dim(B, Vec[i64](n, i64(1)), e0)
    row = Tensor.broadcast_in_dim(B, Vec[i64](i64(1), n), e1)
    out.append(
        rule(
            eq(x).to(Tensor.broadcast_in_dim(mv, so, e0)),
            eq(so.length()).to(i64(2)),
            eq(so[1]).to(i64(1)),
            eq(so[0]).to(shape(mv)[0]),  # not a size-1 A·v broadcast along that axis
            *conds,
        ).then(union(x).with_(dot(A, col, 0, l, 0, c)))
    )
    out.append(
        rule(
            eq(x).to(Tensor.broadcast_in_dim(mv, so, e1)),
            eq(so.length()).to(i64(2)),
            eq(so[0]).to(i64(1)),
            eq(so[1]).to(shape(mv)[0]),
            *conds,
        ).then(union(x).with_(dot(row, A, 0, 1, l, c)))
    )
    return out


def _concat_dots_example(rng, dt):
    import jax.numpy as jnp

    m_, k_ = sizes(rng, 2)
    a = rand(rng, (m_, k_), dt)
    bs = [rand(rng, (k_, h), dt) for h in sizes(rng, 3, 2, 9)]
    cs = [rand(rng, (h, m_), dt) for h in sizes(rng, 2, 2, 9)]
    return (
        lambda a_, b1, b2, b3, c1, c2: (
            jnp.concatenate([a_ @ b1, a_ @ b2, a_ @ b3], axis=1),
            jnp.concatenate([c1 @ a_, c2 @ a_], axis=0),
        )
    ), (a, *bs, *cs)


def _split_dot_example(rng, dt):
    import jax.numpy as jnp

    m_, k_, n1, n2 = sizes(rng, 4)
    a = rand(rng, (m_, k_), dt)
    return (lambda a_, b, c_: (a_ @ jnp.concatenate([b, c_], 1), jnp.concatenate([b.T, c_.T], 0) @ a_.T)), (
        a,
        rand(rng, (k_, n1), dt),
        rand(rng, (k_, n2), dt),
    )


def _expand_dot_example(rng, dt):
    import jax.numpy as jnp

    m_, k_ = sizes(rng, 2)
    a = rand(rng, (m_, k_), dt)
    vs = [rand(rng, (k_,), dt) for _ in range(3)]
    return (lambda a_, *v: (a_ @ v[0])[:, None] + (a_ @ v[1])[None, :].T + jnp.expand_dims(a_ @ v[2], 1)), (
        a,
        *vs,
    )


_reg(
    "concat_dots",
    "[A@B | A@C] -> A@[B|C], [B@A ; C@A] -> [B;C]@A",
    _concat_dots,
    "concatenation along the non-shared operand's only free axis; one dtype",
    _concat_dots_example,
)
_reg(
    "split_dot",
    "A@[B|C] -> [A@B | A@C], [B;C]@A -> [B@A ; C@A]",
    _split_dot,
    "concatenation along the operand's only free axis; one dtype",
    _split_dot_example,
)
_reg(
    "expand_dot",
    "expand(A@v) -> A@(v as a column or row)",
    _expand_dot,
    "A 2-D, v 1-D, one unit axis added; one dtype",
    _expand_dot_example,
)


# --- slices and concatenations ------------------------------------------------------------------


def _slice_concat():
    # [X|Y][a:b] -> X, Y, X[a:b] or Y[a-|X|:b-|X|] when the slice falls in one part;
    # a slice along another axis moves into both parts
    out = []
    cat = concat(X, Y, ax)
    in_x = (eq(n).to(shape(X)[ax]),)
    out.append(
        rule(eq(x).to(slice_(cat, ax, s0, s1)), *in_x, s1 <= n).then(union(x).with_(slice_(X, ax, s0, s1)))
    )
    out.append(
        rule(eq(x).to(slice_(cat, ax, s0, s1)), *in_x, s0 >= n).then(
            union(x).with_(slice_(Y, ax, s0 - n, s1 - n))
        )
    )
    other = slice_(concat(X, Y, k), ax, s0, s1)
    out.append(
        rule(eq(x).to(other), ne(k).to(ax)).then(
            union(x).with_(concat(slice_(X, ax, s0, s1), slice_(Y, ax, s0, s1), k))
        )
    )
    return out


def _slice_slice():
    # X[a:b][c:d] -> X[a+c:a+d];  X[0:n] -> X  (n the full size)
    return [
        rewrite(slice_(slice_(X, ax, s0, s1), ax, V.i, V.j)).to(slice_(X, ax, s0 + V.i, s0 + V.j)),
        rule(eq(x).to(slice_(X, ax, 0, n)), eq(n).to(shape(X)[ax])).then(union(x).with_(X)),
    ]


def _concat_slices():
    # [X[a:b] | X[b:c]] -> X[a:c]
    return [rewrite(concat(slice_(X, ax, s0, s1), slice_(X, ax, s1, V.j), ax)).to(slice_(X, ax, s0, V.j))]


def _slice_split():
    # X[a:b, c:d, ..] -> X[a:b][:, c:d]..   (one single-axis slice per axis; full ones then vanish)
    st, lim = V.sa, V.sb
    out = []
    for rk in (2, 3, 4):
        bounds = list(vars_(" ".join(f"s{i} e{i}" for i in range(rk)), i64))
        conds = [eq(st.length()).to(i64(rk))]
        nested = X
        for i in range(rk):
            conds += [eq(bounds[2 * i]).to(st[i]), eq(bounds[2 * i + 1]).to(lim[i])]
            nested = slice_(nested, i, bounds[2 * i], bounds[2 * i + 1])
        out.append(rule(eq(x).to(Tensor.slice_nd(X, st, lim)), *conds).then(union(x).with_(nested)))
    return out


def _slice_split_example(rng, dt):
    n_, m_ = sizes(rng, 2, 5, 33)
    return (lambda u, w: ((u @ w)[1, 3], u[1:4, 2:5] * 2)), (rand(rng, (n_, m_), dt), rand(rng, (m_, n_), dt))


def _slice_concat_example(rng, dt):
    import jax.numpy as jnp

    a_, b_ = sizes(rng, 2, 3, 9)
    n_ = sizes(rng, 1, 2, 6)[0]

    def f(u, v):
        cat = jnp.concatenate([u, v], axis=0)
        return cat[:a_], cat[a_ + 1 : a_ + b_], cat[1:3], cat[:, 1:3]

    return f, (rand(rng, (a_, n_ + 3), dt), rand(rng, (b_, n_ + 3), dt))


def _slice_slice_example(rng, dt):
    n_ = sizes(rng, 1, 8, 20)[0]
    return (lambda u: (u[2:n_][1:4] * 2, u[0:n_] + 1)), (rand(rng, (n_, 3), dt),)


def _concat_slices_example(rng, dt):
    import jax.numpy as jnp

    n_ = sizes(rng, 1, 8, 20)[0]
    return (lambda u: jnp.concatenate([u[1:4], u[4:n_]], 0) * 2), (rand(rng, (n_, 3), dt),)


_reg(
    "slice_split",
    "X[a:b, c:d] -> X[a:b][:, c:d]",
    _slice_split,
    "unit strides; rank 2-4",
    _slice_split_example,
)
_reg(
    "slice_concat",
    "[X|Y][a:b] -> X, Y or a slice of one part",
    _slice_concat,
    "the slice lies in one part, or is along another axis",
    _slice_concat_example,
)
_reg(
    "slice_slice",
    "X[a:b][c:d] -> X[a+c:a+d], X[0:n] -> X",
    _slice_slice,
    "unit strides",
    _slice_slice_example,
)
_reg(
    "concat_slices",
    "[X[a:b] | X[b:c]] -> X[a:c]",
    _concat_slices,
    "adjacent slices, one axis",
    _concat_slices_example,
)


# --- concatenation through elementwise ops and stacks ---------------------------------------------


def _concat_elementwise():
    # [f(a1,b1) | f(a2,b2)] -> f([a1|a2], [b1|b2]);  [u(a1) | u(a2)] -> u([a1|a2])   (no broadcasting)
    a1, b1, a2, b2 = V.A, V.B, V.C, V.D
    out = []
    same = [eq(shape(a1)).to(shape(b1)), eq(shape(a2)).to(shape(b2))]
    for f in (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div):
        out.append(
            rewrite(concat(f(a1, b1), f(a2, b2), ax)).to(f(concat(a1, a2, ax), concat(b1, b2, ax)), *same)
        )
    for name in ("max", "min"):
        f = Tensor.binary(name, a1, b1)
        g = Tensor.binary(name, a2, b2)
        rhs = Tensor.binary(name, concat(a1, a2, ax), concat(b1, b2, ax))
        out.append(rewrite(concat(f, g, ax)).to(rhs, *same))
    out.append(
        rewrite(concat(Tensor.unary(V.d, a1), Tensor.unary(V.d, a2), ax)).to(
            Tensor.unary(V.d, concat(a1, a2, ax))
        )
    )
    out.append(rewrite(concat(Tensor.neg(a1), Tensor.neg(a2), ax)).to(Tensor.neg(concat(a1, a2, ax))))
    return out


STACK_CHUNK = 8  # operands a stack sheds per iteration (so a stack of n unfolds in n/8 iterations)


def _stack_unfold():
    # stack([a1..an], ax) -> [a1' | a2' | .. | an'] with ai' = expand(ai, ax), up to 8 operands at a
    # time: stack([a1..an]) -> [stack([a1..an-8]) | an-7' | .. | an']
    args, ax_ = V.args, V.ax
    parts = list(vars_(" ".join(f"p{i}" for i in range(STACK_CHUNK)), Tensor))
    dd = V.dims
    # (axis pattern, conditions binding so and dd: the expanded shape and broadcast dims)
    variants = [
        (0, (eq(so).to(Vec[i64](i64(1)).append(sa)), eq(dd).to((sa.length() + 1).range().remove(0)))),
        (ax_, (eq(ax_).to(sa.length()), eq(so).to(sa.push(1)), eq(dd).to(sa.length().range()))),
        (
            1,
            (
                eq(sa.length()).to(i64(2)),
                eq(so).to(Vec[i64](sa[0], i64(1), sa[1])),
                eq(dd).to(Vec[i64](i64(0), i64(2))),
            ),
        ),
    ]
    out = []
    for axis, shape_conds in variants:
        first = (eq(x).to(Tensor.stack(args, axis)), eq(sa).to(shape(args[0])), *shape_conds)

        def chain(head, tail, axis=axis):
            for t in tail:
                head = (
                    Tensor.concat(head, Tensor.broadcast_in_dim(t, so, dd), axis)
                    if head is not None
                    else (Tensor.broadcast_in_dim(t, so, dd))
                )
            return head

        for count in range(1, STACK_CHUNK + 1):
            bind = [eq(parts[i]).to(args[i]) for i in range(count)]
            out.append(
                rule(*first, eq(args.length()).to(i64(count)), *bind).then(
                    union(x).with_(chain(None, parts[:count]))
                )
            )
        bind = [eq(parts[i]).to(args[n - STACK_CHUNK + i]) for i in range(STACK_CHUNK)]
        rest = args
        for _ in range(STACK_CHUNK):
            rest = rest.pop()
        out.append(
            rule(*first, eq(n).to(args.length()), n > STACK_CHUNK, *bind).then(
                union(x).with_(chain(Tensor.stack(rest, axis), parts))
            )
        )
    return out


def _concat_elementwise_example(rng, dt):
    import jax.numpy as jnp

    a_, b_, n_ = sizes(rng, 3, 2, 9)
    u1, u2 = rand(rng, (a_, n_), dt), rand(rng, (b_, n_), dt)
    v1, v2 = rand(rng, (a_, n_), dt), rand(rng, (b_, n_), dt)
    return (
        lambda p1, p2, q1, q2: (
            jnp.concatenate([p1 + q1, p2 + q2]),
            jnp.concatenate([jnp.maximum(p1, q1), jnp.maximum(p2, q2)]),
            jnp.concatenate([-p1, -p2]),
        )
    ), (u1, u2, v1, v2)


def _stack_example(rng, dt):
    import jax.numpy as jnp

    m_, n_ = sizes(rng, 2, 2, 9)
    xs = [rand(rng, (m_, n_), dt) for _ in range(3)]
    return (
        lambda a, b, c_: (jnp.stack([a, b, c_]), jnp.stack([a, b], axis=2), jnp.stack([a, c_], axis=1))
    ), tuple(xs)


_reg(
    "concat_elementwise",
    "[f(a1,b1) | f(a2,b2)] -> f([a1|a2], [b1|b2])",
    _concat_elementwise,
    "operands of each op one shape (no broadcasting)",
    _concat_elementwise_example,
)
_reg(
    "stack_unfold",
    "stack([a..z]) -> [stack([a..y]) | expand(z)]",
    _stack_unfold,
    "stack axis first, last, or 1 of matrices",
    _stack_example,
)

__all__ = ["lrun", "rrun"]

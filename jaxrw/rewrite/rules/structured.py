"""Structured operands: products with matrices the program builds from smaller data.

`jnp.diag(v) @ A` scales A's rows, `jnp.outer(u, w) @ A` is u times the vector wᵀA,
`jnp.kron(A, B) @ x` is two small products of a reshaped x, and a matrix whose rows (or columns)
are one broadcast vector gives a broadcast product. The rules that recognise the structure are
small and compose: a masked diagonal becomes a product with the identity (`select_eye`), scales
move out of products (`row_scale`, `col_scale`), broadcasts of broadcasts fold
(`bcast_compose`), no-op pads vanish (`pad_noop`); dot.identity then removes the identity.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rule, union

from ..terms import Tensor, is_eye, is_eye_mask, shape
from ..terms import fill as fill_
from . import Rule, register_rule
from ._util import RING, V, ints, rand, rank, same_dtype, sizes

A, B, M, X, Z, S = V.A, V.B, V.M, V.X, V.Z, V.S
x = V.x
l, r, c, n, m, k, p, q = V.l, V.r, V.c, V.n, V.m, V.k, V.p, V.q
sa, sb, so, dims, d = V.sa, V.sb, V.so, V.dims, V.d
dot, bcast, mul = Tensor.dot, Tensor.broadcast_in_dim, Tensor.mul


def _reg(name, identity, exact, build, conditions, example):
    register_rule(Rule(f"structured.{name}", "structured", identity, exact, build, conditions, example, RING))


def _out(t):
    return eq(so).to(shape(t))


# --- recognising structure ----------------------------------------------------------------------


def _select_eye():
    # where(I, X, 0) -> X ∘ I   (X inf/NaN off the diagonal would give NaN: real arithmetic only)
    sel = Tensor.select_n(M, Z, X)
    conds = (is_eye_mask(M), eq(fill_(Z)).to(0.0), eq(shape(X)).to(shape(M)), *same_dtype(X, x))
    return [rule(eq(x).to(sel), *conds).then(union(x).with_(mul(X, Tensor.convert_element_type(M, d))))]


def _pad_noop():
    # pad(a, v, all zeros) -> a
    out = []
    for rk in (1, 2, 3):
        zeros = ints(*([0] * (3 * rk)))
        out.append(rule(eq(x).to(Tensor.pad(A, Z, zeros)), rank(A, rk)).then(union(x).with_(A)))
    return out


def _bcast_compose():
    # broadcast(broadcast(a, s1, d1), s2, d2) -> broadcast(a, s2, d2∘d1);  broadcast(a, shape(a), id) -> a
    out = []
    inner = V.perm
    for rk in range(4):
        composed = Vec[i64](*[dims[inner[i]] for i in range(rk)])
        out.append(
            rule(
                eq(x).to(bcast(bcast(A, sa, inner), sb, dims)),
                eq(inner.length()).to(i64(rk)),
                eq(so).to(composed),
            ).then(union(x).with_(bcast(A, sb, so)))
        )
        out.append(
            rule(eq(x).to(bcast(A, sa, ints(*range(rk)))), eq(shape(A)).to(sa), rank(A, rk)).then(
                union(x).with_(A)
            )
        )
    return out


def _select_eye_example(rng, dt):
    import jax.numpy as jnp

    n_ = sizes(rng, 1)[0]
    return (lambda a: jnp.trace(a) + jnp.where(jnp.eye(n_, dtype=bool), a, 0).sum()), (
        rand(rng, (n_, n_), dt),
    )


def _pad_noop_example(rng, dt):
    from jax import lax

    n_ = sizes(rng, 1)[0]
    return (lambda a: lax.pad(a, jnp_zero(a), ((0, 0, 0), (0, 0, 0))) * 2), (rand(rng, (n_, 3), dt),)


def jnp_zero(a):
    import jax.numpy as jnp

    return jnp.zeros((), a.dtype)


def _bcast_compose_example(rng, dt):
    import jax.numpy as jnp

    n_, m_ = sizes(rng, 2)
    return (lambda v: (jnp.broadcast_to(v[:, None], (n_, m_)) * 2, jnp.broadcast_to(v, (n_,)) + 1)), (
        rand(rng, (n_,), dt),
    )


_reg(
    "select_eye",
    "where(I, X, 0) -> X ∘ I",
    False,
    _select_eye,
    "I an identity mask built in the program (iota == iota); one dtype (inf·0 off the diagonal is NaN)",
    _select_eye_example,
)
_reg(
    "pad_noop",
    "pad(a, v, 0) -> a",
    True,
    _pad_noop,
    "all padding amounts zero (rank <= 3)",
    _pad_noop_example,
)
_reg(
    "bcast_compose",
    "bcast(bcast(a)) -> bcast(a), bcast(a, shape(a), id) -> a",
    True,
    _bcast_compose,
    "operand rank <= 3",
    _bcast_compose_example,
)


# --- scales out of products ------------------------------------------------------------------------


def _row_scale():
    # (diag-scaled X)·B -> scale ∘ (X·B):  (v[:, None] ∘ X) @ B -> v[:, None] ∘ (X @ B)
    # (the scaled axis is X's free axis: rows when X is contracted on axis 1, columns on axis 0)
    out = []
    for lc, vdim in ((1, 0), (0, 1)):
        scale = bcast(S, sa, ints(vdim))
        for scaled in (mul(scale, X), mul(X, scale)):
            lhs = dot(scaled, B, 0, lc, r, c)
            conds = (
                rank(S, 1),
                rank(X, 2),
                eq(shape(X)[lc]).to(shape(B)[r]),
                _out(x),
                *same_dtype(S, X, B, x),
            )
            out.append(
                rule(eq(x).to(lhs), *conds).then(
                    union(x).with_(mul(bcast(S, so, ints(0)), dot(X, B, 0, lc, r, c)))
                )
            )
    return out


def _col_scale():
    # A·(X ∘ w[None, :]) -> (A·X) ∘ w[None, :]   (the scaled axis is X's free axis; A 1-D or 2-D)
    out = []
    for rc, vdim in ((0, 1), (1, 0)):
        scale = bcast(S, sa, ints(vdim))
        for scaled in (mul(scale, X), mul(X, scale)):
            lhs = dot(A, scaled, 0, l, rc, c)
            for ra in (1, 2):
                conds = (
                    rank(S, 1),
                    rank(X, 2),
                    rank(A, ra),
                    eq(shape(X)[rc]).to(shape(A)[l]),
                    _out(x),
                    *same_dtype(S, X, A, x),
                )
                scaled_out = mul(dot(A, X, 0, l, rc, c), bcast(S, so, ints(ra - 1)))
                out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(scaled_out)))
    return out


def _diag_example(rng, dt):
    import jax.numpy as jnp

    n_, m_ = sizes(rng, 2)
    return (lambda v, a, u: (jnp.diag(v) @ a, (v[:, None] * a) @ a.T, a.T @ (a * u[None, :]))), (
        rand(rng, (n_,), dt),
        rand(rng, (n_, m_), dt),
        rand(rng, (m_,), dt),
    )


_reg(
    "row_scale",
    "(v[:,None]∘X)@B -> v[:,None]∘(X@B)",
    False,
    _row_scale,
    "v 1-D broadcast along X's free axis; X 2-D with its contracted axis full size; one dtype",
    _diag_example,
)
_reg(
    "col_scale",
    "A@(X∘w[None,:]) -> (A@X)∘w[None,:]",
    False,
    _col_scale,
    "w 1-D broadcast along X's free axis; X 2-D with its contracted axis full size; one dtype",
    _diag_example,
)


def _diag_sides():
    # v[:, None] ∘ I -> I ∘ v[None, :] and back: a diagonal matrix scales rows or columns alike
    out = []
    for a_dim, b_dim in ((0, 1), (1, 0)):
        scaled = bcast(S, sa, ints(a_dim))
        conds = (rank(S, 1), is_eye(M), eq(sa).to(shape(M)), *same_dtype(S, M))
        for lhs in (mul(scaled, M), mul(M, scaled)):
            out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(mul(M, bcast(S, sa, ints(b_dim))))))
    return out


def _diag_sides_example(rng, dt):
    import jax.numpy as jnp

    n_, m_ = sizes(rng, 2)
    return (lambda a, v: a @ jnp.diag(v)), (rand(rng, (m_, n_), dt), rand(rng, (n_,), dt))


_reg(
    "diag_sides",
    "v[:,None]∘I <-> I∘v[None,:]",
    False,
    _diag_sides,
    "I an identity built in the program; v 1-D; one dtype (inf·0 off the diagonal is NaN)",
    _diag_sides_example,
)


# --- broadcast operands ----------------------------------------------------------------------------


def _bcast_rows():
    # (rows all w)·B -> broadcast(w·B);  A·(columns all w) -> broadcast(A·w);  same for a scalar fill
    out = []
    matrix = eq(sa.length()).to(i64(2))  # the broadcast is 2-D: its one free axis lands where w·B's does
    for rb in (1, 2):
        lhs = dot(bcast(S, sa, ints(1)), B, 0, 1, r, c)
        conds = (matrix, rank(S, 1), eq(shape(S)[0]).to(sa[1]), rank(B, rb), _out(x), *same_dtype(S, B, x))
        rhs = bcast(dot(S, B, 0, 0, r, c), so, ints(1) if rb == 2 else ints())
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs)))
        lhs = dot(bcast(S, sa, ints()), B, 0, 1, r, c)
        conds = (matrix, rank(S, 0), eq(k).to(sa[1]), rank(B, rb), _out(x), *same_dtype(S, B, x))
        rhs = bcast(dot(bcast(S, Vec[i64](k), ints()), B, 0, 0, r, c), so, ints(1) if rb == 2 else ints())
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs)))
    for ra in (1, 2):
        lhs = dot(A, bcast(S, sa, ints(0)), 0, l, 0, c)
        conds = (matrix, rank(S, 1), eq(shape(S)[0]).to(sa[0]), rank(A, ra), _out(x), *same_dtype(S, A, x))
        rhs = bcast(dot(A, S, 0, l, 0, c), so, ints(0) if ra == 2 else ints())
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs)))
    return out


def _bcast_rows_example(rng, dt):
    import jax.numpy as jnp

    n_, k_, m_ = sizes(rng, 3)

    def f(v, b, a, s):
        return (
            jnp.broadcast_to(v, (n_, k_)) @ b,
            a @ jnp.broadcast_to(v[:, None], (k_, m_)),
            jnp.full((n_, k_), s, b.dtype) @ b,
        )

    return f, (rand(rng, (k_,), dt), rand(rng, (k_, m_), dt), rand(rng, (n_, k_), dt), rand(rng, (), dt))


def _const_vector_dot():
    # (c·1)ᵀB -> c·Σ_rows B;  A(c·1) -> c·Σ_cols A   (a constant vector: a sum, not a product)
    out = []
    ones = bcast(S, sa, ints())
    conds = (rank(S, 0), eq(sa.length()).to(i64(1)))
    for rb in (1, 2):
        out.append(
            rule(eq(x).to(dot(ones, B, 0, 0, r, c)), *conds, rank(B, rb), *same_dtype(S, B, x)).then(
                union(x).with_(mul(Tensor.sum(B, Vec[i64](r)), S))
            )
        )
        out.append(
            rule(eq(x).to(dot(B, ones, 0, l, 0, c)), *conds, rank(B, rb), *same_dtype(S, B, x)).then(
                union(x).with_(mul(Tensor.sum(B, Vec[i64](l)), S))
            )
        )
    return out


def _const_vector_example(rng, dt):
    import jax.numpy as jnp

    n_, m_ = sizes(rng, 2)
    s_ = rand(rng, (), dt)
    return (lambda b, s: (jnp.full((n_,), s, b.dtype) @ b, b @ jnp.ones((m_,), b.dtype))), (
        rand(rng, (n_, m_), dt),
        s_,
    )


_reg(
    "const_vector_dot",
    "(c·1)ᵀB -> c·Σ_rows B, A(c·1) -> c·Σ_cols A",
    False,
    _const_vector_dot,
    "the vector a broadcast scalar; one dtype",
    _const_vector_example,
)
_reg(
    "bcast_rows",
    "(rows all w)@B -> broadcast(w@B), A@(cols all w) -> broadcast(A@w)",
    True,
    _bcast_rows,
    "the operand a broadcast of a vector (or scalar) along its free axis; one dtype",
    _bcast_rows_example,
)


# --- Kronecker products ----------------------------------------------------------------------------


def _kron_dot():
    # kron(A, B) @ x -> vec(A · X · Bᵀ) with X = x reshaped to [q, s(, t)]: two small products
    s_, t_ = V.i, V.j
    sa4, sb4, sk = V.sa, V.sb, V.sc
    kron = Tensor.reshape(mul(bcast(A, sa4, ints(0, 2)), bcast(B, sb4, ints(1, 3))), sk)
    shapes = (
        rank(A, 2),
        rank(B, 2),
        eq(p).to(shape(A)[0]),
        eq(q).to(shape(A)[1]),
        eq(r).to(shape(B)[0]),
        eq(s_).to(shape(B)[1]),
        eq(sa4).to(Vec[i64](p, i64(1), q, i64(1))),
        eq(sb4).to(Vec[i64](i64(1), r, i64(1), s_)),
        eq(sk).to(Vec[i64](p * r, q * s_)),
    )
    out = []
    # x of rank 2: [q*s, t] -> reshape [q, s, t]; A·X -> [p, s, t]; ·Bᵀ over s -> [p, t, r]
    y3 = Tensor.reshape(X, Vec[i64](q, s_, t_))
    z = dot(dot(A, y3, 0, 1, 0, c), B, 0, 1, 1, c)
    rhs = Tensor.reshape(Tensor.transpose(z, ints(0, 2, 1)), Vec[i64](p * r, t_))
    conds = (*shapes, rank(X, 2), eq(t_).to(shape(X)[1]), *same_dtype(A, B, X, x))
    out.append(rule(eq(x).to(dot(kron, X, 0, 1, 0, c)), *conds).then(union(x).with_(rhs)))
    # x of rank 1: [q*s] -> [q, s]; A·X·Bᵀ -> [p, r] -> [p*r]
    y2 = Tensor.reshape(X, Vec[i64](q, s_))
    rhs = Tensor.reshape(dot(dot(A, y2, 0, 1, 0, c), B, 0, 1, 1, c), Vec[i64](p * r))
    conds = (*shapes, rank(X, 1), *same_dtype(A, B, X, x))
    out.append(rule(eq(x).to(dot(kron, X, 0, 1, 0, c)), *conds).then(union(x).with_(rhs)))
    return out


def _kron_example(rng, dt):
    import jax.numpy as jnp

    p_, q_, r_, s_ = sizes(rng, 4, 2, 9)
    a, b = rand(rng, (p_, q_), dt), rand(rng, (r_, s_), dt)
    return (lambda a_, b_, x2, x1: (jnp.kron(a_, b_) @ x2, jnp.kron(a_, b_) @ x1)), (
        a,
        b,
        rand(rng, (q_ * s_, 3), dt),
        rand(rng, (q_ * s_,), dt),
    )


_reg(
    "kron_dot",
    "kron(A,B)@x -> vec(A·X·Bᵀ)",
    False,
    _kron_dot,
    "the Kronecker product of 2-D A, B as jnp.kron builds it; x 1-D or 2-D; one dtype",
    _kron_example,
)


# --- one weight for every batch entry ----------------------------------------------------------


def _shared_weight():
    # A @batch bcast(W) -> A @ W;  A @batch (bcast(W) ± Q) -> A @ W ± A @batch Q
    # [W 2-D, the same for every entry of the batch: one unbatched product over all rows of A;
    # jax.vmap of x @ (W + A_i @ B_i), per-example adapters, broadcasts W to [1, d, d]]
    out = []
    r, W, Q = V.r, V.Y, V.Z
    bw = bcast(W, sb, ints(1, 2))
    shared = Tensor.dot(A, W, 0, l, r - 1, V.c)
    # W broadcast along the batch axis only: a size-1 axis of W spread by the broadcast is
    # not W (a review: w of [k, 1] gave A @ w, n times too small after a sum)
    only_batch = eq(shape(W)).to(Vec[i64](sb[1], sb[2]))
    # a batch of two or more: batch.stack_dots's stacks lead with a unit axis (a broadcast of one
    # operand), which this would only take apart again (6% more optimize time over the bench)
    several = shape(A)[0] >= 2
    conds = (rank(W, 2), only_batch, V.r >= 1, *same_dtype(A, W), several)
    out.append(rule(eq(x).to(Tensor.dot(A, bw, 1, l, r, V.c)), *conds).then(union(x).with_(shared)))
    for combine in (Tensor.add, Tensor.sub):
        for summands, flip in (((bw, Q), False), ((Q, bw), True)):
            lhs = Tensor.dot(A, combine(*summands), 1, l, r, V.c)
            per = Tensor.dot(A, Q, 1, l, r, V.c)
            rhs = combine(per, shared) if flip else combine(shared, per)
            whole = eq(shape(Q)).to(shape(combine(*summands)))  # Q itself not broadcast
            out.append(rule(eq(x).to(lhs), *conds, whole, *same_dtype(Q, x)).then(union(x).with_(rhs)))
    return out


def _shared_weight_example(rng, dt):
    import jax
    import jax.numpy as jnp

    b_, s_, d_, r_ = sizes(rng, 4, 2, 17)
    shapes = ((b_, s_, d_), (d_, d_), (b_, d_, r_), (b_, r_, d_))

    def f(x, w, a, b):  # per-example low-rank adapters (multi-LoRA under jax.vmap)
        lora = jax.vmap(lambda x, a, b: x @ (w + a @ b), (0, 0, 0))(x, a, b)
        shared = jnp.einsum("bsd,bde->bse", x, jnp.broadcast_to(w, (b_, d_, d_)))
        return lora, shared, jax.vmap(lambda x, a, b: x @ (a @ b - w))(x, a, b)

    return f, tuple(rand(rng, s, dt) for s in shapes)


_reg(
    "shared_weight",
    "A @batch bcast(W) -> A @ W, A @batch (bcast(W) ± Q) -> A @ W ± A @batch Q",
    False,
    _shared_weight,
    "W 2-D broadcast along the batch axis only (to size 1 or the batch's); Q of the sum's shape; "
    "one batch axis; one dtype",
    _shared_weight_example,
)

__all__: list[str] = []

"""Reductions and slices through products: compute only the part of a product that is used.

Sums of a product's rows or columns become products with summed operands (1ᵀ(AB) = (1ᵀA)B),
traces and diagonals of products, batched too, become elementwise products (trace(AB) = Σ A∘Bᵀ), a row,
column, element or batch slice of a product becomes a product of slices, and weighted sums that
are really matrix-vector products become dots (so associativity can then move them inward:
Σ_i w_i (AB)_i = (wᵀA)B). Sums created here in bf16/f16 accumulate in float32 (decode.py).
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, ne, rewrite, rule, union

from ..terms import DEFAULT_CFG, Tensor, diagonal_of, dtype, is_eye, is_eye_mask, kept_diagonal, shape
from ..terms import fill as fill_
from . import Rule, finding, register_rule
from ._util import F32, LOW, NARROWER, RING, V, ints, rand, rank, same_dtype, sizes, sum_of

A, B, C, M, X, Z, E = V.A, V.B, V.C, V.M, V.X, V.Z, V.E
x = V.x
nb, l, r, c, ax, s0, s1, k = V.nb, V.l, V.r, V.c, V.ax, V.s0, V.s1, V.k
dot, sum_ = Tensor.dot, Tensor.sum
T2 = Vec[i64](i64(1), i64(0))


def _reg(name, identity, exact, build, conditions, example):
    register_rule(Rule(f"reduce.{name}", "reduce", identity, exact, build, conditions, example, RING))


# --- sums of products ------------------------------------------------------------------------------


def _sum_dot():
    # Σ_rows (A·B) -> (Σ_rows A)·B   [A 2-D; output axis 0 is A's free axis]
    # Σ_cols (A·B) -> A·(Σ_cols B)   [B 2-D; output's last axis is B's free axis]
    prod = dot(A, B, 0, l, r, c)
    out = []
    for lhs, up, only in sum_of(prod, ints(0)):
        rhs = up(dot(sum_(A, Vec[i64](1 - l)), B, 0, 0, r, c))
        out.append(rewrite(lhs).to(rhs, rank(A, 2), *same_dtype(A, B, prod), *only))
    for lhs, up, only in sum_of(prod, V.dims):
        one_axis = (eq(V.dims.length()).to(i64(1)), eq(ax).to(V.dims[0]))
        conds = (*one_axis, rank(B, 2), eq(ax).to(shape(A).length() - 1), *same_dtype(A, B, prod), *only)
        out.append(
            rule(eq(x).to(lhs), *conds).then(union(x).with_(up(dot(A, sum_(B, Vec[i64](1 - r)), 0, l, 0, c))))
        )
    return out


def _split_sum():
    # Σ_{a,b} X -> Σ_a Σ_b X   (a < b)
    axes = V.dims
    conds = (eq(axes.length()).to(i64(2)), eq(s0).to(axes[0]), eq(s1).to(axes[1]))
    return [
        rule(eq(x).to(sum_(X, axes)), *conds).then(union(x).with_(sum_(sum_(X, Vec[i64](s1)), Vec[i64](s0))))
    ]


def _sum_dot_example(rng, dt):
    m_, k_, n_ = sizes(rng, 3)
    return (lambda a, b: ((a @ b).sum(0), (a @ b).sum(1), (b.T @ a.T).sum(0))), (
        rand(rng, (m_, k_), dt),
        rand(rng, (k_, n_), dt),
    )


def _split_sum_example(rng, dt):
    m_, n_ = sizes(rng, 2)
    return (lambda a: a.sum() * 2), (rand(rng, (m_, n_), dt),)


_reg(
    "sum_dot",
    "Σ_rows(AB) -> (Σ_rows A)B, Σ_cols(AB) -> A(Σ_cols B)",
    False,
    _sum_dot,
    "the summed operand 2-D, no batch axes; one dtype",
    _sum_dot_example,
)
_reg("split_sum", "Σ_{a,b} X -> Σ_a Σ_b X", False, _split_sum, "two axes, a < b", _split_sum_example)


BATCHES = (0, 1, 2)  # leading batch axes the sum, trace and diagonal rules take (jax.vmap, once or twice)


def _swap_last(nb):
    """The permutation that swaps the last two of nb + 2 axes."""
    return ints(*range(nb), nb + 1, nb)


def _sum_transpose():
    # Σ_axes f(Xᵀ) -> Σ_axes f(X) where the transpose only moves summed axes: the same elements in
    # another order (diag_dot's trace(AᵀA) is Σ Aᵀ∘Aᵀ; the transpose cost 3.4-3.9x on this CPU)
    out = []
    # the last two axes swapped past nb batch axes, summed over those two or over every axis
    summed = [(nb, ints(nb, nb + 1)) for nb in BATCHES] + [(nb, ints(*range(nb + 2))) for nb in BATCHES if nb]
    for nb, ax in summed:
        swap = _swap_last(nb)

        def t(a, swap=swap):
            return Tensor.transpose(a, swap)

        for lhs, rhs in (
            (t(X), X),
            (Tensor.mul(t(A), t(B)), Tensor.mul(A, B)),
            (Tensor.integer_pow(t(A), k), Tensor.integer_pow(A, k)),
        ):
            for pattern, up, only in sum_of(lhs, ax, LOW):  # bf16/f16 summed in float32 too
                typed = (eq(dtype(lhs)).to(V.d), *only) if only else ()
                out.append(rewrite(pattern).to(sum_(up(rhs), ax), *typed))
    return out


def _sum_transpose_example(rng, dt):
    import jax
    import jax.numpy as jnp

    m_, n_ = sizes(rng, 2)
    a, b, c = rand(rng, (m_, n_), dt), rand(rng, (m_, n_), dt), rand(rng, (3, m_, n_), dt)

    def f(a, b, c):
        per_matrix = jax.vmap(lambda x: jnp.sum(x.T**2))(c)  # Σ over a batch's transposed axes
        return jnp.sum(a.T * b.T), jnp.sum(a.T), per_matrix, jnp.sum(jnp.swapaxes(c, 1, 2))

    return f, (a, b, c)


_reg(
    "sum_transpose",
    "Σ_axes f(Xᵀ) -> Σ_axes f(X), f elementwise (x, x·y, xᵏ), the transpose within the summed axes",
    False,
    _sum_transpose,
    "a transpose of the last two axes (or all of a matrix's) summed over both; one dtype",
    _sum_transpose_example,
)


# --- traces and diagonals ---------------------------------------------------------------------------


def _masked(t, form, nb):
    """Patterns of `t` kept on the diagonal of its last two axes only: where(I, t, 0) ("select",
    jnp.trace), or t∘I and I∘t ("eye": off the diagonal inf·0 is NaN there, which the rewrite does
    not compute). Past `nb` leading batch dims the mask is the identity broadcast (jax.vmap)."""
    # the identity is as large as t's last two axes: a 1x1 one broadcast is all ones (a review:
    # where(eye(1), A @ B, 0) summed, batched, was read as a trace)
    square = (
        eq(V.so).to(shape(t)),
        eq(shape(M if form == "select" else E)).to(Vec[i64](V.so[nb], V.so[nb + 1])),
    )

    def placed(m):  # the identity itself, or broadcast past the batch axes
        return m if nb == 0 else Tensor.broadcast_in_dim(m, V.sb, ints(nb, nb + 1))

    if form == "select":
        placement = () if nb == 0 else (eq(V.sb).to(shape(t)),)
        yield Tensor.select_n(placed(M), Z, t), (is_eye_mask(M), eq(fill_(Z)).to(0.0), *placement, *square)
    else:  # of t's own shape: a size-1 t would broadcast (jax 0.12 does it without broadcast_in_dim)
        for masked in (Tensor.mul(t, placed(E)), Tensor.mul(placed(E), t)):
            # batched, the identity may keep size-1 batch axes (x * jnp.eye(n) broadcasts it so)
            yield masked, (is_eye(E), eq(shape(masked)).to(shape(t)), *square)


def _diag_dot(form):
    # diag(A·B) -> Σ_k Ã∘B̃ ;  trace(A·B) -> Σ Ã∘B̃   with Ã = A or Aᵀ, B̃ = B or Bᵀ as [.., i, k],
    # past nb leading batch axes (of jax.vmap(jnp.trace) or a trace over the last two axes). First
    # each masked product is found (kept_diagonal), then the sums over one: a pattern per layout
    # and sum was 540 rules, three times the rest of the rules together
    out = []
    for nb in BATCHES:
        i_, k_ = nb, nb + 1  # the diagonal's axis and the summed one, after the batch axes
        for lc in (i_, k_):
            for rc in (i_, k_):
                prod = dot(A, B, nb, lc, rc, c)
                a_ = A if lc == k_ else Tensor.transpose(A, _swap_last(nb))
                b_ = B if rc == k_ else Tensor.transpose(B, _swap_last(nb))
                conds = (rank(A, nb + 2), rank(B, nb + 2), *same_dtype(A, B, prod))
                for j, (masked, extra) in enumerate(_masked(prod, form, nb)):
                    found = kept_diagonal(masked, a_, b_, i64(nb), String(form))
                    name = finding(f"reduce.diag_dot {form} {nb} {lc} {rc} {j}")
                    out.append(rule(eq(x).to(masked), *conds, *extra, name=name).then(found))
    return out + _diagonal_sums(form)


def _diagonal_sums(form):
    """The sums over a kept diagonal (the trace, and the diagonal summed over either axis) as
    elementwise products of the operands, in float32 for bf16/f16 as the dot computes them."""
    out = []
    nb = V.nb
    a_, b_ = V.Y, V.S  # [.., i, k] and [.., j, k]
    hadamard = Tensor.mul(a_, b_)
    # the products in float32, as the dot makes them: a float16 program summed in float32
    # may take this form too (its products cannot overflow there)
    wide = Tensor.mul(*(Tensor.convert_element_type(t, F32) for t in (a_, b_)))
    found = (kept_diagonal(M, a_, b_, nb, String(form)), eq(dtype(M)).to(V.d))
    diagonal_axes = Vec[i64](nb + 1)
    for axes, trace in ((Vec[i64](nb, nb + 1), True), (Vec[i64](nb), False), (diagonal_axes, False)):
        new_axes = axes if trace else diagonal_axes
        plain, *upcasts = sum_of(M, V.dims, LOW)
        at = (eq(V.dims).to(axes),)
        for (lhs, _, only), low in zip(upcasts, LOW, strict=True):
            rhs = _diagonal_sum(wide, low, nb) if trace else _diagonal(wide, low, nb)
            out.append(rule(eq(x).to(lhs), *found, *at, *only).then(union(x).with_(rhs)))
        # summed in its own dtype: the new, longer sum accumulates in float32 for
        # bf16/f16 (it lands in the program's class, where decode would not upcast)
        lhs, _, _ = plain
        high = tuple(ne(V.d).to(String(n)) for n in (*LOW, *NARROWER))
        out.append(rule(eq(x).to(lhs), *found, *at, *high).then(union(x).with_(sum_(hadamard, new_axes))))
        for low in LOW:  # float16 products overflow where the dot's float32 ones do not
            acc = _diagonal_sum(wide, low, nb) if trace else sum_(wide, new_axes)
            acc = Tensor.convert_element_type(acc, low)
            out.append(rule(eq(x).to(lhs), *found, *at, eq(V.d).to(String(low))).then(union(x).with_(acc)))
    return out


def _diagonal(wide, low, nb):
    """diag(A·B) in float32 from its float32 products [.., i, k], rounded to `low` on the way as
    the dot rounds it: an entry over float16's range is Inf, as jax.jit's (a new user's float16
    trace was finite, summed straight from the products, where jax.jit's was NaN)."""
    rounded = Tensor.convert_element_type(sum_(wide, Vec[i64](nb + 1)), low)
    return Tensor.convert_element_type(rounded, F32)


def _diagonal_sum(wide, low, nb):
    """trace(A·B) in float32: the sum of `_diagonal`."""
    return sum_(_diagonal(wide, low, nb), Vec[i64](nb))


def _trace_example(rng, dt):
    import jax
    import jax.numpy as jnp

    n_, k_, b_ = sizes(rng, 3, hi=24)
    a, b = rand(rng, (n_, k_), dt), rand(rng, (k_, n_), dt)
    batched = rand(rng, (b_, n_, k_), dt), rand(rng, (b_, k_, n_), dt)
    twice = rand(rng, (2, 3, k_, n_), dt), rand(rng, (2, 3, n_, k_), dt)

    def f(a_, b_, batched, twice):
        from jax import lax

        eye = jnp.eye(n_, dtype=a_.dtype)
        direct = lax.reduce_sum((a_ @ b_) * eye, (0, 1))  # summed in its own dtype, even bf16
        bp = batched[0] @ batched[1]
        along = jnp.einsum("...ki,...jk->...ij", *twice)  # two batch axes, both operands [k, i]
        return (
            jnp.trace(a_ @ b_),
            ((b_.T @ a_.T) * eye).sum(1),
            (eye * (a_ @ b_)).sum(0),
            direct,
            jax.vmap(jnp.trace)(bp),
            jnp.einsum("bii->bi", bp),
            (bp * eye).sum(2),
            jax.vmap(jax.vmap(jnp.trace))(along),
        )

    return f, (a, b, batched, twice)


_reg(
    "diag_dot",
    "trace(AB) -> Σ A∘Bᵀ, diag(AB) -> Σ_k A∘Bᵀ",
    False,
    lambda: _diag_dot("select"),
    "operands 2-D past up to two leading batch axes (jax.vmap); the diagonal of the last two selected by "
    "where(I, ·, 0) with I built in the program (broadcast past the batch axes); one dtype",
    _trace_example,
)
_reg(
    "diag_dot_eye",
    "Σ (AB)∘I -> Σ A∘Bᵀ (and the diagonal)",
    False,
    lambda: _diag_dot("eye"),
    "operands 2-D past up to two leading batch axes; the diagonal selected by a product with an identity "
    "built in the program; one dtype (an inf off the diagonal gave NaN before, a finite value after)",
    _trace_example,
)


def _platform_diagonal():
    # x = X[.., i, i] (jnp.diagonal: a platform cond or a gather, diagonal_of) -> Σ_nb where(I, X, 0),
    # I = (iota0 == iota1), broadcast past nb batch axes: X's diagonal for every X (Σ I∘X, the
    # Mosaic branch, is NaN where X holds an Inf off the diagonal); diag_dot then rewrites the
    # diagonal of a product
    out = []
    for nb in BATCHES:
        square = Vec[i64](V.so[nb], V.so[nb]) if nb else V.so
        iota0, iota1 = (Tensor.iota("int32", square, dim) for dim in (0, 1))
        mask = Tensor.binary("eq", iota0, iota1)
        if nb:
            mask = Tensor.broadcast_in_dim(mask, V.so, ints(nb, nb + 1))
        zeros = Tensor.broadcast_in_dim(Tensor.scalar(0, 1, V.d), V.so, Vec[i64].empty())
        masked = Tensor.select_n(mask, zeros, X)
        conds = (eq(V.so).to(shape(X)), rank(X, nb + 2), eq(dtype(X)).to(V.d), ne(V.d).to(String("bool")))
        out.append(rule(diagonal_of(x, X), *conds).then(union(x).with_(sum_(masked, ints(nb)))))
    return out


def _diagonal_example(rng, dt):
    import jax.numpy as jnp

    n_, k_ = sizes(rng, 2)
    a, b = rand(rng, (n_, k_), dt), rand(rng, (k_, n_), dt)

    def f(a_, b_):
        return jnp.diagonal(a_ @ b_), jnp.diag(b_.T @ a_.T), jnp.diagonal(a_[:, :1] * b_[:1])

    return f, (a, b)


_reg(
    "platform_diagonal",
    "jnp.diagonal(X) (a platform cond or a gather) -> Σ_0 where(I, X, 0)",
    False,
    _platform_diagonal,
    "a gather of X[.., i, i], or a platform-dependent cond whose branch for this platform is one (checked "
    "when encoded), X square in its last two axes past up to two batch axes, not bool (exact but for the "
    "sign of a zero on the diagonal)",
    _diagonal_example,
)


# --- slices of products -------------------------------------------------------------------------


def _slice_dot():
    # (A·B)[.., a:b, ..] -> A[a:b]·B, A·B[a:b] or A[a:b]·B[a:b] (batch), by the axis's origin
    out = []
    prod = dot(A, B, nb, l, r, c)
    cut = Tensor.slice(prod, ax, s0, s1)
    ra = (eq(k).to(shape(A).length()),)
    dt = same_dtype(A, B, prod)
    sl = Tensor.slice
    # batch axis
    out.append(rewrite(cut).to(dot(sl(A, ax, s0, s1), sl(B, ax, s0, s1), nb, l, r, c), ax < nb, *dt))
    # A's free axes: output axis ax is A's axis ax (before l) or ax + 1 (after)
    out.append(
        rule(eq(x).to(cut), *ra, ax >= nb, ax < l, *dt).then(
            union(x).with_(dot(sl(A, ax, s0, s1), B, nb, l, r, c))
        )
    )
    out.append(
        rule(eq(x).to(cut), *ra, ax >= l, ax < k - 1, *dt).then(
            union(x).with_(dot(sl(A, ax + 1, s0, s1), B, nb, l, r, c))
        )
    )
    # B's free axes: index nb + (ax - (rank(A) - 1)) among B's non-contracted axes
    j = nb + ax - (k - 1)
    out.append(
        rule(eq(x).to(cut), *ra, ax >= k - 1, eq(V.j).to(j), V.j < r, *dt).then(
            union(x).with_(dot(A, sl(B, V.j, s0, s1), nb, l, r, c))
        )
    )
    out.append(
        rule(eq(x).to(cut), *ra, ax >= k - 1, eq(V.j).to(j), V.j >= r, *dt).then(
            union(x).with_(dot(A, sl(B, V.j + 1, s0, s1), nb, l, r, c))
        )
    )
    return out


def _slice_dot_example(rng, dt):
    m_, k_, n_ = sizes(rng, 3, 5, 33)
    b_ = 3

    def f(a, b, a3, b3):
        p = a @ b
        return p[1], p[:, 2], p[1, 3], (b.T @ a.T)[2:4], (a3 @ b3)[1:3]

    return f, (
        rand(rng, (m_, k_), dt),
        rand(rng, (k_, n_), dt),
        rand(rng, (b_ + 1, m_, k_), dt),
        rand(rng, (b_ + 1, k_, n_), dt),
    )


_reg(
    "slice_dot",
    "(AB)[i] -> A[i]B, (AB)[:, j] -> AB[:, j], batch slices -> slices of both",
    True,
    _slice_dot,
    "unit-stride slice along one axis; one dtype",
    _slice_dot_example,
)


# --- weighted sums ------------------------------------------------------------------------------


def _weighted_sum():
    # Σ_i w_i X[i, :] -> wᵀX;  Σ_j X[:, j] w_j -> Xw;  Σ_i x_i y_i -> x·y   (w broadcast from 1-D)
    out = []
    w = V.Y
    for axis, dims in ((0, ints(0)), (1, ints(1))):
        bw = Tensor.broadcast_in_dim(w, V.so, dims)
        rhs = dot(w, X, 0, 0, 0, DEFAULT_CFG) if axis == 0 else dot(X, w, 0, 1, 0, DEFAULT_CFG)
        conds = (rank(X, 2), rank(w, 1), eq(shape(X)[axis]).to(shape(w)[0]), *same_dtype(X, w))
        for prod in (Tensor.mul(X, bw), Tensor.mul(bw, X)):
            full = eq(shape(X)).to(shape(prod))  # X itself not broadcast by the product
            for lhs, up, only in sum_of(prod, ints(axis)):
                out.append(rewrite(lhs).to(up(rhs), *conds, full, *only))
    conds = (rank(X, 1), rank(w, 1), eq(shape(X)).to(shape(w)), *same_dtype(X, w))
    for lhs, up, only in sum_of(Tensor.mul(X, w), ints(0)):
        out.append(rewrite(lhs).to(up(dot(X, w, 0, 0, 0, DEFAULT_CFG)), *conds, *only))
    return out


def _weighted_sum_example(rng, dt):
    m_, n_ = sizes(rng, 2)

    def f(a, u, v):
        from jax import lax

        wide = (lax.broadcast_in_dim(u, (m_, n_), (0,)) * a[:, :1]).sum(0)  # a broadcast: not a dot
        return (a * u[:, None]).sum(0), (v[None, :] * a).sum(1), (u * u).sum(), wide

    return f, (
        rand(rng, (m_, n_), dt),
        rand(rng, (m_,), dt),
        rand(rng, (n_,), dt),
    )


_reg(
    "weighted_sum",
    "Σ_i w_i X[i] -> wᵀX, Σ_j X[:, j] w_j -> Xw, Σ x∘y -> x·y",
    False,
    _weighted_sum,
    "X 2-D (or 1-D), w 1-D broadcast along the summed axis; one dtype",
    _weighted_sum_example,
)

__all__: list[str] = []

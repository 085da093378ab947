"""Per-example gradients of sequence layers: norms from Gram matrices, sums as one product.

Under jax.vmap(jax.grad(...)) a linear layer applied to a sequence of T rows x_t has, for each
example, the gradient G = Xᵀ Δ = Σ_t x_t ⊗ δ_t: a batched dot contracting T, [b, T, n] x
[b, T, m] -> [b, n, m]. DP-SGD and gradient-noise monitoring take each G's squared norm, and
DP-SGD then a weighted sum over the batch. Neither needs G ("ghost clipping"):

    Σ_jk G_jk² = Σ_ts (X Xᵀ)_ts (Δ Δᵀ)_ts          Σ_b c_b X_bᵀ Δ_b = (c∘X)ᵀ Δ over all b·T rows

The first costs T²(n + m) per example instead of T·n·m, so it pays while T < nm / (n + m); the
cost model chooses. It is numerics="fast" only (_util.FAST_ONLY): the program squares G and sums
non-negative terms, with an error relative to the norm of about u |X||Δ| / |G|; the Grams' T²
products have both signs and cancel to |G|², with an error of about u |X|²|Δ|² in absolute terms.
Where G is small beside |X||Δ| (inputs nearly constant along the sequence and signals that sum
to zero over it: a review's centred layer) that is the square of the program's error, and of
either sign; clamped at 0, the norm is never NaN, but it can be far from the program's. For
DP-SGD's clipping that is harmless (a small norm is not clipped either way); for a norm that is
reported it is not, so numerics="default" leaves it to the program.
`ghost.scale` moves a per-example scale into the product, so that `ghost.batch_sum` sees it; both
reorder one sum's terms (the reordering bound, docs/numerics.md) and run under "default" away
from saturating ops, as every reassociation does.
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, rewrite

from ..terms import Tensor, dtype, float_dtype, shape
from . import Rule, register_rule
from ._util import F32, FLOAT, RING, WIDE_RANGE, V, ints, rand, sizes, sum_of

A, B, C = V.A, V.B, V.C
l, r, c = V.l, V.r, V.c
so, sa, sb, sc = V.so, V.sa, V.sb, V.sc
dot, bcast, mul, pow_ = Tensor.dot, Tensor.broadcast_in_dim, Tensor.mul, Tensor.integer_pow
_SCALED = mul(A, bcast(C, sa, ints(0)))  # A [b, ...] times c [b] per batch entry
BATCHES = (0, 1, 2)  # leading batch axes (jax.vmap, once or twice; 0: one matrix product AᵀB)

# The rules below take WIDE_RANGE (_util: not float16 or narrower): a Gram entry Σ_k a_k²
# overflows float16 past 256 where the program's product need not, and c·A can overflow where
# c·(AᵀB) does not


def _reg(name, identity, build, conditions, example, dtypes=RING):
    register_rule(Rule(f"ghost.{name}", "ghost", identity, False, build, conditions, example, dtypes))


def _product(nb):
    """A batched dot past nb batch axes of two rank-(nb + 2) operands of one dtype, its result of
    dtype V.d and shape V.so: (the dot, its conditions)."""
    d = dot(A, B, nb, l, r, c)
    rk = i64(nb + 2)
    conds = (eq(shape(A).length()).to(rk), eq(shape(B).length()).to(rk), eq(dtype(A)).to(dtype(B)))
    return d, (*conds, eq(dtype(d)).to(V.d), eq(shape(d)).to(so), *WIDE_RANGE)


# --- squared norms ----------------------------------------------------------------------------


def _gram(t, nb, contracted):
    """t tᵀ past nb batch axes, over t's other (free) axis: [.., T, T] for t of [.., T, n]."""
    free = i64(2 * nb + 1) - contracted
    return dot(t, t, nb, free, free, c)


def _squares(d, nb):
    """Σ d² over d's two last axes as programs write it, or over d raveled to [.., n·m] (DP code
    often norms a flattened gradient): (the squares summed's inner term, the axes, conditions)."""
    yield pow_(d, 2), ints(nb, nb + 1), ()
    if nb <= 1:
        conds = (eq(sc.length()).to(i64(nb + 1)), eq(sc[nb]).to(so[nb] * so[nb + 1]))
        conds += tuple(eq(sc[i]).to(so[i]) for i in range(nb))
        yield pow_(Tensor.reshape(d, sc), 2), ints(nb), conds


def _clamped(total, dt):
    """max(total, 0): a sum of squares written as a sum of Gram products is rounded to either
    sign where it cancels (a gradient near 0 beside large |a| |b|), and sqrt(-1e-7) is NaN."""
    return Tensor.binary("max", total, Tensor.scalar(0, 1, dt))


def _norms():
    # Σ_jk (Σ_t a_tj b_tk)² -> max(Σ_ts (a aᵀ)_ts (b bᵀ)_ts, 0)   [past nb batch axes]
    out = []
    for nb in BATCHES:
        d, conds = _product(nb)
        grams = mul(_gram(A, nb, l), _gram(B, nb, r))
        for inner, axes, shaped in _squares(d, nb):
            for lhs, up, only in sum_of(inner, axes):
                dt = String(F32) if only else V.d  # the upcast pattern sums in float32
                rhs = _clamped(Tensor.sum(up(grams), ints(nb, nb + 1)), dt)
                out.append(rewrite(lhs).to(rhs, *conds, float_dtype(V.d), *shaped, *only))
    return out


def _norms_example(rng, dt):
    import jax
    import jax.numpy as jnp
    from jax import lax

    b_, t_, n_, m_ = sizes(rng, 4, 2, 17)

    def f(x, y, xs, ys):
        one = x.T @ y  # [n, m]: one product, no batch
        per = lax.dot_general(xs, ys, (((1,), (1,)), ((0,), (0,))))  # per example, [b, n, m]
        back = lax.dot_general(ys, xs, (((1,), (1,)), ((0,), (0,))))  # the other order, [b, m, n]
        flat = jax.vmap(lambda g: jnp.sum(jnp.ravel(g) ** 2))(per)
        return jnp.sum(one**2), jnp.sum(per**2, axis=(1, 2)), jnp.sum(back**2, axis=(1, 2)), flat

    shapes = ((t_, n_), (t_, m_), (b_, t_, n_), (b_, t_, m_))
    return f, tuple(rand(rng, s, dt) for s in shapes)


_reg(
    "norm",
    "Σ_jk (AᵀB)_jk² -> max(Σ_ts (AAᵀ)_ts (BBᵀ)_ts, 0), per batch entry (ghost norms)",
    _norms,
    "a dot of two real operands of rank 2 past its batch axes, one contracting axis each, squared "
    "and summed over both free axes (or raveled and summed); not float16 or narrower; "
    'numerics="fast" only: the error is u |A|² |B|², not relative to the norm',
    _norms_example,
    FLOAT,
)


# --- sums over the batch ----------------------------------------------------------------------


def _rows(t, s):
    """t of shape s = [b, T, n] as the [b·T, n] matrix of all its rows."""
    return Tensor.reshape(t, Vec[i64](s[0] * s[1], s[2]))


def _batch_sum():
    # Σ_b A_bᵀ B_b -> Aᵀ B over all b·T rows   [A: b x T x n, B: b x T x m, T contracted]
    d = dot(A, B, 1, 1, 1, c)
    rank3 = (eq(shape(A)).to(sa), eq(shape(B)).to(sb), eq(sa.length()).to(i64(3)), eq(sb.length()).to(i64(3)))
    typed = (eq(dtype(A)).to(dtype(B)), eq(dtype(d)).to(V.d), *WIDE_RANGE)
    flat = dot(_rows(A, sa), _rows(B, sb), 0, 0, 0, c)
    out = [rewrite(lhs).to(up(flat), *rank3, *typed, *only) for lhs, up, only in sum_of(d, ints(0))]
    # Σ_b c_b A_bᵀ B_b written as a contraction with c (optax: jnp.tensordot(c, g, axes=1)), where
    # both dots have one precision: one product of all rows at the contraction's precision would
    # round a HIGHEST per-example product's operands to TF32 on a GPU (a review)
    weighted = dot(_rows(_SCALED, sa), _rows(B, sb), 0, 0, 0, c)
    same = (eq(dtype(C)).to(V.d), eq(dtype(A)).to(V.d), eq(shape(C).length()).to(i64(1)))
    for lhs in (dot(C, d, 0, 0, 0, c), dot(d, C, 0, 0, 0, c)):
        out.append(rewrite(lhs).to(weighted, *rank3, *typed, *same))
    return out


def _scale():
    # c_b (A_bᵀ B_b) -> (c_b A_b)ᵀ B_b   [a per-example scale broadcast from c: b, to the
    # product's shape or to [b, 1, 1] (jnp's c[:, None, None])]
    out = []
    d = dot(A, B, 1, l, r, c)
    s = bcast(C, sc, ints(0))
    conds = (eq(shape(d)).to(so), eq(shape(A)).to(sa), eq(shape(C).length()).to(i64(1)))
    conds += (eq(dtype(C)).to(V.d), eq(dtype(A)).to(V.d), eq(dtype(d)).to(V.d), *WIDE_RANGE)
    for lhs in (mul(d, s), mul(s, d)):
        keeps = eq(shape(lhs)).to(so)  # the product not broadcast by the scale
        out.append(rewrite(lhs).to(dot(_SCALED, B, 1, l, r, c), *conds, keeps))
    return out


def _sums_example(rng, dt):
    import jax.numpy as jnp
    from jax import lax

    b_, t_, n_, m_ = sizes(rng, 4, 2, 17)

    def f(xs, ys, w):
        # [b, n, m], typed as jnp.tensordot types its contraction (one configuration for both)
        per = lax.dot_general(xs, ys, (((1,), (1,)), ((0,), (0,))), preferred_element_type=xs.dtype)
        scaled = jnp.sum(per * w[:, None, None], axis=0)
        return jnp.sum(per, axis=0), scaled, jnp.tensordot(w, per, axes=1), w[:, None, None] * per

    return f, (rand(rng, (b_, t_, n_), dt), rand(rng, (b_, t_, m_), dt), rand(rng, (b_,), dt))


_reg(
    "batch_sum",
    "Σ_b A_bᵀB_b -> AᵀB over the b·T rows, Σ_b c_b A_bᵀB_b -> (c∘A)ᵀB (one product)",
    _batch_sum,
    "A [b, T, n] and B [b, T, m] multiplied per batch entry over T; summed over b, or contracted "
    "with c [b] in the same precision; one dtype, not float16 or narrower",
    _sums_example,
)
_reg(
    "scale",
    "c_b (A_bᵀB_b) -> (c_b A_b)ᵀB_b",
    _scale,
    "a dot with one batch axis, times c [b] broadcast along it; one dtype, not float16 or narrower",
    _sums_example,
)

__all__: list[str] = []

"""Outer products: dots that contract no axis, as jax.vmap makes per-example gradients.

The gradient of `x @ W` for one example is the outer product x ⊗ δ; under jax.vmap it is a
dot_general over the batch axis that contracts nothing, [b, n] x [b, m] -> [b, n, m]. Programs
that clip per-example gradients (DP-SGD) then take each one's norm and a weighted sum over the
batch, both of which need only the factors:

    Σ_jk (x_j δ_k)² = (Σ_j x_j²)(Σ_k δ_k²)        Σ_b c_b x_b ⊗ δ_b = (c∘X)ᵀ Δ

`outer.product` records each outer product the encoder found (such a dot, or a multiply of two
vectors broadcast against each other: jnp.outer, x[:, :, None] * y[:, None, :]) as the fact
`outer_of(t, p, q, nb)`, and writes each dot as the elementwise product it is. The other rules
query that fact: sums of the product and of its square over the product axes, its sum over the
batch axis (a dot contracting it), a transpose of it, and a per-example scale of it. A program
without an outer product writes no fact, and these rules are not even registered (reach.py).
"""

from __future__ import annotations

from typing import Any

from egglog import String, Vec, eq, i64, rule, union, vars_

from ..egg_source import EggSource, Str, ivec
from ..terms import DEFAULT_CFG, Tensor, float_dtype, joined, outer_of, shape
from . import Rule, register_rule
from ._util import F32, FLOAT, RING, WIDE_RANGE, V, ints, rand, rank, same_dtype, sizes, sum_of

A, B, C, x = V.A, V.B, V.C, V.x
so, sa, sc, sS = V.so, V.sa, V.sc, V.sb
bcast, mul, sum_, pow_ = Tensor.broadcast_in_dim, Tensor.mul, Tensor.sum, Tensor.integer_pow
(O,) = vars_("outer_o", Tensor)  # the outer product's class
BATCHES = (0, 1, 2)  # leading batch axes (jax.vmap, once or twice)


def _reg(name, identity, exact, build, conditions, example, dtypes=RING, **kw):
    register_rule(Rule(f"outer.{name}", "outer", identity, exact, build, conditions, example, dtypes, **kw))


def _dims(nb):
    """Where the left and the right operand of an outer product with nb batch axes go."""
    return ints(*range(nb), nb), ints(*range(nb), nb + 1)


def _full(p, q, nb, out):
    """p ⊗ q broadcast to `out` and multiplied, as outer.product writes a dot."""
    dp, dq = _dims(nb)
    return mul(bcast(p, out, dp), bcast(q, out, dq))


# The rules below take WIDE_RANGE (_util: not float16 or narrower): p² overflows where (p q)²
# need not (outer.sum), a product the program rounds to float16, and overflows, the dot sums in
# float32 (batch_sum: jax.jit's Inf, 0 here), and c·p can overflow where p·q·c does not (scale).


def _of(t, p, q, nb):
    """Conditions: t = p ⊗ q past nb batch axes (outer_of), all of dtype V.d."""
    return (outer_of(t, p, q, nb), *same_dtype(p, q, t))


# --- the elementwise form -----------------------------------------------------------------------


def _seed_outer_products(program: Any) -> int:
    """outer_of for each outer product the encoder found (Program.outers), and each dot among
    them = its operands broadcast and multiplied. A seed, not a rule: a dot_general that
    contracts nothing is opaque to the e-graph, whose rules cannot read a node's operands out of
    its Vec; and the facts are written only where there is something to find."""
    src = EggSource(program.egraph)
    for site in program.outers:
        a, b = site.a, site.b
        if site.widen:
            a, b = (src.call(Tensor.convert_element_type, t, Str(site.dtype)) for t in (a, b))
        src.add(src.call(outer_of, site.term, a, b, site.nb))
        if not site.written:  # as _full: a [.., n] and b [.., m] broadcast to [.., n, m]
            nb = site.nb
            out = ivec((*site.sa, site.sb[nb]))
            left = src.call(bcast, a, out, ivec((*range(nb), nb)))
            right = src.call(bcast, b, out, ivec((*range(nb), nb + 1)))
            src.add(src.call(joined, site.term, src.call(mul, left, right)))
    src.flush()
    if program.symbols:  # the constructors written here can make more rules match (reach.py)
        program.symbols = program.symbols | frozenset(src.refs)
    return len(program.outers)


def _products_example(rng, dt):
    import jax.numpy as jnp
    from jax import lax

    b_, n_, m_ = sizes(rng, 3, 2, 17)
    wide = jnp.float32 if dt == "bfloat16" else None  # widened as jax.grad of a bf16 layer writes it

    def f(u, v, xs, ys):  # per-example gradients of a linear layer under jax.vmap: [b, n] x [b, m]
        per = lax.dot_general(xs, ys, (((), ()), ((0,), (0,))), preferred_element_type=wide)
        return lax.dot_general(u, v, (((), ()), ((), ()))), per

    return f, (rand(rng, (n_,), dt), rand(rng, (m_,), dt), rand(rng, (b_, n_), dt), rand(rng, (b_, m_), dt))


_reg(
    "product",
    "outer products found (outer_of); a dot_general contracting no axis -> a[.., :, None] * b[.., None, :]",
    False,  # a GPU's float32 dot under DEFAULT precision may round its operands to TF32; this not
    list,  # no egglog rewrites: written for each such dot before saturation
    "batch axes leading on both operands; one precision; the result type theirs or one in which "
    "their product is exact (bfloat16/float16 -> float32)",
    _products_example,
    seed=_seed_outer_products,
)


# --- sums of outer products ---------------------------------------------------------------------


def _factored(square, wide):
    """The factors' sums for Σ_{i,j} f(p_i q_j) past V.nb batch axes, f the identity or the
    square: (Σ f(p))(Σ f(q)), in float32 where `wide` (a bfloat16 program summing in float32)."""
    own = Vec[i64](V.nb)

    def side(t):
        t = pow_(t, 2) if square else t
        return sum_(Tensor.convert_element_type(t, F32) if wide else t, own)

    return mul(side(A), side(B))


def _summed(f):
    """(Σ f(t) as written, conditions binding V.nb) for t = O over both product axes, or O
    flattened to [.., n·m] (a per-example gradient raveled, as DP code often norms it) over the
    last, past nb <= 1 batch axes. The same sum either way: the flattening keeps the order."""
    yield f(O), (eq(V.dims).to(Vec[i64](V.nb, V.nb + 1)),), V.dims
    for nb in (0, 1):
        flat = Tensor.reshape(O, sc)
        conds = (eq(V.nb).to(i64(nb)), eq(shape(O)).to(so), eq(sc.length()).to(i64(nb + 1)))
        conds += (eq(sc[nb]).to(so[nb] * so[nb + 1]), *(eq(sc[i]).to(so[i]) for i in range(nb)))
        yield f(flat), conds, ints(nb)


def _sums():
    # Σ_{i,j} p_i q_j -> (Σ p)(Σ q)   [past nb batch axes]
    out = []
    for inner, at, axes in _summed(lambda t: t):
        plain, upcast = sum_of(inner, axes)
        for (lhs, _, only), wide in ((plain, False), (upcast, True)):
            conds = (*_of(O, A, B, V.nb), *at, *(only or WIDE_RANGE))
            out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(_factored(False, wide))))
    return out


def _nan_where_inf_meets_zero(wide):
    """0, or NaN where the program's Σ (p_i q_j)² is NaN and the factored one is not: an Inf in
    p against a 0 in q (Inf·0 in one product; the factors' sums are Inf and a positive number)
    or the reverse. max|p|·min|q| + max|q|·min|p| is NaN exactly there (no NaN in p or q, where
    both are NaN anyway); capped at 1, times 0, it adds 0 or NaN."""
    own = Vec[i64](V.nb)
    dt = String(F32) if wide else V.d
    p, q = (Tensor.unary("abs", Tensor.convert_element_type(t, F32) if wide else t) for t in (A, B))
    cross = Tensor.add(
        mul(Tensor.reduce_max(p, own), Tensor.reduce_min(q, own)),
        mul(Tensor.reduce_max(q, own), Tensor.reduce_min(p, own)),
    )
    return mul(Tensor.binary("min", cross, Tensor.scalar(1, 1, dt)), Tensor.scalar(0, 1, dt))


def _norms():
    # Σ_{i,j} (p_i q_j)² -> (Σ p²)(Σ q²) + [NaN where an Inf meets a 0]   [past nb batch axes]
    out = []
    for inner, at, axes in _summed(lambda t: pow_(t, 2)):
        plain, upcast = sum_of(inner, axes)
        for (lhs, _, only), wide in ((plain, False), (upcast, True)):
            rhs = Tensor.add(_factored(True, wide), _nan_where_inf_meets_zero(wide))
            conds = (*_of(O, A, B, V.nb), *at, *(only or WIDE_RANGE), float_dtype(V.d))
            out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs)))
    return out


def _batch_sum():
    # Σ_b p_b ⊗ q_b -> pᵀq   [p: b x n, q: b x m]: the batch axis contracted by one dot
    out = []
    for lhs, up, only in sum_of(O, ints(0)):
        rhs = up(Tensor.dot(A, B, 0, 0, 0, DEFAULT_CFG))
        conds = (*_of(O, A, B, 1), *(only or WIDE_RANGE))
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs)))
    # Σ_b c_b p_b ⊗ q_b written as a contraction with c (optax's per_example_global_norm_clip:
    # jnp.tensordot(c, g, axes=1)) -> (c∘p)ᵀq, in the contraction's own configuration
    scaled = Tensor.dot(mul(A, bcast(C, sa, ints(0))), B, 0, 0, 0, V.c)
    for lhs in (Tensor.dot(C, O, 0, 0, 0, V.c), Tensor.dot(O, C, 0, 0, 0, V.c)):
        conds = (*_of(O, A, B, 1), rank(C, 1), *same_dtype(C, x), eq(shape(A)).to(sa), *WIDE_RANGE)
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(scaled)))
    return out


def _sums_example(rng, dt):
    import jax.numpy as jnp
    from jax import lax

    b_, n_, m_ = sizes(rng, 3, 2, 17)

    def f(p, q, pb, qb):
        one = lax.broadcast_in_dim(p, (n_, m_), (0,)) * lax.broadcast_in_dim(q, (n_, m_), (1,))
        per = lax.broadcast_in_dim(pb, (b_, n_, m_), (0, 1)) * lax.broadcast_in_dim(qb, (b_, n_, m_), (0, 2))
        weighted = jnp.tensordot(pb[:, 0], per, axes=1)  # Σ_b c_b p_b ⊗ q_b
        flat = jnp.sum(per.reshape(b_, -1) ** 2, axis=1)  # raveled per example
        return jnp.sum(one), jnp.sum(per**2, axis=(1, 2)), jnp.sum(per, axis=0), weighted, flat

    args = (rand(rng, (n_,), dt), rand(rng, (m_,), dt), rand(rng, (b_, n_), dt), rand(rng, (b_, m_), dt))
    return f, args


_reg(
    "sum",
    "Σ_ij p_i q_j -> (Σ p)(Σ q), per batch entry",
    False,
    _sums,
    "p, q vectors past the same batch axes, their outer product summed over both product axes; "
    "one dtype, not float16 or narrower",
    _sums_example,
)
_reg(
    "norm",
    "Σ_ij (p_i q_j)² -> (Σ p²)(Σ q²), per batch entry, NaN where an Inf in one meets a 0 in the other",
    False,
    _norms,
    "p, q real vectors past the same batch axes, the square of their outer product summed over both "
    "product axes; one dtype, not float16 or narrower",
    _sums_example,
    FLOAT,
)
_reg(
    "batch_sum",
    "Σ_b p_b ⊗ q_b -> pᵀq, Σ_b c_b p_b ⊗ q_b -> (c∘p)ᵀq (the batch axis contracted)",
    False,
    _batch_sum,
    "p [b, n] and q [b, m] broadcast to [b, n, m]; summed over b, or contracted with c [b]; one dtype",
    _sums_example,
)


# --- moving an outer product ------------------------------------------------------------------


def _transpose():
    # (p ⊗ q)ᵀ -> q ⊗ p   [the last two axes swapped, past nb batch axes]: computed in the
    # transposed layout directly, where the program would copy its product (jax.grad transposes
    # a vmapped dot's [b, m, n] result)
    out = []
    for nb in BATCHES:
        swap = ints(*range(nb), nb + 1, nb)
        swapped = rule(eq(x).to(Tensor.transpose(O, swap)), outer_of(O, A, B, nb), eq(shape(x)).to(sc))
        out.append(swapped.then(outer_of(x, B, A, nb), union(x).with_(_full(B, A, nb, sc))))
    return out


def _scale():
    # (p_b ⊗ q_b) c_b -> (c_b p_b) ⊗ q_b   [a per-example scale, broadcast from c: b]
    out = []
    s = bcast(C, sS, ints(0))
    scaled = mul(A, bcast(C, sa, ints(0)))
    for lhs in (mul(O, s), mul(s, O)):
        conds = (*_of(O, A, B, 1), rank(C, 1), *same_dtype(C, x), *WIDE_RANGE)
        conds += (eq(shape(O)).to(so), eq(shape(x)).to(so), eq(shape(A)).to(sa))
        rhs = _full(scaled, B, 1, so)
        out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(rhs), outer_of(x, scaled, B, i64(1))))
    return out


def _moves_example(rng, dt):
    import jax.numpy as jnp
    from jax import lax

    b_, n_, m_ = sizes(rng, 3, 2, 17)

    def f(p, q, c):
        per = lax.broadcast_in_dim(p, (b_, n_, m_), (0, 1)) * lax.broadcast_in_dim(q, (b_, n_, m_), (0, 2))
        return jnp.swapaxes(per, 1, 2) * c[:, None, None], c[:, None, None] * per

    return f, (rand(rng, (b_, n_), dt), rand(rng, (b_, m_), dt), rand(rng, (b_,), dt))


_reg(
    "transpose",
    "(p ⊗ q)ᵀ -> q ⊗ p (the product axes swapped)",
    True,
    _transpose,
    "p, q vectors past the same batch axes, broadcast to their outer product",
    _moves_example,
)
_reg(
    "scale",
    "(p_b ⊗ q_b) c_b -> (c_b p_b) ⊗ q_b",
    False,
    _scale,
    "p [b, n] and q [b, m] broadcast to [b, n, m], times c [b] broadcast along the batch axis; one dtype",
    _moves_example,
)

__all__: list[str] = []

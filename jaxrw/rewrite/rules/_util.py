"""Helpers the rule families share: pattern variables, side conditions and example inputs."""

from __future__ import annotations

import numpy as np
from egglog import String, Vec, eq, i64, ne, vars_

from ..terms import Tensor, dtype, shape

__all__ = [
    "rand",
    "sizes",
    "same_dtype",
    "not_own_term",
    "rank",
    "FLOAT",
    "RING",
    "V",
    "FAST_ONLY",
    "NONFINITE_SAFE",
    "F32",
    "LOW",
    "NARROWER",
    "sum_of",
    "ints",
    "WIDE_RANGE",
]

# Dtypes an example is checked in: FLOAT for rules exact only over the reals or in floating point,
# RING for rules that also hold in integer arithmetic with wrap-around (rings Z/2^n): sums and
# products reassociate and distribute there, so such rules are sound for int32 too.
FLOAT = ("float32", "bfloat16")
RING = ("float32", "bfloat16", "int32")


# Rules that may turn a NaN/Inf result finite (or the reverse) even where the non-finite inputs reach
# the result in the program as written: they drop or add products with zero (x·0 -> 0, I@A -> A,
# where(I, X, 0) -> X∘I) or hold only on a domain or without overflow (exp(log x) -> x for x > 0,
# log(exp x) -> x, sqrt(x²) -> |x|). Issue 7's numerics="fast" level is where they belong;
# "default" keeps reassociation (which can only swap NaN and Inf for non-finite inputs).
FAST_ONLY = frozenset(
    {
        "dot.zero",
        "dot.identity",
        "elementwise.mul_zero",
        "elementwise.exp_log",
        "elementwise.sqrt",
        "reduce.diag_dot_eye",
        "structured.select_eye",
        "structured.diag_sides",
        # not finite-only, but of another accuracy: Gram products that cancel to a small norm, with
        # an error of u |X|²|Δ|² where the program's is u |X||Δ||G| (rules/ghost.py, a review)
        "ghost.norm",
    }
)


# Inexact rules that still keep every NaN and Inf where it was: inexact only through the
# accumulation type of a dot or the order of one sum of the same products (a sum's non-finite
# result, NaN or which Inf, does not depend on its order). The others distribute a product over
# a sum (factoring, reassociating a chain, moving a scale), which changes which products are
# formed and can swap NaN and Inf, or change the sign of a zero (a + 0 -> a, (-A)@B -> -(A@B)),
# which a divisor turns into the sign of an Inf (1/-0 = -inf, and exp of that is 0 where jax.jit
# gives inf): numerics="default" keeps those away from values that reach a saturating function
# (nonfinite.py).
NONFINITE_SAFE = frozenset(
    {
        "elementwise.commute",  # exact but for which product XLA fuses into an FMA (elementwise.py)
        "dot.adopt_cfg",
        "reduce.split_sum",
        "reduce.diag_dot",
        "reduce.platform_diagonal",  # where(I, x, 0) summed keeps each diagonal entry as it is
        "reduce.sum_transpose",  # the same elements summed in another order
        "reduce.weighted_sum",
        "outer.product",  # each element the one product the dot forms
        # NaN added where an Inf meets a 0 (outer.py): the program's NaN and Inf kept
        "outer.norm",
    }
)


F32 = "float32"
LOW = ("bfloat16", "float16")


def _narrower_floats() -> tuple[str, ...]:
    """ml_dtypes' floats narrower than float16 (float8_*, float6_*, float4_*): a product of two
    rounds or overflows there where the dot's float32 product does not (a float8_e5m2 trace with
    320·320 - 320·320 on its diagonal was NaN, jax.jit's 0); diag_dot leaves their sums as written."""
    import ml_dtypes

    names = []
    for name in dir(ml_dtypes):
        try:
            if name.startswith("float") and ml_dtypes.finfo(getattr(ml_dtypes, name)).bits < 16:
                names.append(name)
        except (TypeError, ValueError):  # not a float type
            pass
    return tuple(names)


NARROWER = _narrower_floats()


def sum_of(inner, axes, narrow=LOW[:1]):
    """Σ inner as programs write it: directly, or over inner upcast to float32 (jnp's sum of a
    bf16 or f16 array). Yields (pattern, up, only): `up` applies the same upcast to a replacement;
    `only` (conditions, with V.d bound to inner's dtype) names the one `narrow` dtype each upcast
    pattern is for. A replacement that computes in inner's own dtype what the program summed in
    float32 may take only bfloat16, whose range is float32's: an int32 or float16 sum written in
    float32 (`sum(x, dtype=f32)`) would wrap or overflow in its own type."""
    yield Tensor.sum(inner, axes), lambda t: t, ()
    upcast = Tensor.convert_element_type(inner, F32)
    for dt in narrow:
        only = (eq(V.d).to(String(dt)),)
        yield Tensor.sum(upcast, axes), lambda t: Tensor.convert_element_type(t, F32), only


class _Vars:
    """Pattern variables, shared by the families (egglog variables are just names)."""

    def __init__(self):
        self.A, self.B, self.C, self.D, self.E, self.X, self.Y, self.Z, self.S, self.T, self.K, self.M = (
            vars_("A B C D E X Y Z S T K M", Tensor)
        )
        self.x, self.y, self.z, self.w = vars_("x y z w", Tensor)
        self.nb, self.l, self.r, self.c, self.q, self.ax, self.s0, self.s1 = vars_("nb l r c q ax s0 s1", i64)
        self.n, self.m, self.k, self.o, self.p, self.lv, self.i, self.j = vars_("n m k o p lv i j", i64)
        self.sa, self.sb, self.sc, self.so, self.perm, self.dims = vars_("sa sb sc so perm dims", Vec[i64])
        (self.d,) = vars_("d", String)
        (self.args,) = vars_("args", Vec[Tensor])


V = _Vars()

# Conditions: V.d is not float16 or narrower, where products overflow within reach of ordinary
# values (past 256 squared, 65504 in all) while bfloat16 has float32's range: the outer and ghost
# families' squares, scales and float32 sums of rounded products (reviews)
WIDE_RANGE = tuple(ne(V.d).to(String(n)) for n in ("float16", *NARROWER))


def ints(*a: int) -> Vec:
    """A literal Vec[i64] of `a` (axes, dims and shapes in patterns)."""
    return Vec[i64](*[i64(v) for v in a])


def same_dtype(*ts):
    """All of `ts` have dtype V.d (so no rule changes a type)."""
    return [eq(dtype(t)).to(V.d) for t in ts]


def not_own_term(*terms):
    """Conditions: the matched sum V.x is none of its `terms`. A class that holds its own sum is a
    zero (0 + 0 = 0 by elementwise.add_zero, X·0 + X·0 by like terms); gathering or factoring
    there makes new coefficients and operands without end (a new user's custom_jvp, whose zero
    tangents add up: 5,000 nodes for 4 equations; a review: (A@B)·0 + (A@B)·0)."""
    return [ne(V.x).to(t) for t in terms]


def rank(t, r: int):
    return eq(shape(t).length()).to(i64(r))


def rand(rng, shape_, dt):
    """Random inputs of a dtype: normal floats (complex: both parts), small integers (so int32
    products stay exact)."""
    import jax.numpy as jnp

    if np.dtype(jnp.dtype(dt)).kind in "iu":
        return jnp.asarray(rng.integers(-4, 5, size=shape_).astype(np.int32)).astype(dt)
    if np.dtype(jnp.dtype(dt)).kind == "c":  # both parts random: the test of complex rules
        return jnp.asarray(rng.standard_normal(shape_) + 1j * rng.standard_normal(shape_)).astype(dt)
    return jnp.asarray(rng.standard_normal(shape_).astype(np.float32)).astype(dt)


def positive_rand(rng, shape_, dt):
    import jax.numpy as jnp

    return jnp.asarray(rng.uniform(0.5, 2.0, size=shape_).astype(np.float32)).astype(dt)


# Example sizes come from a small pool (random per draw), so the soundness tests, which compile
# every op for every shape they meet, reuse compilations across rules and seeds.
_POOL = (1, 2, 3, 5, 8, 12, 16, 24, 32)


def sizes(rng, k: int, lo: int = 8, hi: int = 40) -> list[int]:
    """`k` random sizes in [lo, hi) drawn from the pool (any size there if none falls inside)."""
    pool = [s for s in _POOL if lo <= s < hi] or list(range(lo, hi))
    return [int(x) for x in rng.choice(pool, size=k)]

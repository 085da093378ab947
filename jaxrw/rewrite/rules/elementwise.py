"""Elementwise algebra: commutativity, identities, exp/log/sqrt/power laws, common factors, max/min.

exp/log/sqrt identities are stated only where their domain holds: `positive(x)` and `nonneg(x)`
(terms.py) are derived from the program (exp(·) > 0, x·x >= 0, positive literals, sums and
products of positives). They are exact only in real arithmetic (exp(x) overflows where x does
not), except the rules tagged exact: commutativity, double negation, x - (-y), x·1, x/1, x**2 as
x·x, and max/min over a concatenation, which round nowhere.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rewrite, rule, union

from ..terms import Tensor, dtype, float_dtype, nonneg, positive, shape
from ..terms import fill as fill_
from . import Rule, register_rule
from ._util import FLOAT, RING, V, not_own_term, positive_rand, rand, rank, same_dtype, sizes

A, B, C, X, Z = V.A, V.B, V.C, V.X, V.Z
x = V.x
ax, d, so = V.ax, V.d, V.so
add, sub, mul, div, neg = Tensor.add, Tensor.sub, Tensor.mul, Tensor.div, Tensor.neg


def _u(name, t):
    return Tensor.unary(name, t)


def _reg(name, identity, exact, build, conditions, example, dtypes=FLOAT):
    register_rule(
        Rule(f"elementwise.{name}", "elementwise", identity, exact, build, conditions, example, dtypes)
    )


def _keeps_shape(t, whole):
    """t already has the shape of the elementwise result (the other operand only broadcasts)."""
    return eq(shape(t)).to(shape(whole))


# --- commutativity and signs ----------------------------------------------------------------------


def _commute():
    # a + b -> b + a;  a·b -> b·a
    return [rewrite(add(A, B)).to(add(B, A)), rewrite(mul(A, B)).to(mul(B, A))]


def _signs():
    # -(-a) -> a;  a + (-b) -> a - b;  a - (-b) -> a + b
    return [
        rewrite(neg(neg(A))).to(A),
        rewrite(add(A, neg(B))).to(sub(A, B)),
        rewrite(sub(A, neg(B))).to(add(A, B)),
    ]


def _commute_example(rng, dt):
    m, n_ = sizes(rng, 2)
    return (lambda a, b: (a * b + b, a + b * 2)), (rand(rng, (m, n_), dt), rand(rng, (m, n_), dt))


def jnp_neg(a):
    return -a


def _signs_example(rng, dt):
    m, n_ = sizes(rng, 2)
    return (lambda a, b: (-jnp_neg(a) + b, a + (-b), a - (-b))), (
        rand(rng, (m, n_), dt),
        rand(rng, (m, n_), dt),
    )


# not tagged exact: XLA contracts a*b + c*d into a fused multiply-add with the first product, so
# commuting the add rounds differently (1 ULP in a third of float32 elements on CPU) and, where
# both products overflow, gives NaN where jax.jit gives Inf (a review found it through autotune's
# runner-ups under "strict"). Unguarded under "default" (_util.NONFINITE_SAFE), as before.
_reg("commute", "a+b -> b+a, a·b -> b·a", False, _commute, "none", _commute_example, RING)
_reg("signs", "-(-a) -> a, a+(-b) -> a-b, a-(-b) -> a+b", True, _signs, "none", _signs_example, RING)


# --- identities ----------------------------------------------------------------------------------


def _one():
    # a·1 -> a;  1·a -> a;  a/1 -> a   (1 a literal or its broadcast, no wider than a)
    out = []
    for whole in (mul(A, Z), mul(Z, A), div(A, Z)):
        conds = (eq(fill_(Z)).to(1.0), _keeps_shape(A, whole), *same_dtype(A, Z))
        out.append(rule(eq(x).to(whole), *conds).then(union(x).with_(A)))
    return out


def _add_zero():
    # a + 0 -> a;  a - 0 -> a   (x + 0 turns -0 into +0: exact in value, not in sign)
    out = []
    for whole in (add(A, Z), add(Z, A), sub(A, Z)):
        conds = (eq(fill_(Z)).to(0.0), _keeps_shape(A, whole), *same_dtype(A, Z))
        out.append(rule(eq(x).to(whole), *conds).then(union(x).with_(A)))
    return out


def _mul_zero():
    # a·0 -> 0   (inf·0 is NaN: the rewrite makes a non-finite result finite)
    out = []
    for whole in (mul(A, Z), mul(Z, A)):
        conds = (eq(fill_(Z)).to(0.0), eq(so).to(shape(x)), *same_dtype(A, Z, x))
        zero = Tensor.broadcast_in_dim(Tensor.scalar(0, 1, d), so, Vec[i64].empty())
        out.append(rule(eq(x).to(whole), *conds).then(union(x).with_(zero)))
    return out


def _identities_example(rng, dt):
    import jax.numpy as jnp

    m, n_ = sizes(rng, 2)
    return (lambda a: (a * 1 + jnp.zeros_like(a), (a / 1 - 0) * jnp.ones((m, n_), a.dtype), a * 0)), (
        rand(rng, (m, n_), dt),
    )


_reg(
    "one",
    "a·1 -> a, a/1 -> a",
    True,
    _one,
    "1 a literal or a broadcast of one; one dtype",
    _identities_example,
    RING,
)
_reg(
    "add_zero",
    "a+0 -> a, a-0 -> a",
    False,
    _add_zero,
    "0 a literal or a broadcast of one, no wider than a; one dtype",
    _identities_example,
    RING,
)
_reg(
    "mul_zero",
    "a·0 -> 0",
    False,
    _mul_zero,
    "0 a literal or a broadcast of one; one dtype (inf·0 is NaN)",
    _identities_example,
    RING,
)


# --- exp, log, sqrt, powers ----------------------------------------------------------------------


def _exp_log():
    # exp(a)·exp(b) -> exp(a+b);  exp(a)/exp(b) -> exp(a-b);  log(exp(a)) -> a;
    # exp(log(a)) -> a  [a > 0];  log(a) + log(b) -> log(a·b), log(a) - log(b) -> log(a/b)  [a, b > 0]
    e = _u("exp", A), _u("exp", B)
    same = eq(shape(A)).to(shape(B))
    return [
        rewrite(mul(*e)).to(_u("exp", add(A, B)), same),
        rewrite(div(*e)).to(_u("exp", sub(A, B)), same),
        rewrite(_u("log", _u("exp", A))).to(A, float_dtype(dtype(A))),  # complex: log wraps the phase
        rule(eq(x).to(_u("exp", _u("log", A))), positive(A)).then(union(x).with_(A)),
        rule(eq(x).to(add(_u("log", A), _u("log", B))), positive(A), positive(B), same).then(
            union(x).with_(_u("log", mul(A, B)))
        ),
        rule(eq(x).to(sub(_u("log", A), _u("log", B))), positive(A), positive(B), same).then(
            union(x).with_(_u("log", div(A, B)))
        ),
    ]


def _exp_log_example(rng, dt):
    import jax.numpy as jnp

    m, n_ = sizes(rng, 2)

    def f(a, b, p):
        q = jnp.exp(b)
        return (
            jnp.exp(a) * jnp.exp(b),
            jnp.exp(a) / q,
            jnp.log(jnp.exp(a)),
            jnp.exp(jnp.log(q)),
            jnp.log(q) + jnp.log(q * 2),
            jnp.log(q) - jnp.log(jnp.exp(a)),
        )

    return f, (rand(rng, (m, n_), dt) * 0.5, rand(rng, (m, n_), dt) * 0.5, positive_rand(rng, (m, n_), dt))


def _sqrt():
    # sqrt(a·a) -> |a|;  sqrt(a)·sqrt(a) -> a  [a >= 0];  a ** 0.5 -> sqrt(a);  a ** 2 (float) -> a·a
    r = _u("sqrt", A)
    return [
        rewrite(_u("sqrt", mul(A, A))).to(_u("abs", A), float_dtype(dtype(A))),  # not complex
        rewrite(_u("sqrt", Tensor.integer_pow(A, 2))).to(_u("abs", A), float_dtype(dtype(A))),
        rule(eq(x).to(mul(r, r)), nonneg(A)).then(union(x).with_(A)),
        rule(eq(x).to(Tensor.binary("pow", A, Z)), eq(fill_(Z)).to(0.5), _keeps_shape(A, x)).then(
            union(x).with_(_u("sqrt", A))
        ),
    ]


def _square():
    # a ** 2 <-> a·a;  square(a) -> a·a   (integer_pow(a, 2) and lax.square, jnp.square's
    # primitive since jax 0.4.36, are computed as a·a: exact)
    return [
        rewrite(Tensor.integer_pow(A, 2)).to(mul(A, A)),
        rewrite(mul(A, A)).to(Tensor.integer_pow(A, 2)),
        rewrite(_u("square", A)).to(mul(A, A)),
    ]


def _sqrt_example(rng, dt):
    import jax.numpy as jnp

    m, n_ = sizes(rng, 2)
    return (lambda a, p: (jnp.sqrt(a * a), jnp.sqrt(a**2), jnp.sqrt(p * p) * jnp.sqrt(p * p), p**0.5)), (
        rand(rng, (m, n_), dt),
        positive_rand(rng, (m, n_), dt),
    )


def _square_example(rng, dt):
    from jax import lax

    m, n_ = sizes(rng, 2)
    return (lambda a: (a**2 + 1, a * a - 1, lax.square(a) - 2)), (rand(rng, (m, n_), dt),)


_reg(
    "exp_log",
    "exp(a)exp(b) -> exp(a+b), log(exp(a)) -> a, exp(log a) -> a, log a + log b -> log ab",
    False,
    _exp_log,
    "exp(log a) and the log sums only for a, b > 0 (derived); a, b one shape",
    _exp_log_example,
)
_reg(
    "sqrt",
    "sqrt(a²) -> |a|, sqrt(a)² -> a, a**0.5 -> sqrt(a)",
    False,
    _sqrt,
    "sqrt(a)·sqrt(a) only for a >= 0 (derived); the exponent a literal 0.5",
    _sqrt_example,
)
_reg("square", "a**2 <-> a·a, square(a) -> a·a", True, _square, "integer power 2", _square_example, RING)


# --- common factors ------------------------------------------------------------------------------


def _factor():
    # a·b ± a·c -> a·(b ± c)   [b, c one shape; not where the sum is a, a·b or a·c itself: a
    # zero, see _util.not_own_term]
    out = []
    for combine in (add, sub):
        conds = (eq(shape(B)).to(shape(C)), *same_dtype(A, B, C))
        for ab, ac, factored in (
            (mul(A, B), mul(A, C), mul(A, combine(B, C))),
            (mul(B, A), mul(C, A), mul(combine(B, C), A)),
        ):
            own = not_own_term(A, ab, ac)
            out.append(rule(eq(x).to(combine(ab, ac)), *conds, *own).then(union(x).with_(factored)))
    return out


def _factor_example(rng, dt):
    m, n_ = sizes(rng, 2)
    return (lambda a, b, c: (a * b + a * c, b * a - c * a)), tuple(rand(rng, (m, n_), dt) for _ in range(3))


_reg("factor", "a·b ± a·c -> a·(b±c)", False, _factor, "b, c one shape; one dtype", _factor_example, RING)


# --- max and min over concatenations and stacks ----------------------------------------------------


def _reduce_concat():
    # max_ax [X | Y] -> max(max_ax X, max_ax Y) (min likewise);  max over a unit axis of an expand -> a
    out = []
    for red, name in ((Tensor.reduce_max, "max"), (Tensor.reduce_min, "min")):
        axes = V.dims
        lhs = red(Tensor.concat(X, Z, ax), axes)
        one_axis = (eq(axes.length()).to(i64(1)), eq(axes[0]).to(ax))
        out.append(rewrite(lhs).to(Tensor.binary(name, red(X, axes), red(Z, axes)), *one_axis))
        for rk in range(3):
            for a_ in range(rk + 1):
                dims = Vec[i64](*[i64(i if i < a_ else i + 1) for i in range(rk)])
                conds = (rank(A, rk), eq(so[a_]).to(i64(1)), eq(shape(A)).to(so.remove(a_)))
                expand = Tensor.broadcast_in_dim(A, so, dims)
                out.append(rule(eq(x).to(red(expand, Vec[i64](i64(a_)))), *conds).then(union(x).with_(A)))
    return out


def _reduce_concat_example(rng, dt):
    import jax.numpy as jnp

    m, n_ = sizes(rng, 2)
    xs = [rand(rng, (m, n_), dt) for _ in range(3)]
    return (
        lambda a, b, c: (jnp.max(jnp.stack([a, b, c]), axis=0), jnp.min(jnp.concatenate([a, b], 1), 1))
    ), tuple(xs)


_reg(
    "reduce_concat",
    "max_ax [X|Y] -> max(max_ax X, max_ax Y), max over an inserted unit axis -> a",
    True,
    _reduce_concat,
    "one axis; min likewise (stacks through merge.stack_unfold)",
    _reduce_concat_example,
    RING,
)

__all__: list[str] = []

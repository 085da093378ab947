"""Side conditions a review found missing: each program below was rewritten into a different value
(far beyond rounding) before its rule's condition was added. Each test checks the rule no longer
fires on it and that `optimize` then computes what jax.jit computes."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrw
from jaxrw.rewrite.encode import encode
from jaxrw.rewrite.rules import select_rules

from .harness import flat_jaxpr, run_rules

select_rules(None)  # load every family: the tests name rules one by one


def _normal(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _fired(fn, args, rule):
    return run_rules(fn, args, [rule]).report.rules_fired.get(rule, 0)


def _as_jit(fn, args, rtol=1e-5, **options):
    np.testing.assert_allclose(jaxrw.optimize(fn, **options)(*args), jax.jit(fn)(*args), rtol=rtol)


def test_bcast_rows_needs_a_matrix_broadcast():
    # a rank-3 fill contracted on its middle axis: w·B's axis is not the output's axis 1
    fn = lambda s, b: jnp.tensordot(jnp.full((8, 32, 16), s), b, axes=([1], [0]))  # noqa: E731
    args = (jnp.float32(2.0), _normal(0, 32, 16))
    assert _fired(fn, args, "structured.bcast_rows") == 0
    _as_jit(fn, args, numerics="strict")


def test_expand_dot_keeps_the_broadcast_of_a_size_one_product():
    # A·v has length 1 here, and broadcast_in_dim spreads it over 5 rows: not a column of A·v
    a = _normal(1, 1, 64)
    vs = [_normal(2 + i, 64) for i in range(4)]

    def fn(a, *vs):
        return jnp.concatenate([lax.broadcast_in_dim(a @ v, (5, 1), (0,)) for v in vs], 1).sum(0)

    assert _fired(fn, (a, *vs), "merge.expand_dot") == 0
    _as_jit(fn, (a, *vs), numerics="strict")


def test_literals_that_print_alike_stay_distinct_constants():
    # jax 0.12's literal repr rounds to 0.00012; the two products differ by 3e-9 relative
    fn = lambda y: (y * 0.000120001, y * 0.000120004)  # noqa: E731
    program = encode(flat_jaxpr(fn, (_normal(3, 8),))[0])
    assert len(program.consts) == 2
    a = _normal(4, 32, 32)
    mat = lambda a, v: ((a @ a) @ v * 0.000120001 - (a @ a) @ v * 0.000120004) * 1e9  # noqa: E731
    got = jaxrw.optimize(mat)(a, a[0])
    assert np.abs(np.asarray(got)).max() > 1e-3  # not folded to zero


@pytest.mark.parametrize(
    "rule,fn,args",
    [
        # sum(x*w, dtype=float32): summed in float32, which int32 and float16 would overflow
        (
            "reduce.weighted_sum",
            lambda x, w: jnp.sum(x * w, dtype=jnp.float32),
            (jnp.full((4096,), 2**20, jnp.int32), jnp.ones((4096,), jnp.int32)),
        ),
        (
            "reduce.weighted_sum",
            lambda x, w: jnp.sum(x * w, dtype=jnp.float32),
            (jnp.full((4096,), 30.0, jnp.float16), jnp.ones((4096,), jnp.float16)),
        ),
        (
            "reduce.sum_dot",
            lambda a, b: (a @ b).astype(jnp.float32).sum(0),
            (jnp.full((256, 128), 2**16, jnp.int32), jnp.ones((128, 128), jnp.int32)),
        ),
        # the trace the program computes in int32 (wrapping) is not the float32 sum
        (
            "reduce.diag_dot",
            lambda a, b: jnp.trace(a @ b, dtype=jnp.float32),
            (jnp.full((256, 4), 2**30, jnp.int32), jnp.ones((4, 256), jnp.int32)),
        ),
    ],
    ids=["weighted_sum-int32", "weighted_sum-float16", "sum_dot-int32", "diag_dot-int32"],
)
def test_a_float32_sum_of_a_narrow_type_stays_in_float32(rule, fn, args):
    assert _fired(fn, args, rule) == 0
    np.testing.assert_array_equal(jaxrw.optimize(fn)(*args), jax.jit(fn)(*args))


def test_a_float8_trace_of_a_product_is_left_to_the_dot():
    # the dot forms float8 products in float32; the rewrite rounded 320·320 to float8_e5m2 (Inf)
    # and summed Inf - Inf: NaN where jax.jit's trace is 0.25·63 + 0 (a helper's fuzzing)
    n, dt = 64, jnp.float8_e5m2
    a = np.eye(n, dtype=np.float32) * 0.25
    b = a.copy()
    a[0, :2] = 320.0
    b[0, 0], b[1, 0] = 320.0, -320.0
    args = (jnp.asarray(a, dt), jnp.asarray(b, dt))
    fn = lambda a, b: jnp.trace(a @ b)  # noqa: E731
    assert _fired(fn, args, "reduce.diag_dot") == 0
    want = jax.jit(fn)(*args)
    assert np.isfinite(float(want))
    np.testing.assert_array_equal(jaxrw.optimize(fn)(*args), want)


def test_bf16_sums_written_in_float32_still_become_dots():
    # bfloat16 has float32's range: the upcast form is still taken there
    x = _normal(5, 64).astype(jnp.bfloat16)
    fn = lambda x, w: jnp.sum(x * w, dtype=jnp.float32)  # noqa: E731
    assert _fired(fn, (x, x), "reduce.weighted_sum") > 0


def test_diag_dot_eye_needs_the_product_at_the_identity_shape():
    # (1,1) * eye(64): lax broadcasts the size-1 product over the whole identity
    a = _normal(6, 1, 512)
    fn = lambda a, b: ((a @ b) * jnp.eye(64)).sum()  # noqa: E731
    assert _fired(fn, (a, a.T), "reduce.diag_dot_eye") == 0
    _as_jit(fn, (a, a.T), rtol=1e-4, numerics="fast")


@pytest.mark.parametrize(
    "n,dtype,grow",
    [(1, jnp.int32, 5), (258, jnp.bfloat16, None), (258, jnp.uint8, None)],
    ids=["size-1-iota-broadcast", "bf16-iota", "uint8-iota"],
)
def test_an_identity_mask_counts_every_index_at_its_own_shape(n, dtype, grow):
    # iota0 == iota1 is the identity only in a type that holds every index, on the iotas' shape
    def fn(a, b):
        i0, i1 = (lax.broadcasted_iota(dtype, (n, n), axis) for axis in (0, 1))
        if grow is not None:  # a (1, 1) iota plus a (5, 5) zero: all zeros, broadcast implicitly
            i0 = lax.add(i0, lax.full((grow, grow), 0, dtype))
        return jnp.where(lax.eq(i0, i1), a @ b, 0.0).sum()

    size = grow or n
    args = (_normal(7, size, 8), _normal(8, 8, size))
    assert _fired(fn, args, "reduce.diag_dot") == 0
    _as_jit(fn, args, rtol=1e-4)


def test_neg_out_needs_the_product_in_the_operands_dtype():
    # -a wraps in int8; the int32 product of preferred_element_type does not
    fn = lambda a, b: lax.dot(-a, b, preferred_element_type=jnp.int32)  # noqa: E731
    a = jnp.asarray(np.random.default_rng(9).integers(-128, 128, (64, 64)), jnp.int8).at[0, 0].set(-128)
    args = (a, jnp.ones((64, 1), jnp.int8))
    assert _fired(fn, args, "dot.neg_out") == 0
    np.testing.assert_array_equal(jaxrw.optimize(fn)(*args), jax.jit(fn)(*args))


def test_a_float16_trace_multiplies_in_float32_as_the_dot_does():
    # the Hadamard products 300·300 overflow float16; the dot's float32 products did not
    fn = lambda a, b: lax.reduce_sum(jnp.where(jnp.eye(2, dtype=bool), a @ b, 0), (0, 1))  # noqa: E731
    args = (
        jnp.array([[300.0, 300.0], [1.0, 2.0]], jnp.float16),
        jnp.array([[300.0, 1.0], [-300.0, 1.0]], jnp.float16),
    )
    assert _fired(fn, args, "reduce.diag_dot") > 0
    np.testing.assert_array_equal(jaxrw.optimize(fn)(*args), jax.jit(fn)(*args))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: jnp.trace(a @ b),  # summed in float32 by jnp
        lambda a, b: lax.reduce_sum(jnp.where(jnp.eye(64, dtype=bool), a @ b, 0), (0, 1)),
        lambda a, b: jnp.trace(a @ b, dtype=jnp.float32),
        lambda a, b: jnp.where(jnp.eye(64, dtype=bool), a @ b, 0).astype(jnp.float32).sum(1),
    ],
    ids=["trace", "in-float16", "float32-out", "diagonal"],
)
def test_a_float16_trace_overflows_where_the_dot_does(fn):
    # the dot rounds each diagonal entry to float16, some past its range (Inf, and NaN summed);
    # the trace summed straight from the float32 products was finite (a new user's try)
    rng = np.random.default_rng(4)
    args = tuple(jnp.asarray(100 * rng.standard_normal((64, 64)), jnp.float16) for _ in range(2))
    want = np.asarray(jax.jit(fn)(*args), np.float32)
    assert not np.isfinite(want).all() and _fired(fn, args, "reduce.diag_dot") > 0
    got = np.asarray(jaxrw.optimize(fn, limits=jaxrw.Limits(min_gain=0))(*args), np.float32)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=2e-2)


@pytest.mark.parametrize(
    "rule,fn",
    [
        ("elementwise.exp_log", lambda z: jnp.log(jnp.exp(z)) * 2),
        ("elementwise.sqrt", lambda z: jnp.sqrt(z * z) * 2),
    ],
    ids=["log-exp", "sqrt-square"],
)
def test_real_identities_do_not_touch_complex_numbers(rule, fn):
    z = jnp.tile(jnp.array([4j, 1 + 2j, -3 - 1j], jnp.complex64), 4)
    assert _fired(fn, (z,), rule) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback either
        np.testing.assert_allclose(jaxrw.optimize(fn, numerics="fast")(z), jax.jit(fn)(z), rtol=1e-5)


@pytest.mark.parametrize("outer", [jnp.exp, jnp.tanh], ids=["exp", "tanh"])
def test_a_sign_of_zero_change_stays_away_from_a_divisor(outer):
    # (-A)@B -> -(A@B) gives -0 where jax.jit gives +0: 1/x makes that -inf against +inf
    a = np.zeros((4, 4096), np.float32)  # wide enough that negating the product is cheaper
    a[:, 0], a[:, 1] = 1, -1
    args = (jnp.asarray(a), jnp.ones((4096, 1), jnp.float32))

    def fn(a, b):
        return outer(1.0 / ((-a) @ b))

    np.testing.assert_array_equal(jaxrw.optimize(fn)(*args), jax.jit(fn)(*args))


class _NoTransposes:
    """The roofline model, with a transpose priced high: `dot.transpose_out`'s form is taken."""

    name = "no-transposes"

    def __init__(self):
        from jaxrw.rewrite.cost import Roofline
        from jaxrw.rewrite.profiles import get_profile

        self.base = Roofline(get_profile("cpu"))

    def node_cost(self, node, view):
        return self.base.node_cost(node, view) + (1.0 if node.op == "transpose" else 0.0)


@pytest.mark.parametrize("precision", [(lax.Precision.HIGHEST, lax.Precision.DEFAULT), lax.Precision.HIGHEST])
def test_a_precision_per_operand_is_not_handed_to_the_other_operand(precision):
    # (a@b).T -> b.T@a.T swapped the operands but kept precision=(HIGHEST, DEFAULT) as written:
    # HIGHEST went to b (0.117 apart on a TPU, a new user's check). A dot asking one precision
    # for both is still rewritten
    def f(a, b):
        return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision).T

    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((16, 8), (8, 4)))
    opt = jaxrw.optimize(f, numerics="strict", cost_model=_NoTransposes(), limits=jaxrw.Limits(min_gain=0))
    np.testing.assert_allclose(opt(a, b), jax.jit(f)(a, b), rtol=1e-6)
    report = opt.report(a, b)
    one = not isinstance(precision, tuple)
    assert ("dot.transpose_out" in report.rules_fired) == one
    if one:
        after = str(jaxrw.explain(f, a, b, numerics="strict", cost_model=_NoTransposes()).jaxpr_after)
        assert "transpose" not in after and "HIGHEST" in after


def test_boolean_dots_are_left_as_written():
    # ones(bool) @ B became sum(B) (structured.const_vector_dot), which reduce_sum refuses for
    # bool: every call fell back with a warning, and strict raised. A boolean dot's sums are ORs
    def f(B, C):
        return jnp.ones((5,), bool) @ B, (B.T @ C) @ jnp.ones((3,), bool)

    rng = np.random.default_rng(1)
    B, C = (jnp.asarray(rng.integers(0, 2, s).astype(bool)) for s in ((5, 4), (5, 3)))
    for numerics in ("default", "fast", "strict"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = jaxrw.optimize(f, strict=True, numerics=numerics)(B, C)
        for g, w in zip(got, jax.jit(f)(B, C), strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w)

"""Dot algebra end to end: the extracted program reaches the hand-written optimum (XLA FLOPs).

Matrix chains use a pure-FLOPs cost model, because the classic dynamic program minimises
multiply-adds only; the other cases use jaxrw's default roofline model with the CPU profile (what
`optimize` uses on this machine), whose choice must also be the FLOP-optimal program here.
"""

from __future__ import annotations

from functools import reduce

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite.profiles import CPU
from jaxrw.rewrite.rules import RULES, select_rules

from .harness import PureFlops, optimized, reaches, xla_flops


def chain_dp(dims: list[int]) -> int:
    """Minimum FLOPs (2 per multiply-add) of the product of matrices dims[i] x dims[i+1]."""
    n = len(dims) - 1
    best = [[0] * n for _ in range(n)]
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            best[i][j] = min(
                best[i][k] + best[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j)
            )
    return 2 * best[0][n - 1]


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("seed", range(5))
def test_matrix_chain_order_is_the_dp_optimum(seed):
    rng = np.random.default_rng(seed)
    for _ in range(2):
        n = int(rng.integers(3, 13))
        dims = [int(x) for x in rng.integers(2, 48, size=n + 1)]
        mats = [_rand(rng, dims[i], dims[i + 1]) for i in range(n)]
        opt = optimized(
            lambda *ms: reduce(lambda a, b: a @ b, ms), tuple(mats), cost_model=PureFlops(), force=True
        )
        assert opt.flops == chain_dp(dims), (dims, opt.report)
        assert opt.report.stop_reason.value == "saturated"


def test_chain_times_thin_matrix_through_optimize():
    rng = np.random.default_rng(0)
    a, b, c = (_rand(rng, 256, 256) for _ in range(3))
    v = _rand(rng, 256, 4)
    fast = jaxrw.optimize(lambda a, b, c, v: a @ b @ c @ v, profile=CPU)
    want = xla_flops(lambda a, b, c, v: a @ (b @ (c @ v)), a, b, c, v)
    assert xla_flops(fast, a, b, c, v) <= 1.05 * want
    np.testing.assert_allclose(fast(a, b, c, v), a @ b @ c @ v, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("free", [(), (8,)])
def test_batched_chain_times_a_shared_operand(free):
    # A[b,n,n] @ B[b,n,n] @ v: the batched product and v's unbatched dot were never
    # reassociated (a new user measured 901 us vs 140 us by hand on a GPU)
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 4, 96, 96), _rand(rng, 4, 96, 96)
    v = _rand(rng, 96, *free)
    by_hand = lambda a, b, v: jnp.einsum("bij,bj...->bi...", a, jnp.tensordot(b, v, 1))  # noqa: E731
    opt = reaches(lambda a, b, v: a @ b @ v, by_hand, (a, b, v))
    assert opt.report.rules_fired.get("dot.assoc_right")


def test_batched_chain_contracted_off_its_last_axis_stays():
    # (A@B) contracted with v on A's free axis, not B's: no A@(B@v) computes it
    rng = np.random.default_rng(6)
    a, b, v = _rand(rng, 4, 64, 64), _rand(rng, 4, 64, 64), _rand(rng, 64)
    f = lambda a, b, v: jnp.einsum("bij,i->bj", a @ b, v)  # noqa: E731
    opt = optimized(f, (a, b, v), force=True)
    assert "dot.assoc_right" not in opt.report.rules_fired
    np.testing.assert_allclose(opt.fn(a, b, v)[0], f(a, b, v), rtol=2e-3, atol=2e-3)


def test_factoring_with_scalars_and_subtraction():
    rng = np.random.default_rng(1)
    a, b, c = (_rand(rng, 192, 192) for _ in range(3))
    opt = reaches(lambda a, b, c: a @ b - 0.5 * (a @ c), lambda a, b, c: a @ (b - 0.5 * c), (a, b, c))
    assert opt.dots == 1


def test_transposed_product_times_vector():
    rng = np.random.default_rng(2)
    a, b = _rand(rng, 256, 256), _rand(rng, 256, 256)
    v = _rand(rng, 256, 2)
    reaches(lambda a, b, v: (a @ b).T @ v, lambda a, b, v: b.T @ (a.T @ v), (a, b, v))


def test_identity_and_zero_products_vanish():
    rng = np.random.default_rng(3)
    a, b = _rand(rng, 128, 128), _rand(rng, 128, 128)
    f = lambda a, b: jnp.eye(128) @ a @ b + a @ jnp.zeros((128, 128))  # noqa: E731
    opt = reaches(f, lambda a, b: a @ b, (a, b), numerics="fast")  # finite-only rules (inf·0 is NaN)
    assert opt.dots == 1


def test_strict_numerics_selects_only_exact_rules():
    strict = select_rules(None, "strict")
    assert strict and all(r.exact for r in strict)
    assert {r.name for r in strict} == {n for n, r in RULES.items() if r.exact}
    assert "dot.assoc_right" not in {r.name for r in strict}
    rng = np.random.default_rng(4)
    a, b, c = (_rand(rng, 64, 64) for _ in range(3))
    v = _rand(rng, 64, 1)
    opt = optimized(lambda a, b, c, v: a @ b @ c @ v, (a, b, c, v), numerics="strict")
    assert opt.flops == xla_flops(lambda a, b, c, v: a @ b @ c @ v, a, b, c, v)


def test_a_scale_of_a_product_is_free_on_a_gpu():
    """XLA's GEMM rewriter applies s·(A@B) as cuBLAS's alpha: moving s into an operand gains
    nothing there (lora_scaled measured 0.91-1.00x of jax.jit on the H200 when it was moved),
    so under the H200 profile the program is kept; the CPU profile still prices the scale."""
    from jaxrw.rewrite.cost import Roofline
    from jaxrw.rewrite.profiles import H200
    from jaxrw.rewrite.run import rewrite_jaxpr

    from .harness import flat_jaxpr

    rng = np.random.default_rng(7)
    x, w = _rand(rng, 64, 512), _rand(rng, 512, 512)
    a, b = _rand(rng, 512, 16), _rand(rng, 16, 512)

    def f(x, w, a, b):
        return x @ (w + 0.5 * (a @ b))

    assert not optimized(f, (x, w, a, b), profile=H200).report.rewritten
    closed, _ = flat_jaxpr(f, (x, w, a, b))
    before = rewrite_jaxpr(closed, profile=H200).before
    (scale,) = [n for n in before.nodes.values() if n.op == "mul"]  # 0.5 · (a@b)
    assert Roofline(H200).node_cost(scale, before) == 0.0
    assert Roofline(CPU).node_cost(scale, before) > 0.0


def test_a_lora_update_is_distributed_but_a_full_rank_sum_is_not():
    """x@(W + A@B) with A@B of rank r <= n/4 (a LoRA update) is 'structured', so dot.expand_left
    distributes it: x@W + (x@A)@B never forms the n x n update (the hand program of the lora
    case measured 1.03-2.04x of jax.jit in every H200 run). A full-rank C@D stays a sum."""
    from jaxrw.rewrite.profiles import H200

    rng = np.random.default_rng(8)
    n = 2048  # bytes, not launches, decide at this size (forming the update writes 16 MiB)
    x, w = _rand(rng, 16, n), _rand(rng, n, n)
    a, b = _rand(rng, n, 16), _rand(rng, 16, n)
    opt = reaches(
        lambda x, w, a, b: x @ (w + a @ b), lambda x, w, a, b: x @ w + (x @ a) @ b, (x, w, a, b), profile=H200
    )
    assert opt.report.rules_fired.get("dot.expand_left", 0) > 0 and opt.dots == 3
    c, d = _rand(rng, n, n), _rand(rng, n, n)
    full = optimized(lambda x, w, c, d: x @ (w + c @ d), (x, w, c, d), profile=H200)
    assert "dot.expand_left" not in full.report.rules_fired


def test_a_vmapped_chain_over_thin_blocks_is_reassociated():
    # jax.vmap(lambda x: A @ B @ x) contracts the blocks' middle axis (dot_general of A @ B with a
    # rank-3 x): assoc_2d took 2-D operands only, and the n³ product stayed (a helper's ML code:
    # 2.2-2.5x by hand); so did einsum("ij,jk,bkl->bil") and vmap of vmap
    rng = np.random.default_rng(21)
    a, b = (jnp.asarray(rng.standard_normal((128, 128)) / 12, jnp.float32) for _ in range(2))
    x3, x4 = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((8, 128, 2), (2, 4, 128, 2)))
    chain = lambda a, b, x: a @ b @ x  # noqa: E731
    for f, x in (
        (jax.vmap(chain, (None, None, 0)), x3),
        (lambda a, b, x: jnp.einsum("ij,jk,bkl->bil", a, b, x, optimize=False), x3),
        (jax.vmap(jax.vmap(chain, (None, None, 0)), (None, None, 0)), x4),
    ):
        opt = optimized(f, (a, b, x))
        assert opt.report.rules_fired.get("dot.assoc_2d", 0) > 0
        assert opt.flops <= 1.05 * 2 * (2 * 128 * 128 * x.size // 128)  # A @ (B @ x): no 128³ product
        np.testing.assert_allclose(opt.fn(a, b, x)[0], jax.jit(f)(a, b, x), rtol=1e-4, atol=1e-4)

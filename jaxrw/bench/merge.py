"""The merge suite: products that share an operand, which one larger GEMM can replace.

Whether merging pays depends on where the weights live. Closed-over constants can be concatenated
once at compile time; function arguments (as in every flax/equinox program) would be concatenated
on every call, which costs more than it saves on a bandwidth-bound step. The hand-optimized
version of an arguments case therefore uses weights merged once outside the timed call
(`hand_prep`): the bar that hoisting parameter work (issue 10) aims for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .case import Instance, Rand, pick, register


def _split3(y):
    n = y.shape[-1] // 3
    return y[..., :n], y[..., n : 2 * n], y[..., 2 * n :]


def _qkv_args(size: str, dtype: str, t_small: int, t_large: int) -> Instance:
    t, d = pick(size, t_small, t_large), pick(size, 256, 4096)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(t, d), r.weight(d, d, d), r.weight(d, d, d), r.weight(d, d, d)

    def naive(x, wq, wk, wv):
        return x @ wq, x @ wk, x @ wv

    def prep(a: tuple) -> tuple:
        x, wq, wk, wv = a
        return x, jnp.concatenate([wq, wk, wv], axis=1)

    return Instance(
        naive,
        args,
        hand=lambda x, w: _split3(x @ w),
        hand_prep=prep,
        hand_label="weights merged once",
        shape=f"t={t} d={d}",
    )


@register("merge")
def qkv_args_decode(size: str, dtype: str) -> Instance:
    """q, k, v = x@Wq, x@Wk, x@Wv with weights as arguments, a few tokens (bandwidth-bound)."""
    return _qkv_args(size, dtype, 4, 16)


@register("merge")
def qkv_args_prefill(size: str, dtype: str) -> Instance:
    """The QKV projections with weights as arguments over a long prompt (compute-bound)."""
    return _qkv_args(size, dtype, 128, 2048)


@register("merge")
def qkv_const(size: str, dtype: str) -> Instance:
    """QKV projections whose weights are closed-over constants: mergeable at compile time."""
    t, d = pick(size, 8, 16), pick(size, 256, 4096)
    r0 = Rand(0, dtype)
    wq, wk, wv = (r0.weight(d, d, d) for _ in range(3))
    wqkv = jnp.concatenate([wq, wk, wv], axis=1)

    def args(seed: int) -> tuple:
        return (Rand(seed, dtype).normal(t, d),)

    return Instance(
        lambda x: (x @ wq, x @ wk, x @ wv), args, hand=lambda x: _split3(x @ wqkv), shape=f"t={t} d={d}"
    )


@register("merge")
def per_head_proj(size: str, dtype: str) -> Instance:
    """One projection per attention head (separate constant weights), stacked: one GEMM in all."""
    t, d, h = pick(size, 8, 16), pick(size, 128, 4096), pick(size, 4, 32)
    dh = d // h
    r0 = Rand(0, dtype)
    ws = [r0.weight(d, d, dh) for _ in range(h)]
    w_all = jnp.concatenate(ws, axis=1)

    def args(seed: int) -> tuple:
        return (Rand(seed, dtype).normal(t, d),)

    def naive(x):
        return jnp.stack([x @ w for w in ws])

    def hand(x):
        return (x @ w_all).reshape(t, h, dh).transpose(1, 0, 2)

    return Instance(naive, args, hand=hand, shape=f"t={t} d={d} heads={h}")


@register("merge")
def experts_equal(size: str, dtype: str) -> Instance:
    """Many small experts of equal shape run one by one; a batched GEMM pair runs them all."""
    e, m, k, n = pick(size, 8, 32), pick(size, 16, 64), pick(size, 64, 1024), pick(size, 128, 1024)
    r0 = Rand(0, dtype)
    w1 = [r0.weight(k, k, n) for _ in range(e)]
    w2 = [r0.weight(n, n, k) for _ in range(e)]
    w1s, w2s = jnp.stack(w1), jnp.stack(w2)

    def args(seed: int) -> tuple:
        return (Rand(seed, dtype).normal(e, m, k),)

    def naive(xs):
        return jnp.stack([jax.nn.relu(xs[i] @ w1[i]) @ w2[i] for i in range(e)])

    def hand(xs):
        return jnp.einsum("emn,enk->emk", jax.nn.relu(jnp.einsum("emk,ekn->emn", xs, w1s)), w2s)

    return Instance(naive, args, hand=hand, shape=f"{e} experts {m}×{k}×{n}")


def _gated(size: str, dtype: str):
    t, d, f = pick(size, 8, 16), pick(size, 256, 4096), pick(size, 688, 11008)

    def naive(x, w1, w2, w3):
        return (jax.nn.silu(x @ w1) * (x @ w3)) @ w2

    def merged(x, w13, w2):
        h = x @ w13
        return (jax.nn.silu(h[:, :f]) * h[:, f:]) @ w2

    return t, d, f, naive, merged


@register("merge")
def gated_mlp_args(size: str, dtype: str) -> Instance:
    """A SwiGLU MLP silu(x@w1)·(x@w3)@w2 with weights as arguments: w1 and w3 share x."""
    t, d, f, naive, merged = _gated(size, dtype)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(t, d), r.weight(d, d, f), r.weight(f, f, d), r.weight(d, d, f)

    def prep(a: tuple) -> tuple:
        x, w1, w2, w3 = a
        return x, jnp.concatenate([w1, w3], axis=1), w2

    return Instance(
        naive,
        args,
        hand=merged,
        hand_prep=prep,
        hand_label="weights merged once",
        shape=f"t={t} d={d} ffn={f}",
    )


@register("merge")
def gated_mlp_const(size: str, dtype: str) -> Instance:
    """The SwiGLU MLP with closed-over weights: w1/w3 can be merged at compile time."""
    t, d, f, naive, merged = _gated(size, dtype)
    r0 = Rand(0, dtype)
    w1, w2, w3 = r0.weight(d, d, f), r0.weight(f, f, d), r0.weight(d, d, f)
    w13 = jnp.concatenate([w1, w3], axis=1)

    def args(seed: int) -> tuple:
        return (Rand(seed, dtype).normal(t, d),)

    return Instance(
        lambda x: naive(x, w1, w2, w3), args, hand=lambda x: merged(x, w13, w2), shape=f"t={t} d={d} ffn={f}"
    )

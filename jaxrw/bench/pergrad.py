"""Per-example gradients under jax.vmap(jax.grad(...)) (part of the algebra suite): their norms
(gradient-noise monitoring, GraNd scores) and DP-SGD's clipped mean, for an MLP on single rows
(outer products, rules/outer.py) and on sequences (Gram matrices, rules/ghost.py). Written as
people write them: the per-example gradients formed, squared, scaled and summed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .algebra import acc_sum
from .case import Instance, Rand, pick, register


def _mlp_loss(params, x, y):
    w1, w2 = params
    return jnp.sum((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def _mlp_data(size: str, dtype: str):
    """A two-layer tanh MLP's weights and a batch: (b, d, h, o) and the args of one seed."""
    b, d, h, o = pick(size, 64, 256), pick(size, 64, 256), pick(size, 128, 512), pick(size, 16, 128)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(d, d, h), r.weight(h, h, o), r.normal(b, d), r.normal(b, o)

    return f"b={b} d={d} h={h} o={o}", args


def _per_example_grads(w1, w2, X, Y):
    return jax.vmap(jax.grad(_mlp_loss), in_axes=(None, 0, 0))((w1, w2), X, Y)


def _norms_of(g1, g2):
    """Each example's norm of its two layers' gradients [b, ., .], squared and summed as written."""
    return jnp.sqrt(acc_sum(g1 * g1, axis=(1, 2)) + acc_sum(g2 * g2, axis=(1, 2)))


def _grad_norms(w1, w2, X, Y):
    """Each example's gradient norm, its per-layer gradients formed and squared (as written)."""
    return _norms_of(*_per_example_grads(w1, w2, X, Y))


def _clipped_mean(w1, w2, X, Y):
    """DP-SGD's mean of the per-example gradients, each scaled to norm at most 1 (as written)."""
    g1, g2 = _per_example_grads(w1, w2, X, Y)
    norm = _norms_of(g1, g2)
    s = jnp.minimum(1.0, 1.0 / (norm + 1e-6)).astype(X.dtype)[:, None, None]
    return acc_sum(g1 * s, axis=0) / X.shape[0], acc_sum(g2 * s, axis=0) / X.shape[0]


def _factors(w1, w2, X, Y):
    """Each layer's input and output gradient for every example: g = x ⊗ δ per layer."""
    H = jnp.tanh(X @ w1)
    d2 = 2 * (H @ w2 - Y)
    d1 = (d2 @ w2.T) * (1 - H * H)
    return ((X, d1), (H, d2))


def _sq(x):
    return acc_sum(x * x, axis=1)


@register("algebra")
def per_example_norms(size: str, dtype: str) -> Instance:
    """Per-example gradient norms of an MLP (GraNd scores, gradient-noise monitoring) under
    jax.vmap(jax.grad): each layer's [b, d, h] gradients are formed and squared, where
    |x ⊗ δ|² = |x|² |δ|² needs the factors only."""
    shape, args = _mlp_data(size, dtype)

    def hand(w1, w2, X, Y):
        return jnp.sqrt(sum(_sq(x) * _sq(d) for x, d in _factors(w1, w2, X, Y)))

    return Instance(_grad_norms, args, hand=hand, shape=shape)


@register("algebra")
def dp_clipped_mean(size: str, dtype: str) -> Instance:
    """DP-SGD's clipped mean gradient of an MLP: per-example gradients under jax.vmap, each
    scaled to norm at most 1, averaged. The norms need only |x|²|δ|² per layer and the weighted
    sum over the batch is one product, Xᵀ(s∘Δ): no [b, d, h] gradient is needed."""
    shape, args = _mlp_data(size, dtype)

    def hand(w1, w2, X, Y):
        pairs = _factors(w1, w2, X, Y)
        norm = jnp.sqrt(sum(_sq(x) * _sq(d) for x, d in pairs))
        s = jnp.minimum(1.0, 1.0 / (norm + 1e-6)).astype(X.dtype)[:, None]
        return tuple(x.T @ (d * s) / X.shape[0] for x, d in pairs)

    return Instance(_clipped_mean, args, hand=hand, shape=shape)


# --- sequences: a gradient per example is Xᵀ Δ over T rows ---------------------------------------


def _seq_data(size: str, dtype: str):
    """The MLP's weights and a batch of sequences [b, T, d]: (shape words, args of a seed)."""
    b, t = pick(size, 32, 64), pick(size, 16, 64)
    d, h, o = pick(size, 128, 1024), pick(size, 256, 1024), pick(size, 64, 1024)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(d, d, h), r.weight(h, h, o), r.normal(b, t, d), r.normal(b, t, o)

    return f"b={b} T={t} d={d} h={h} o={o}", args


def _gram_sq(x, d):
    """Each example's |xᵀd|² from its [T, T] Grams: Σ (x xᵀ)∘(d dᵀ)."""
    gx, gd = (jnp.einsum("bti,bsi->bts", v, v) for v in (x, d))
    return acc_sum(gx * gd, axis=(1, 2))


def _seq_norms(pairs):
    """Each example's gradient norm from its layers' (input, output gradient) pairs, by Grams."""
    return jnp.sqrt(sum(_gram_sq(x, d) for x, d in pairs))


@register("algebra")
def sequence_grad_norms(size: str, dtype: str) -> Instance:
    """Per-example gradient norms of an MLP applied to sequences: each layer's [b, d, h] gradient
    XᵀΔ is formed and squared. ⟨X Xᵀ, Δ Δᵀ⟩ needs only [b, T, T] Grams ("ghost norms", the hand
    version), at an accuracy jaxrw takes under numerics="fast" only (rules/ghost.py): under the
    default it keeps the norms' order of summation."""
    shape, args = _seq_data(size, dtype)

    def hand(w1, w2, X, Y):
        return _seq_norms(_factors(w1, w2, X, Y))

    return Instance(_grad_norms, args, hand=hand, shape=shape)


def _dp_sequence_clip(size: str, dtype: str, numerics: str) -> Instance:
    shape, args = _seq_data(size, dtype)

    def hand(w1, w2, X, Y):
        pairs = _factors(w1, w2, X, Y)
        s = jnp.minimum(1.0, 1.0 / (_seq_norms(pairs) + 1e-6)).astype(X.dtype)[:, None, None]
        return tuple(jnp.einsum("bti,btj->ij", x * s, d) / X.shape[0] for x, d in pairs)

    kw = {} if numerics == "default" else {"numerics": numerics}
    return Instance(_clipped_mean, args, hand=hand, opt_kwargs=kw, shape=shape)


@register("algebra")
def dp_sequence_clip(size: str, dtype: str) -> Instance:
    """DP-SGD's clipped mean gradient of an MLP on sequences. Under numerics="default" the norms
    reach the clipping divisor and are computed as written; the clipped sum is one product over
    all b·T rows, (s∘X)ᵀΔ, with no [b, d, h] gradient scaled and summed."""
    return _dp_sequence_clip(size, dtype, "default")


@register("algebra")
def dp_sequence_clip_fast(size: str, dtype: str) -> Instance:
    """dp_sequence_clip under numerics="fast": the norms from [b, T, T] Grams too, so no
    per-example gradient is formed at all (ghost clipping)."""
    return _dp_sequence_clip(size, dtype, "fast")

"""Per-example gradient programs the outer and ghost tests share: one tanh layer's gradients
under jax.vmap(jax.grad(...)), for single rows (outer products) or sequences (Gram matrices)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normal(rng, *shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _loss(w, x, y):  # x: one example, a row [n] or a sequence [T, n]
    return jnp.sum(jnp.tanh(x @ w) * y)


def per_example(w, xs, ys):
    return jax.vmap(jax.grad(_loss), in_axes=(None, 0, 0))(w, xs, ys)


def grad_norms(w, xs, ys):
    return jnp.sqrt(jnp.sum(per_example(w, xs, ys) ** 2, axis=(1, 2)))


def clipped_mean(w, xs, ys):
    g = per_example(w, xs, ys)
    norms = jnp.sqrt(jnp.sum(g**2, axis=(1, 2)))
    return jnp.mean(g * jnp.minimum(1.0, 1.0 / (norms + 1e-6))[:, None, None], axis=0)


def optax_style_clip(w, xs, ys):
    """As optax.per_example_global_norm_clip writes it: norms by jnp.square, the clipped sum as a
    tensordot of the multipliers with the gradients."""
    g = per_example(w, xs, ys)
    norms = jax.vmap(lambda t: jnp.sqrt(jnp.sum(jnp.square(t))))(g)
    return jnp.tensordot(jnp.nan_to_num(jnp.minimum(1.0 / norms, 1.0)), g, axes=1)

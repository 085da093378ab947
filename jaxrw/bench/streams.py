"""The streams suite: many independent small kernels, the workloads for a stream scheduler.

Each case is a set of branches that share nothing until the end (experts of different shapes, a
multi-branch cell, several independent decoders). XLA runs their kernels one after another; a
scheduler may run them on several streams. DESIGN.md records what thunky did on these shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import nets
from .case import Instance, Rand, pick, register


def _experts(size: str, dtype: str, count: int) -> Instance:
    """`count` two-layer expert MLPs whose shapes cycle through a few (m, k, n) choices."""
    ms, ks, ns = pick(
        size, ((4, 8, 16), (32, 64, 128), (64, 128)), ((32, 64, 128), (256, 512, 1024), (512, 2048))
    )
    shapes = [(ms[i % len(ms)], ks[(i // len(ms)) % len(ks)], ns[i % len(ns)]) for i in range(count)]

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        xs = [r.normal(m, k) for m, k, _ in shapes]
        w1 = [r.weight(k, k, n) for _, k, n in shapes]
        w2 = [r.weight(n, n, k) for _, k, n in shapes]
        return xs, w1, w2

    def naive(xs, w1, w2):
        return [jax.nn.relu(x @ a) @ b for x, a, b in zip(xs, w1, w2, strict=True)]

    distinct = len(set(shapes))
    return Instance(
        naive, args, shape=f"{count} experts, {distinct} shapes, m≤{max(ms)} k≤{max(ks)} n≤{max(ns)}"
    )


@register("streams")
def experts_mixed_8(size: str, dtype: str) -> Instance:
    """8 independent expert MLPs of different shapes (weights as arguments)."""
    return _experts(size, dtype, 8)


@register("streams")
def experts_mixed_32(size: str, dtype: str) -> Instance:
    """32 independent expert MLPs of different shapes."""
    return _experts(size, dtype, 32)


@register("streams")
def experts_mixed_64(size: str, dtype: str) -> Instance:
    """64 independent expert MLPs of different shapes."""
    return _experts(size, dtype, 64)


@register("streams")
def experts_packed(size: str, dtype: str) -> Instance:
    """16 equal-shape experts packed in stacked buffers, run slice by slice as written."""
    e, m, k = 16, pick(size, 16, 64), pick(size, 64, 512)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(e, m, k), r.weight(k, e, k, k)

    def naive(x, w):
        return jnp.stack([jnp.tanh(x[i] @ w[i]) for i in range(e)])

    return Instance(
        naive,
        args,
        hand=lambda x, w: jnp.tanh(jnp.einsum("emk,ekn->emn", x, w)),
        shape=f"{e} experts {m}×{k}×{k}",
    )


@register("streams")
def multibranch_cell(size: str, dtype: str) -> Instance:
    """An inception-style cell: four branches of different depth and width, concatenated."""
    b, d = pick(size, 8, 64), pick(size, 64, 1024)
    widths = (d // 2, d, 2 * d)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        p = {
            "a": r.weight(d, d, widths[0]),
            "b1": r.weight(d, d, widths[1]),
            "b2": r.weight(widths[1], widths[1], widths[0]),
            "c1": r.weight(d, d, widths[2]),
            "c2": r.weight(widths[2], widths[2], widths[1]),
            "c3": r.weight(widths[1], widths[1], widths[0]),
            "d1": r.weight(d, d, widths[0]),
            "d2": r.weight(d, d, widths[0]),
        }
        return p, r.normal(b, d)

    def naive(p, x):
        relu = jax.nn.relu
        a = x @ p["a"]
        bb = relu(x @ p["b1"]) @ p["b2"]
        c = relu(relu(x @ p["c1"]) @ p["c2"]) @ p["c3"]
        dd = jnp.tanh(x @ p["d1"]) * jax.nn.sigmoid(x @ p["d2"])
        return jnp.concatenate([a, bb, c, dd], axis=-1)

    return Instance(naive, args, shape=f"batch {b}, dim {d}, 4 branches")


@register("streams")
def small_decoders(size: str, dtype: str) -> Instance:
    """Several independent small llama-style decoders, each stepping its own token and cache.
    Only the logits are returned: the updated caches are dropped (XLA then leaves out their
    write-back), so this measures the decode arithmetic of independent branches, not a full step."""
    count = pick(size, 2, 4)
    cfg = pick(
        size,
        nets.LlamaConfig(dim=32, layers=1, heads=2, vocab=128, seq=16),
        nets.LlamaConfig(dim=256, layers=2, heads=4, vocab=4096, seq=128),
    )

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        out = []
        for _ in range(count):
            ck, cv = nets.llama_cache(cfg, r)
            tok = jnp.asarray(r.rng.integers(0, cfg.vocab), jnp.int32)
            pos = jnp.asarray(r.rng.integers(1, cfg.seq - 1), jnp.int32)
            out.append((nets.llama_params(cfg, r), ck, cv, tok, pos))
        return (out,)

    def naive(decoders):
        return [nets.llama_step(cfg, *d)[0] for d in decoders]

    return Instance(naive, args, shape=f"{count} decoders of dim {cfg.dim}, {cfg.layers} layers")

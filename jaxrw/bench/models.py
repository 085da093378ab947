"""The models suite: whole forward passes and a training step, random weights from configs.

The large sizes are the published configurations (llama2.c stories15M shape, a 4096-wide llama
layer, NasRNN hidden 512, BERT-base, GPT-2 small, ResNet-50, a 4-layer GPT training step); the
small sizes keep each model's structure (one layer or block per stage, 3 RNN steps) at a width
a 2-core CPU runs in milliseconds and jaxrw optimizes in seconds. Cases named `*_hoist` pass
`hoist_argnums` for the parameters (issue 10); where this jaxrw has no such option the runner
records them as skipped, saying why.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import nets, resnet
from .case import Instance, Rand, pick, register

# --- llama2.c-style decode steps -----------------------------------------------------------------

LLAMA = {
    "288": {
        "small": nets.LlamaConfig(dim=64, layers=1, heads=4, vocab=512, seq=32),
        "large": nets.LlamaConfig(dim=288, layers=6, heads=6, vocab=32000, seq=256),
    },
    "4096": {
        "small": nets.LlamaConfig(dim=256, layers=1, heads=4, vocab=1024, seq=64),
        "large": nets.LlamaConfig(dim=4096, layers=1, heads=32, vocab=32000, seq=1024),
    },
}


def _llama_args(cfg: nets.LlamaConfig, dtype: str, const: bool):
    params = nets.llama_params(cfg, Rand(0, dtype)) if const else None

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        p = params if const else nets.llama_params(cfg, r)
        ck, cv = nets.llama_cache(cfg, r)
        token = jnp.asarray(r.rng.integers(0, cfg.vocab), jnp.int32)
        pos = jnp.asarray(r.rng.integers(cfg.seq // 4, 3 * cfg.seq // 4), jnp.int32)
        return (ck, cv, token, pos) if const else (p, ck, cv, token, pos)

    return params, args


def _llama(key: str, size: str, dtype: str, hoist: bool = False, const: bool = False) -> Instance:
    cfg = LLAMA[key][size]
    shape = f"dim {cfg.dim}, {cfg.layers} layers, {cfg.heads} heads, vocab {cfg.vocab}, cache {cfg.seq}"
    params, args = _llama_args(cfg, dtype, const)
    if const:
        merged = nets.llama_merge(params)
        return Instance(
            lambda ck, cv, tok, pos: nets.llama_step(cfg, params, ck, cv, tok, pos),
            args,
            hand=lambda ck, cv, tok, pos: nets.llama_step(cfg, merged, ck, cv, tok, pos, merged=True),
            hand_label="QKV and w1/w3 merged",
            shape=shape,
        )

    def prep(a: tuple) -> tuple:
        return (nets.llama_merge(a[0]), *a[1:])

    return Instance(
        lambda p, ck, cv, tok, pos: nets.llama_step(cfg, p, ck, cv, tok, pos),
        args,
        hand=lambda p, ck, cv, tok, pos: nets.llama_step(cfg, p, ck, cv, tok, pos, merged=True),
        hand_prep=prep,
        hand_label="weights merged once",
        opt_kwargs={"hoist_argnums": (0,)} if hoist else {},
        shape=shape,
    )


@register("models")
def llama288(size: str, dtype: str) -> Instance:
    """llama2.c decode step (dim 288, 6 layers), weights as arguments: merging must not pay per call."""
    return _llama("288", size, dtype)


@register("models")
def llama288_hoist(size: str, dtype: str) -> Instance:
    """The dim-288 decode step with hoist_argnums=(0,): merged weights built once, reused."""
    return _llama("288", size, dtype, hoist=True)


@register("models")
def llama288_const(size: str, dtype: str) -> Instance:
    """The dim-288 decode step with closed-over weights: QKV and w1/w3 mergeable at compile time."""
    return _llama("288", size, dtype, const=True)


@register("models")
def llama4096(size: str, dtype: str) -> Instance:
    """One dim-4096 llama layer decoding a token, weights as arguments (bandwidth-bound)."""
    return _llama("4096", size, dtype)


@register("models")
def llama4096_hoist(size: str, dtype: str) -> Instance:
    """The dim-4096 decode layer with hoist_argnums=(0,)."""
    return _llama("4096", size, dtype, hoist=True)


# --- NasRNN --------------------------------------------------------------------------------------


def _nas(size: str, dtype: str, const: bool, hoist: bool = False) -> Instance:
    hidden, batch, steps = pick(size, 64, 512), pick(size, 2, 8), pick(size, 3, 5)
    shape = f"hidden {hidden}, batch {batch}, {steps} steps"
    fixed = nets.nasrnn_params(hidden, Rand(0, dtype)) if const else None

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        xs, h = r.normal(steps, batch, hidden), r.normal(batch, hidden, scale=0.5)
        return (xs, h) if const else (nets.nasrnn_params(hidden, r), xs, h)

    def stacked(p: dict) -> tuple:
        return jnp.concatenate(p["w"], axis=1), jnp.concatenate(p["u"], axis=1)

    if const:
        w_all, u_all = stacked(fixed)
        return Instance(
            lambda xs, h: nets.nasrnn(fixed, xs, h),
            args,
            hand=lambda xs, h: nets.nasrnn_merged(w_all, u_all, xs, h),
            shape=shape,
        )

    def prep(a: tuple) -> tuple:
        return (*stacked(a[0]), *a[1:])

    return Instance(
        nets.nasrnn,
        args,
        hand=nets.nasrnn_merged,
        hand_prep=prep,
        hand_label="weights merged once",
        opt_kwargs={"hoist_argnums": (0,)} if hoist else {},
        shape=shape,
    )


@register("models")
def nasrnn_const(size: str, dtype: str) -> Instance:
    """NasRNN cell, 5 unrolled steps, 8 products x@W_i + h@U_i per step, closed-over weights."""
    return _nas(size, dtype, const=True)


@register("models")
def nasrnn_args(size: str, dtype: str) -> Instance:
    """The NasRNN cell with weights as arguments (per-call concatenation would not pay)."""
    return _nas(size, dtype, const=False)


@register("models")
def nasrnn_args_hoist(size: str, dtype: str) -> Instance:
    """The NasRNN cell with weights as arguments and hoist_argnums=(0,)."""
    return _nas(size, dtype, const=False, hoist=True)


# --- transformers --------------------------------------------------------------------------------

BERT = {
    "small": nets.TransformerConfig(dim=64, layers=1, heads=2, vocab=512, seq=16, batch=2),
    "large": nets.TransformerConfig(dim=768, layers=12, heads=12, vocab=30522, seq=128, batch=8),
}
GPT2 = {
    "small": nets.TransformerConfig(dim=64, layers=1, heads=2, vocab=512, seq=16, batch=1),
    "large": nets.TransformerConfig(dim=768, layers=12, heads=12, vocab=50257, seq=256, batch=4),
}
TRAIN = {
    "small": nets.TransformerConfig(dim=64, layers=1, heads=2, vocab=256, seq=16, batch=2),
    "large": nets.TransformerConfig(dim=768, layers=4, heads=12, vocab=50257, seq=256, batch=8),
}


def _tshape(cfg: nets.TransformerConfig) -> str:
    return f"batch {cfg.batch}, seq {cfg.seq}, dim {cfg.dim}, {cfg.layers} layers, vocab {cfg.vocab}"


@register("models")
def bert_base(size: str, dtype: str) -> Instance:
    """A BERT-base encoder forward pass (separate Q/K/V weights, as in the reference code)."""
    cfg = BERT[size]

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return nets.transformer_params(cfg, r, merged_qkv=False), r.ints(cfg.vocab, cfg.batch, cfg.seq)

    return Instance(
        lambda p, ids: nets.bert(cfg, p, ids),
        args,
        hand=lambda p, ids: nets.bert(cfg, p, ids),
        hand_prep=lambda a: (nets.merge_qkv(a[0]), a[1]),
        hand_label="QKV merged once",
        shape=_tshape(cfg),
    )


@register("models")
def gpt2_small(size: str, dtype: str) -> Instance:
    """A GPT-2 small forward pass to logits (QKV already one matrix, as GPT-2 writes it)."""
    cfg = GPT2[size]

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return nets.transformer_params(cfg, r, merged_qkv=True), r.ints(cfg.vocab, cfg.batch, cfg.seq)

    return Instance(lambda p, ids: nets.gpt2(cfg, p, ids), args, shape=_tshape(cfg))


@register("models")
def gpt_train_step(size: str, dtype: str) -> Instance:
    """A GPT training step: loss, gradient and an AdamW update written by hand (no optax)."""
    cfg = TRAIN[size]

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)

        def tree():
            return nets.transformer_params(cfg, r, merged_qkv=False, key_bias=False)

        params = tree()
        m = jax.tree.map(lambda x: x * 1e-3, tree())
        v = jax.tree.map(lambda x: (jnp.abs(x) + 0.1) * 1e-6, tree())
        return (
            params,
            m,
            v,
            jnp.asarray(r.rng.integers(1, 100), jnp.int32),
            r.ints(cfg.vocab, cfg.batch, cfg.seq),
        )

    return Instance(
        lambda p, m, v, step, ids: nets.adamw_step(cfg, p, m, v, step, ids), args, shape=_tshape(cfg)
    )


# --- ResNet-50 -----------------------------------------------------------------------------------

RESNET = {
    "small": resnet.ResNetConfig(batch=2, image=32, width=8, blocks=(1, 1), classes=10),
    "large": resnet.ResNetConfig(batch=8, image=224, width=64, blocks=(3, 4, 6, 3), classes=1000),
}


@register("models")
def resnet50(size: str, dtype: str) -> Instance:
    """ResNet-50 inference, convolutions opaque; hand version folds batch norm into the convs."""
    cfg = RESNET[size]

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return resnet.resnet_params(cfg, r), r.normal(cfg.batch, cfg.image, cfg.image, 3)

    shape = f"batch {cfg.batch}, {cfg.image}², width {cfg.width}, blocks {cfg.blocks}"
    return Instance(
        resnet.resnet,
        args,
        hand=resnet.resnet_folded,
        hand_prep=lambda a: (resnet.fold_bn(a[0]), a[1]),
        hand_label="batch norm folded once",
        shape=shape,
    )

"""Model code for the models suite, written the way people write it in plain JAX.

Parameters are pytrees of arrays built from a config with random values (no downloads); every
function here is dtype-agnostic so the same code runs in float32, bfloat16 and (for the
reference) float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from .case import Rand

# --- shared layers -------------------------------------------------------------------------------


def rmsnorm(x, w, eps=1e-5):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layernorm(x, g, b, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


def attention(q, k, v, causal: bool):
    """q, k, v: (batch, seq, heads, head_dim) -> (batch, seq, heads*head_dim)."""
    b, s, h, dh = q.shape
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
    if causal:
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        scores = jnp.where(mask, scores, jnp.asarray(-1e4, scores.dtype))
    p = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, h * dh)


# --- llama2.c-style decoding: one token with a KV cache ------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    dim: int
    layers: int
    heads: int
    vocab: int
    seq: int  # KV cache length

    @property
    def hidden(self) -> int:  # llama2.c: 2/3 of 4·dim, rounded up to a multiple of 32
        h = int(2 * 4 * self.dim / 3)
        return 32 * ((h + 31) // 32)


def llama_params(cfg: LlamaConfig, r: Rand) -> dict:
    d, f = cfg.dim, cfg.hidden
    layers = [
        {
            "attn_norm": r.positive(d),
            "wq": r.weight(d, d, d),
            "wk": r.weight(d, d, d),
            "wv": r.weight(d, d, d),
            "wo": r.weight(d, d, d),
            "ffn_norm": r.positive(d),
            "w1": r.weight(d, d, f),
            "w2": r.weight(f, f, d),
            "w3": r.weight(d, d, f),
        }
        for _ in range(cfg.layers)
    ]
    return {"emb": r.normal(cfg.vocab, d), "layers": layers, "norm": r.positive(d)}


def llama_cache(cfg: LlamaConfig, r: Rand) -> tuple:
    shape = (cfg.layers, cfg.seq, cfg.heads, cfg.dim // cfg.heads)
    return r.normal(*shape), r.normal(*shape)


def _rope(x, pos, dh):
    """Rotary position embedding of x: (heads, head_dim) at position `pos`."""
    ft = jnp.promote_types(x.dtype, jnp.float32)  # float32, or float64 in the reference
    inv = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2, dtype=ft) / dh))
    ang = pos.astype(ft) * inv
    cos, sin = jnp.cos(ang).astype(x.dtype), jnp.sin(ang).astype(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def llama_step(cfg: LlamaConfig, params, cache_k, cache_v, token, pos, merged: bool = False):
    """Logits for `token` at `pos` and the updated caches. `merged`: params carry `wqkv` and
    `w13` (weights concatenated ahead of time) instead of wq/wk/wv and w1/w3."""
    h, dh, f = cfg.heads, cfg.dim // cfg.heads, cfg.hidden
    x = params["emb"][token]
    for i, p in enumerate(params["layers"]):
        a = rmsnorm(x, p["attn_norm"])
        if merged:
            qkv = a @ p["wqkv"]
            q, k, v = qkv[: cfg.dim], qkv[cfg.dim : 2 * cfg.dim], qkv[2 * cfg.dim :]
        else:
            q, k, v = a @ p["wq"], a @ p["wk"], a @ p["wv"]
        q, k = _rope(q.reshape(h, dh), pos, dh), _rope(k.reshape(h, dh), pos, dh)
        cache_k = cache_k.at[i, pos].set(k)
        cache_v = cache_v.at[i, pos].set(v.reshape(h, dh))
        scores = jnp.einsum("hd,shd->hs", q, cache_k[i]) / math.sqrt(dh)
        scores = jnp.where(jnp.arange(cfg.seq)[None, :] <= pos, scores, jnp.asarray(-1e4, scores.dtype))
        att = jnp.einsum("hs,shd->hd", jax.nn.softmax(scores, axis=-1), cache_v[i]).reshape(cfg.dim)
        x = x + att @ p["wo"]
        b = rmsnorm(x, p["ffn_norm"])
        if merged:
            g = b @ p["w13"]
            x = x + (jax.nn.silu(g[:f]) * g[f:]) @ p["w2"]
        else:
            x = x + (jax.nn.silu(b @ p["w1"]) * (b @ p["w3"])) @ p["w2"]
    logits = rmsnorm(x, params["norm"]) @ params["emb"].T
    return logits, cache_k, cache_v


def llama_merge(params: dict) -> dict:
    """The same parameters with QKV and w1/w3 concatenated (done once, not per call)."""
    layers = [
        {
            "attn_norm": p["attn_norm"],
            "wqkv": jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1),
            "wo": p["wo"],
            "ffn_norm": p["ffn_norm"],
            "w13": jnp.concatenate([p["w1"], p["w3"]], axis=1),
            "w2": p["w2"],
        }
        for p in params["layers"]
    ]
    return {"emb": params["emb"], "layers": layers, "norm": params["norm"]}


# --- NasRNN cell (TASO/Constable benchmark shape): 8 shared-input products per step ----------------


def nasrnn_params(hidden: int, r: Rand) -> dict:
    return {
        "w": [r.weight(hidden, hidden, hidden) for _ in range(8)],
        "u": [r.weight(hidden, hidden, hidden) for _ in range(8)],
    }


def _nas_combine(t):
    s, th, relu = jax.nn.sigmoid, jnp.tanh, jax.nn.relu
    l1 = [s(t[0]), relu(t[1]), s(t[2]), relu(t[3]), th(t[4]), s(t[5]), th(t[6]), s(t[7])]
    l2 = [l1[0] * l1[1], l1[2] + l1[3], th(l1[4] * l1[5]), l1[6] + l1[7]]
    l3 = [th(l2[0] * l2[1]), th(l2[2] + l2[3])]
    return th(l3[0] * l3[1])


def nasrnn(params, xs, h):
    """xs: (steps, batch, hidden); h: (batch, hidden). Unrolled; returns every hidden state."""
    outs = []
    for step in range(xs.shape[0]):
        x = xs[step]
        t = [x @ params["w"][i] + h @ params["u"][i] for i in range(8)]
        h = _nas_combine(t)
        outs.append(h)
    return jnp.stack(outs)


def nasrnn_merged(w_all, u_all, xs, h):
    """The hand-optimized cell: all steps' input products in one GEMM, one GEMM per step for h."""
    steps, batch, hidden = xs.shape
    xp = (xs.reshape(steps * batch, hidden) @ w_all).reshape(steps, batch, 8, hidden)
    outs = []
    for step in range(steps):
        t = xp[step] + (h @ u_all).reshape(batch, 8, hidden)
        h = _nas_combine([t[:, i] for i in range(8)])
        outs.append(h)
    return jnp.stack(outs)


# --- encoder / decoder transformers (BERT-base, GPT-2 small) -------------------------------------


@dataclass(frozen=True)
class TransformerConfig:
    dim: int
    layers: int
    heads: int
    vocab: int
    seq: int
    batch: int


def transformer_params(cfg: TransformerConfig, r: Rand, merged_qkv: bool, key_bias: bool = True) -> dict:
    """Random parameters. `key_bias=False` drops the key projection's bias, whose gradient is
    exactly zero (softmax ignores a shift shared by all keys), so a training step's update of it
    would be pure rounding noise."""
    d, f = cfg.dim, 4 * cfg.dim
    layers = []
    for _ in range(cfg.layers):
        p = {
            "ln1_g": r.positive(d),
            "ln1_b": r.normal(d, scale=0.1),
            "wo": r.weight(d, d, d),
            "bo": r.normal(d, scale=0.1),
            "ln2_g": r.positive(d),
            "ln2_b": r.normal(d, scale=0.1),
            "w_in": r.weight(d, d, f),
            "b_in": r.normal(f, scale=0.1),
            "w_out": r.weight(f, f, d),
            "b_out": r.normal(d, scale=0.1),
        }
        if merged_qkv:
            p["wqkv"], p["bqkv"] = r.weight(d, d, 3 * d), r.normal(3 * d, scale=0.1)
        else:
            for n in "qkv":
                p["w" + n] = r.weight(d, d, d)
                if n != "k" or key_bias:
                    p["b" + n] = r.normal(d, scale=0.1)
        layers.append(p)
    return {
        "wte": r.normal(cfg.vocab, d, scale=0.5),
        "wpe": r.normal(cfg.seq, d, scale=0.5),
        "layers": layers,
        "lnf_g": r.positive(d),
        "lnf_b": r.normal(d, scale=0.1),
    }


def _qkv(p, x, cfg: TransformerConfig):
    b, s, d = x.shape
    if "wqkv" in p:
        qkv = x @ p["wqkv"] + p["bqkv"]
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    else:
        q, k, v = (x @ p["w" + n] + p["b" + n] if "b" + n in p else x @ p["w" + n] for n in "qkv")
    dh = d // cfg.heads
    return (t.reshape(b, s, cfg.heads, dh) for t in (q, k, v))


def bert(cfg: TransformerConfig, params, ids):
    """A BERT-style post-layernorm encoder (GELU MLP); returns the last hidden states."""
    x = params["wte"][ids] + params["wpe"][None, : ids.shape[1]]
    x = layernorm(x, params["lnf_g"], params["lnf_b"])
    for p in params["layers"]:
        q, k, v = _qkv(p, x, cfg)
        x = layernorm(x + attention(q, k, v, causal=False) @ p["wo"] + p["bo"], p["ln1_g"], p["ln1_b"])
        h = jax.nn.gelu(x @ p["w_in"] + p["b_in"])
        x = layernorm(x + h @ p["w_out"] + p["b_out"], p["ln2_g"], p["ln2_b"])
    return x


def gpt2(cfg: TransformerConfig, params, ids):
    """A GPT-2-style pre-layernorm causal decoder; returns logits over the (tied) vocabulary."""
    x = params["wte"][ids] + params["wpe"][None, : ids.shape[1]]
    for p in params["layers"]:
        q, k, v = _qkv(p, layernorm(x, p["ln1_g"], p["ln1_b"]), cfg)
        x = x + attention(q, k, v, causal=True) @ p["wo"] + p["bo"]
        h = jax.nn.gelu(layernorm(x, p["ln2_g"], p["ln2_b"]) @ p["w_in"] + p["b_in"])
        x = x + h @ p["w_out"] + p["b_out"]
    return layernorm(x, params["lnf_g"], params["lnf_b"]) @ params["wte"].T


def merge_qkv(params: dict) -> dict:
    """Separate q/k/v weights and biases concatenated once (for the hand-optimized versions)."""
    layers = []
    for p in params["layers"]:
        q = {k: v for k, v in p.items() if k[:2] not in ("wq", "wk", "wv", "bq", "bk", "bv")}
        q["wqkv"] = jnp.concatenate([p["wq"], p["wk"], p["wv"]], axis=1)
        q["bqkv"] = jnp.concatenate([p["bq"], p["bk"], p["bv"]])
        layers.append(q)
    return {**params, "layers": layers}


# --- a training step: grad of the GPT loss plus AdamW, written by hand ---------------------------


def gpt_loss(cfg: TransformerConfig, params, ids):
    """Next-token cross-entropy of the GPT decoder on `ids` (batch, seq)."""
    logits = gpt2(cfg, params, ids)[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    tgt = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)
    return -jnp.mean(tgt)


def adamw_step(cfg: TransformerConfig, params, m, v, step, ids, lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
    """One training step: loss and gradient, then AdamW with bias correction."""
    loss, g = jax.value_and_grad(lambda p: gpt_loss(cfg, p, ids))(params)
    t = step.astype(jnp.promote_types(jax.tree.leaves(m)[0].dtype, jnp.float32)) + 1.0  # f64 in the reference
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
    v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)

    def upd(p, m_, v_):
        mhat, vhat = m_ / c1.astype(m_.dtype), v_ / c2.astype(v_.dtype)
        return p - lr * (mhat / (jnp.sqrt(vhat) + eps) + wd * p)

    return loss, jax.tree.map(upd, params, m, v), m, v

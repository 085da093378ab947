"""Real programs for round-trip and differential tests: (name, fn, args) with random inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _n(rng, *shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def mlp_residual(rng):
    ws = [_n(rng, 32, 32) * 0.2 for _ in range(3)]
    bs = [_n(rng, 32) for _ in range(3)]

    def f(x, ws, bs):
        for w, b in zip(ws, bs, strict=True):
            x = x + jax.nn.gelu(x @ w + b)
        return x

    return f, (_n(rng, 8, 32), ws, bs)


def _layernorm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def attention(rng):
    d, h = 32, 4

    def f(x, wq, wk, wv, wo, g, b):
        x = _layernorm(x, g, b)
        s, _ = x.shape
        q = (x @ wq).reshape(s, h, d // h).transpose(1, 0, 2)
        k = (x @ wk).reshape(s, h, d // h).transpose(1, 0, 2)
        v = (x @ wv).reshape(s, h, d // h).transpose(1, 0, 2)
        att = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d // h), axis=-1)
        o = (att @ v).transpose(1, 0, 2).reshape(s, d)
        return o @ wo

    return f, (_n(rng, 16, d), *(_n(rng, d, d) * 0.2 for _ in range(4)), _n(rng, d), _n(rng, d))


def gpt_block(rng):
    d = 32
    att_f, att_args = attention(rng)

    def f(x, wq, wk, wv, wo, g, b, w1, w2):
        x = x + att_f(x, wq, wk, wv, wo, g, b)
        return x + jax.nn.gelu(_layernorm(x, g, b) @ w1) @ w2

    return f, (*att_args, _n(rng, d, 4 * d) * 0.2, _n(rng, 4 * d, d) * 0.2)


def conv_net(rng):
    def f(x, k1, k2):
        y = jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y = jax.nn.relu(y)
        y = jax.lax.conv_general_dilated(y, k2, (2, 2), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y.mean(axis=(2, 3))

    return f, (_n(rng, 2, 3, 8, 8), _n(rng, 4, 3, 3, 3), _n(rng, 5, 4, 3, 3))


def scan_rnn(rng):
    def f(xs, h0, w, u):
        def step(h, x):
            h = jnp.tanh(h @ w + x @ u)
            return h, h.sum()

        h, ys = jax.lax.scan(step, h0, xs)
        return h, ys

    return f, (_n(rng, 5, 4, 8), _n(rng, 4, 16), _n(rng, 16, 16) * 0.3, _n(rng, 8, 16) * 0.3)


def ints_and_bools(rng):
    def f(i, j, mask):
        k = i * 3 + j // 2 - (i % 5)
        m = jnp.logical_and(mask, k > 0)
        return jnp.where(m, k, -k), m.sum(), jnp.cumsum(k, axis=0)

    i = jnp.asarray(rng.integers(-50, 50, (6, 7)), jnp.int32)
    j = jnp.asarray(rng.integers(-50, 50, (6, 7)), jnp.int32)
    return f, (i, j, jnp.asarray(rng.random((6, 7)) > 0.5))


def literals_and_pytrees(rng):
    def f(d, s):
        y = d["a"] * 2.5 + 1 - d["b"][0] / 3.0
        return {"y": y, "z": (jnp.exp(y).sum(), s * 2)}

    return f, ({"a": _n(rng, 3, 4), "b": [_n(rng, 3, 4)]}, 1.5)


def grad_of_mlp(rng):
    f, args = mlp_residual(rng)
    return jax.grad(lambda x, ws, bs: f(x, ws, bs).sum(), argnums=(0, 1)), args


def vmap_of_attention(rng):
    f, args = attention(rng)
    xs = jnp.stack([args[0], args[0] * 0.5])
    return jax.vmap(f, in_axes=(0, None, None, None, None, None, None)), (xs, *args[1:])


def bf16_chain(rng):
    def f(a, b, c):
        return jnp.tanh((a @ b) @ c).astype(jnp.float32)

    return f, tuple(_n(rng, 16, 16, dtype=jnp.bfloat16) for _ in range(3))


def closed_over_constants(rng):
    w = _n(rng, 16, 16)
    b = np.float32(0.25)

    def f(x):
        return jnp.concatenate([x @ w, x @ w.T], axis=1)[:, 3:20] + b

    return f, (_n(rng, 4, 16),)


def random_bits(rng):
    def f(key, x):
        return x + jax.random.normal(key, x.shape)

    return f, (jax.random.key(int(rng.integers(0, 1000))), _n(rng, 4, 4))


CORPUS = {
    "mlp_residual": mlp_residual,
    "attention": attention,
    "gpt_block": gpt_block,
    "conv_net": conv_net,
    "scan_rnn": scan_rnn,
    "ints_and_bools": ints_and_bools,
    "literals_and_pytrees": literals_and_pytrees,
    "grad_of_mlp": grad_of_mlp,
    "vmap_of_attention": vmap_of_attention,
    "bf16_chain": bf16_chain,
    "closed_over_constants": closed_over_constants,
    "random_bits": random_bits,
}

"""Small programs shaped like the scheduler's workloads: (name, fn, args, donate), fn of flat arrays;
the GPU tests' check of an emitted program against jax.jit; and a pretend CUDA device for auto."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _n(rng, *shape, scale=1.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def experts_packed(rng):
    """Equal-shape experts in stacked buffers: slices of the inputs, results stacked."""
    e, m, d = 4, 8, 16

    def f(x, w1, w2):
        ys = [jax.nn.relu(x[i] @ w1[i]) @ w2[i] for i in range(e)]
        return jnp.stack(ys), jnp.stack(ys).sum(0)

    return f, (_n(rng, e, m, d), _n(rng, e, d, d, scale=0.3), _n(rng, e, d, d, scale=0.3)), ()


def experts_varied(rng):
    """Experts of different shapes passed as separate arrays, results concatenated."""
    shapes = [(4, 8, 16), (8, 16, 8), (4, 32, 16), (16, 8, 8), (4, 8, 32), (8, 16, 16)]
    args = []
    for m, k, n in shapes:
        args += [_n(rng, m, k), _n(rng, k, n, scale=0.3), _n(rng, n, 8, scale=0.3)]

    def f(*a):
        outs = [jnp.tanh(a[3 * i] @ a[3 * i + 1]) @ a[3 * i + 2] for i in range(len(shapes))]
        return outs[:2] + [jnp.concatenate(outs[2:], axis=0)]

    return f, tuple(args), ()


def cell(rng):
    """A multi-branch recurrent cell (NasRNN-like): eight x/h projections combined pairwise."""
    b, d = 4, 16

    def f(x, h, w, u):
        t = [x @ w[i] + h @ u[i] for i in range(8)]
        a = [jnp.tanh(t[0]) * jax.nn.sigmoid(t[1]), jax.nn.relu(t[2]) + t[3]]
        a += [jnp.sin(t[4]) * t[5], t[6] - t[7]]
        return (a[0] + a[1]) * jnp.tanh(a[2] + a[3])

    return f, (_n(rng, b, d), _n(rng, b, d), _n(rng, 8, d, d, scale=0.3), _n(rng, 8, d, d, scale=0.3)), ()


def decoders(rng):
    """Two independent small decode steps (layernorm, MLP, residual) of different widths."""
    dims = [16, 24]
    args = []
    for d in dims:
        args += [_n(rng, 2, d), _n(rng, d, 2 * d, scale=0.2), _n(rng, 2 * d, d, scale=0.2)]

    def ln(x):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    def f(*a):
        return [a[3 * i] + jax.nn.gelu(ln(a[3 * i]) @ a[3 * i + 1]) @ a[3 * i + 2] for i in range(len(dims))]

    return f, tuple(args), ()


def prefix_branches(rng):
    """A shared prefix feeding four branches joined along axis 1 (not a leading-axis join)."""

    def f(x, w):
        y = jax.nn.softmax(x, axis=-1)
        parts = [jnp.tanh(y @ w[i]) for i in range(4)]
        return jnp.concatenate(parts, axis=1).sum(1)

    return f, (_n(rng, 8, 16), _n(rng, 4, 16, 8, scale=0.3)), ()


def chain(rng):
    """One GEMM chain: nothing runs in parallel."""

    def f(x, a, b, c):
        return [jnp.tanh(jnp.tanh(x @ a) @ b) @ c]

    return f, (_n(rng, 8, 16), _n(rng, 16, 16, scale=0.3), _n(rng, 16, 16, scale=0.3), _n(rng, 16, 4)), ()


def passthrough(rng):
    """Outputs that no region computes: an input, a view of one, a literal, a constant."""
    table = np.arange(6, dtype=np.float32)

    def f(x, w):
        return x, x[1], 3.0, jnp.asarray(table), jax.jit(lambda a, b: a @ b)(x[0], w) + table[0], x[1:3]

    return f, (_n(rng, 4, 8), _n(rng, 8, 6)), ()


def donated(rng):
    """An output the shape of a donated input, written in place once the input is read."""

    def f(x, w, v):
        y = jnp.tanh(x @ w)
        return [x + y, v @ w, v * 2.0]

    return f, (_n(rng, 8, 8), _n(rng, 8, 8, scale=0.3), _n(rng, 8, 8)), (0, 2)


def integers(rng):
    """Integer and boolean buffers crossing regions."""

    def f(i, x, w):
        m = (i % 3) == 0
        y = jnp.where(m, x @ w, -x @ w)
        return [y, i * 2, m, jnp.argmax(y, axis=1)]

    return f, (rng.integers(0, 9, (4, 8)).astype(np.int32), _n(rng, 4, 8), _n(rng, 8, 8)), ()


def scalars(rng):
    """0-d values crossing regions: per-branch sums that scale other branches."""

    def f(x, w):
        s = [(x @ w[i]).sum() for i in range(3)]
        return [s[0], jnp.tanh(x @ w[0]) * s[1] + s[2], s[1] * s[2]]

    return f, (_n(rng, 4, 8), _n(rng, 3, 8, 8, scale=0.3)), ()


PROGRAMS = [
    experts_packed,
    experts_varied,
    cell,
    decoders,
    prefix_branches,
    chain,
    passthrough,
    donated,
    integers,
    scalars,
]


def specs_of(args):
    return [jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype) for a in args]


def flat(f):
    """f as a function returning a flat list of outputs."""
    return lambda *a: jax.tree_util.tree_leaves(f(*a))


def assert_matches_jit_directly(program, fn, args, rtol=1e-5, atol=0.0):
    """Two calls of an emitted program give jax.jit(fn)'s results, and it built a direct call
    (GPU tests: jax's Python dispatch would cost ~12 µs per argument, schedule/direct.py)."""
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    for _ in range(2):
        got = jax.tree_util.tree_leaves(program(*args))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol
            )
    assert program._direct is not None, program.why_not_direct


def pretend_cuda(monkeypatch) -> None:
    """auto's policy on this machine as on a CUDA device with thunky (nothing can run there)."""
    from jaxrw.schedule import thunky as sched_thunky

    monkeypatch.setattr(sched_thunky, "cuda_available", lambda: True)
    monkeypatch.setattr(sched_thunky, "thunky_available", lambda: True)

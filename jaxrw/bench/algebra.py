"""The algebra suite: linear-algebra code as people write it, where the written order or form
costs more than an equivalent one XLA does not find (and one case XLA already handles).

Sizes: `small` fits a 2-core CPU in milliseconds; `large` is sized for an H200 (n up to 8192).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .case import Instance, Rand, pick, register


def acc_sum(x, axis=None):
    """Sum accumulating in float32 when x is a 16-bit float (as jaxrw's reductions do)."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return jnp.sum(x, axis=axis, dtype=jnp.float32).astype(x.dtype)
    return jnp.sum(x, axis=axis)


def _square(size: str, dtype: str, count: int, n_small: int = 256, n_large: int = 8192, thin: int = 0):
    """Inputs: `count` n×n matrices (scaled by 1/sqrt(n)) and, if `thin`, an n×thin block."""
    n = pick(size, n_small, n_large)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        mats = tuple(r.weight(n, n, n) for _ in range(count))
        return (*mats, r.normal(n, thin)) if thin else mats

    return n, args


# --- matrix chains -------------------------------------------------------------------------------


@register("algebra")
def chain_mv(size: str, dtype: str) -> Instance:
    """(A@B)@v as written: an n³ product where A@(B@v) needs two thin ones."""
    n, args = _square(size, dtype, 2, thin=pick(size, 4, 16))
    return Instance(lambda A, B, v: (A @ B) @ v, args, hand=lambda A, B, v: A @ (B @ v), shape=f"n={n}")


@register("algebra")
def vmapped_chain(size: str, dtype: str) -> Instance:
    """jax.vmap(lambda x: A @ B @ x) over a batch of thin blocks: the vmapped product contracts the
    blocks' middle axis, which the chain rules did not reassociate before the forty-sixth session
    (an n³ product, then the batch; by hand A @ (B @ x))."""
    b, n, thin = pick(size, 32, 64), pick(size, 512, 4096), pick(size, 2, 4)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, n, n), r.weight(n, n, n), r.normal(b, n, thin)

    fn = jax.vmap(lambda A, B, x: A @ B @ x, (None, None, 0))
    hand = jax.vmap(lambda A, B, x: A @ (B @ x), (None, None, 0))
    return Instance(fn, args, hand=hand, shape=f"b={b} n={n} k={thin}")


@register("algebra")
def batched_chain_shared(size: str, dtype: str) -> Instance:
    """A[b]@B[b]@V with V shared by the batch (per-member matrices applied to one block of
    vectors): b n³ products where A@(B@V) needs thin ones. Not reassociated before the
    forty-fourth session (a helper timed 901 µs against 140 µs by hand on the H200)."""
    b, n, thin = pick(size, 4, 8), pick(size, 128, 2048), pick(size, 4, 16)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, b, n, n), r.weight(n, b, n, n), r.normal(n, thin)

    return Instance(lambda A, B, V: A @ B @ V, args, hand=lambda A, B, V: A @ (B @ V), shape=f"b={b} n={n}")


def _watch(x) -> None:
    """A monitoring hook, as training scripts keep one (logging a norm, checking for NaN): here it
    only receives the value."""


def _hooked(chain):
    def fn(A, B, v):
        jax.debug.callback(_watch, jnp.sum(v * v))
        return chain(A, B, v)

    return fn


@register("algebra")
def chain_mv_hooked(size: str, dtype: str) -> Instance:
    """chain_mv with a jax.debug.callback hook: the whole function fell back to jax.jit before the
    calls were taken out of the rewritten program (rewrite/effects.py)."""
    n, args = _square(size, dtype, 2, thin=pick(size, 4, 16))
    as_written, hand = _hooked(lambda A, B, v: (A @ B) @ v), _hooked(lambda A, B, v: A @ (B @ v))
    return Instance(as_written, args, hand=hand, shape=f"n={n}")


@register("algebra")
def chain4(size: str, dtype: str) -> Instance:
    """A@B@C@v left to right: two n³ products before the thin one."""
    n, args = _square(size, dtype, 3, thin=pick(size, 4, 16))
    return Instance(
        lambda A, B, C, v: A @ B @ C @ v, args, hand=lambda A, B, C, v: A @ (B @ (C @ v)), shape=f"n={n}"
    )


@register("algebra")
def chain_rect(size: str, dtype: str) -> Instance:
    """X@Y@Z with X tall and thin: m·r·m + m³ left to right, 2·m²·r right to left."""
    m, r_ = pick(size, 256, 8192), pick(size, 16, 64)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(r_, m, r_), r.weight(m, r_, m), r.weight(m, m, m)

    return Instance(lambda X, Y, Z: X @ Y @ Z, args, hand=lambda X, Y, Z: X @ (Y @ Z), shape=f"m={m} r={r_}")


@register("algebra")
def chain_left(size: str, dtype: str) -> Instance:
    """u@(A@B) with u a few rows: the n³ inner product is avoidable as (u@A)@B."""
    n = pick(size, 256, 8192)
    k = pick(size, 4, 16)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(k, n), r.weight(n, n, n), r.weight(n, n, n)

    return Instance(lambda u, A, B: u @ (A @ B), args, hand=lambda u, A, B: (u @ A) @ B, shape=f"n={n} k={k}")


# --- factoring -----------------------------------------------------------------------------------


@register("algebra")
def factor_right(size: str, dtype: str) -> Instance:
    """A@B + A@C: two n³ products where A@(B+C) needs one."""
    n, args = _square(size, dtype, 3)
    return Instance(lambda A, B, C: A @ B + A @ C, args, hand=lambda A, B, C: A @ (B + C), shape=f"n={n}")


@register("algebra")
def factor_left(size: str, dtype: str) -> Instance:
    """A@C - B@C: two products where (A-B)@C needs one."""
    n, args = _square(size, dtype, 3)
    return Instance(lambda A, B, C: A @ C - B @ C, args, hand=lambda A, B, C: (A - B) @ C, shape=f"n={n}")


@register("algebra")
def factor_three(size: str, dtype: str) -> Instance:
    """x@W1 + x@W2 + x@W3 (a sum of projections of one input): one product on the summed weights."""
    n, t = pick(size, 256, 4096), pick(size, 64, 2048)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(t, n), r.weight(n, n, n), r.weight(n, n, n), r.weight(n, n, n)

    return Instance(
        lambda x, a, b, c: x @ a + x @ b + x @ c,
        args,
        hand=lambda x, a, b, c: x @ (a + b + c),
        shape=f"t={t} n={n}",
    )


# --- low-rank and least squares ------------------------------------------------------------------


def _lora_args(size: str, dtype: str):
    t, d, rank = pick(size, 16, 64), pick(size, 256, 4096), pick(size, 8, 16)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(t, d), r.weight(d, d, d), r.weight(d, d, rank), r.weight(rank, rank, d)

    return f"t={t} d={d} r={rank}", args


@register("algebra")
def lora(size: str, dtype: str) -> Instance:
    """x@(W + A@B): the merged low-rank weight is rebuilt per call; x@W + (x@A)@B never builds it."""
    shape, args = _lora_args(size, dtype)
    return Instance(
        lambda x, W, A, B: x @ (W + A @ B), args, hand=lambda x, W, A, B: x @ W + (x @ A) @ B, shape=shape
    )


@register("algebra")
def lora_scaled(size: str, dtype: str) -> Instance:
    """x@(W + s·(A@B)) with a LoRA scale s: scalar moves plus the low-rank split."""
    shape, args = _lora_args(size, dtype)
    s = 0.5
    return Instance(
        lambda x, W, A, B: x @ (W + s * (A @ B)),
        args,
        hand=lambda x, W, A, B: x @ W + s * ((x @ A) @ B),
        shape=shape,
    )


@register("algebra")
def normal_equations(size: str, dtype: str) -> Instance:
    """The least-squares gradient X.T@X@w - X.T@y: the n²m Gram matrix is avoidable."""
    m, n = pick(size, 512, 8192), pick(size, 256, 4096)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, m, n), r.normal(n, 1), r.normal(m, 1)

    return Instance(
        lambda X, w, y: X.T @ X @ w - X.T @ y,
        args,
        hand=lambda X, w, y: X.T @ (X @ w - y),
        shape=f"m={m} n={n}",
    )


@register("algebra")
def gauss_newton(size: str, dtype: str) -> Instance:
    """A damped Gauss-Newton product (J.T@J)@v + λv, as the matrix is written in textbooks."""
    m, n = pick(size, 512, 8192), pick(size, 256, 4096)
    lam = 0.1

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, m, n), r.normal(n, 4)

    return Instance(
        lambda J, v: (J.T @ J) @ v + lam * v,
        args,
        hand=lambda J, v: J.T @ (J @ v) + lam * v,
        shape=f"m={m} n={n}",
    )


# --- scalar and transpose clutter ---------------------------------------------------------------


@register("algebra")
def scalar_clutter(size: str, dtype: str) -> Instance:
    """((2A)@(B/4))@(v/2): scalars scattered over a chain hide its cheap order."""
    n, args = _square(size, dtype, 2, thin=pick(size, 4, 16))
    return Instance(
        lambda A, B, v: ((2.0 * A) @ (B / 4.0)) @ (0.5 * v),
        args,
        hand=lambda A, B, v: 0.25 * (A @ (B @ v)),
        shape=f"n={n}",
    )


@register("algebra")
def transpose_clutter(size: str, dtype: str) -> Instance:
    """(B.T@A.T).T@v: a transposed product, transposed back, then applied to a thin block."""
    n, args = _square(size, dtype, 2, thin=pick(size, 4, 16))
    return Instance(lambda A, B, v: (B.T @ A.T).T @ v, args, hand=lambda A, B, v: A @ (B @ v), shape=f"n={n}")


# --- structured matrices ------------------------------------------------------------------------


@register("algebra")
def diag_scale(size: str, dtype: str) -> Instance:
    """diag(d)@A@diag(e): two dense n³ products that are a row and a column scaling."""
    n = pick(size, 256, 8192)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.positive(n), r.weight(n, n, n), r.positive(n)

    return Instance(
        lambda d, A, e: jnp.diag(d) @ A @ jnp.diag(e),
        args,
        hand=lambda d, A, e: d[:, None] * A * e[None, :],
        shape=f"n={n}",
    )


@register("algebra")
def eye_shift(size: str, dtype: str) -> Instance:
    """(A + λI)@V: the shifted matrix is materialized; A@V + λV reads A once."""
    n, k = pick(size, 256, 8192), pick(size, 4, 16)
    lam = 0.5

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, n, n), r.normal(n, k)

    return Instance(
        lambda A, V: (A + lam * jnp.eye(A.shape[0], dtype=A.dtype)) @ V,
        args,
        hand=lambda A, V: A @ V + lam * V,
        shape=f"n={n} k={k}",
    )


@register("algebra")
def outer_product(size: str, dtype: str) -> Instance:
    """outer(u, w)@A: a rank-one n×n matrix times A is u ⊗ (w@A)."""
    n = pick(size, 256, 8192)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(n), r.normal(n), r.weight(n, n, n)

    return Instance(
        lambda u, w, A: jnp.outer(u, w) @ A,
        args,
        hand=lambda u, w, A: u[:, None] * (w @ A)[None, :],
        shape=f"n={n}",
    )


@register("algebra")
def kron_matvec(size: str, dtype: str) -> Instance:
    """kron(A, B)@x: the (pq)² Kronecker matrix is never needed: (A@X@B.T) flattened."""
    p, q = pick(size, 16, 64), pick(size, 16, 64)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(p, p, p), r.weight(q, q, q), r.normal(p * q)

    def hand(A, B, x):
        return (A @ x.reshape(A.shape[1], B.shape[1]) @ B.T).reshape(-1)

    return Instance(lambda A, B, x: jnp.kron(A, B) @ x, args, hand=hand, shape=f"p={p} q={q}")


# --- reductions and slices of products ----------------------------------------------------------


@register("algebra")
def trace_product(size: str, dtype: str) -> Instance:
    """trace(A@B): an n³ product for n numbers; sum(A * B.T) needs n²."""
    n, args = _square(size, dtype, 2)
    return Instance(lambda A, B: jnp.trace(A @ B), args, hand=lambda A, B: acc_sum(A * B.T), shape=f"n={n}")


@register("algebra")
def diag_product(size: str, dtype: str) -> Instance:
    """diag(A@B): the diagonal of a product is a row-wise dot, sum(A * B.T, axis=1)."""
    n, args = _square(size, dtype, 2)
    return Instance(
        lambda A, B: jnp.diag(A @ B), args, hand=lambda A, B: acc_sum(A * B.T, axis=1), shape=f"n={n}"
    )


@register("algebra")
def batched_mahalanobis(size: str, dtype: str) -> Instance:
    """vmap(diag(X P Xᵀ)): each batch's squared Mahalanobis norms as a diagonal of a product: the
    m×m product per batch for its m numbers, where a row-wise dot of X P with X needs m·d."""
    b, m, d = pick(size, 8, 32), pick(size, 256, 2048), pick(size, 32, 128)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.normal(b, m, d), r.weight(d, b, d, d)

    def hand(X, P):
        return acc_sum((X @ P) * X, axis=2)

    fn = jax.vmap(lambda X, P: jnp.diag(X @ P @ X.T))
    return Instance(fn, args, hand=hand, shape=f"b={b} m={m} d={d}")


@register("algebra")
def multi_lora(size: str, dtype: str) -> Instance:
    """x_b @ (W + A_b B_b) under jax.vmap, an adapter per request (multi-LoRA serving): the
    merged [b, d, d] weights are formed per call, where x W for all rows plus (x_b A_b) B_b needs
    one shared GEMM and two thin batched ones."""
    b, s, d, r = pick(size, 8, 32), pick(size, 4, 16), pick(size, 256, 4096), pick(size, 8, 16)

    def args(seed: int) -> tuple:
        g = Rand(seed, dtype)
        return g.normal(b, s, d), g.weight(d, d, d), g.weight(d, b, d, r), g.weight(r, b, r, d)

    fn = jax.vmap(lambda x, w, a, bb: x @ (w + a @ bb), (0, None, 0, 0))

    def hand(x, w, a, bb):
        return x @ w + jnp.einsum("bsr,brd->bsd", jnp.einsum("bsd,bdr->bsr", x, a), bb)

    return Instance(fn, args, hand=hand, shape=f"b={b} s={s} d={d} r={r}")


@register("algebra")
def sum_product(size: str, dtype: str) -> Instance:
    """sum(A@B): the total of a product is a dot of A's column sums with B's row sums."""
    n, args = _square(size, dtype, 2)

    def hand(A, B):  # column sums of A times row sums of B, accumulated in float32
        f32 = jnp.float32
        return (jnp.sum(A, axis=0, dtype=f32) @ jnp.sum(B, axis=1, dtype=f32)).astype(A.dtype)

    return Instance(lambda A, B: jnp.sum(A @ B), args, hand=hand, shape=f"n={n}")


@register("algebra")
def slices_of_product(size: str, dtype: str) -> Instance:
    """(A@B)[:k] and (A@B)[:, j]: slices of a product are products of slices."""
    n, args = _square(size, dtype, 2)
    k = pick(size, 16, 256)

    def naive(A, B):
        P = A @ B
        return P[:k], P[:, 3]

    return Instance(naive, args, hand=lambda A, B: (A[:k] @ B, A @ B[:, 3]), shape=f"n={n} k={k}")


# --- elementwise identities ---------------------------------------------------------------------


def _vectors(size: str, dtype: str, count: int):
    shape = pick(size, (256, 256), (8192, 8192))

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return tuple(r.normal(*shape, scale=0.5) for _ in range(count))

    return f"{shape[0]}×{shape[1]}", args


@register("algebra")
def ew_exp_log(size: str, dtype: str) -> Instance:
    """log(exp(x)·exp(y)) is x+y: three transcendental functions that cancel."""
    shape, args = _vectors(size, dtype, 2)
    return Instance(lambda x, y: jnp.log(jnp.exp(x) * jnp.exp(y)), args, hand=lambda x, y: x + y, shape=shape)


@register("algebra")
def ew_factor(size: str, dtype: str) -> Instance:
    """a·b + a·c + sqrt(d·d): factoring and sqrt of a square (|d|); XLA fuses both forms."""
    shape, args = _vectors(size, dtype, 4)
    return Instance(
        lambda a, b, c, d: a * b + a * c + jnp.sqrt(d * d),
        args,
        hand=lambda a, b, c, d: a * (b + c) + jnp.abs(d),
        shape=shape,
    )


# --- no-regression: what XLA already does --------------------------------------------------------


@register("algebra")
def stacked_matvec_16(size: str, dtype: str) -> Instance:
    """16 products W@v_i stacked: XLA already merges them into one GEMM; jaxrw must not regress."""
    n = pick(size, 256, 4096)

    def args(seed: int) -> tuple:
        r = Rand(seed, dtype)
        return r.weight(n, n, n), r.normal(16, n)

    def naive(W, V):
        return jnp.stack([W @ V[i] for i in range(16)])

    return Instance(naive, args, hand=lambda W, V: V @ W.T, shape=f"n={n}")

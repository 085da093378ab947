"""verify's allowance for rounding: how far apart two correct evaluation orders of an output may lie.

`verify` compares a rewritten program's outputs with jax.jit's relative to jax.jit's outputs. Where
an output is a small difference of large terms (a residual, a gradient at an optimum, an objective
near zero), every order of evaluation rounds at the scale of the terms, not of the result
(docs/numerics.md, "Cancellation"), so two correct programs can differ by far more than the
tolerance relative to the result. This finds that scale by first-order stochastic error analysis of
the program as written: each floating-point value carries SAMPLES random samples of the absolute
error it holds. Inputs and constants are exact; each operation that rounds adds a fresh random error
of one unit roundoff of its result (a dot, a convolution or a sum: also of its terms,
sqrt(Σ (a_k b_k)²), at the precision it accumulates in: TF32 for float32 dots on a GPU under jax's
default precision); operations that only move or pick entries add none; every operation carries
its operands' errors through its derivative (jax.jvp), signed, so that errors cancel and damp as
they do in the program (an iteration converging to a fixed point keeps them bounded). Loops and
branches run the same way inside. An output entry's scale is the root mean square of its samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import compat

__all__ = ["scales_function", "SAMPLES"]

SAMPLES = 8  # enough that an entry's scale is rarely far below its spread (chi-square, 8 degrees)
_SEED = np.uint32(20261207)  # the first draw's seed

Value = tuple[Any, Any]  # (value, its error samples: an array (SAMPLES, *shape), or None: exact)

# operations that round nothing: they move, pick or negate entries, or give representable results
_EXACT = frozenset(
    """transpose reshape broadcast_in_dim squeeze expand_dims rev slice concatenate copy copy_p
    dynamic_slice dynamic_update_slice gather scatter pad select_n neg real imag conj abs sign floor
    ceil round max min reduce_max reduce_min argmax argmin sort clamp stop_gradient iota
    optimization_barrier bitcast_convert_type""".split()
)
_SUMS = frozenset({"reduce_sum", "cumsum", "reduce_window_sum"})  # linear sums: their squares' sums
_PRODUCTS = frozenset({"dot_general", "conv_general_dilated"})  # bilinear sums of products
_CONTROL = frozenset({"scan", "while", "cond", "custom_jvp_call", "custom_vjp_call"}) | compat.INLINED_CALLS


class _Unscalable(Exception):
    """The program calls out with results (io_callback): running it again would call again."""


def scales_function(flat: Callable, leaves: list) -> Callable[..., list] | None:
    """A jitted function of a signature's leaves returning each output's error scale (an array of
    its shape, in units of one rounding), or None where the program cannot be run so (it calls
    out with results)."""
    closed = jax.make_jaxpr(flat)(*leaves)

    def scales(*xs: Any) -> list:
        outs, _ = _run(closed.jaxpr, closed.consts, [(x, None) for x in xs], _SEED)
        return [_rms(v, t) for v, t in outs]

    try:
        jax.eval_shape(scales, *leaves)
    except _Unscalable:
        return None
    return jax.jit(scales)


def _rms(value: Any, samples: Any) -> Any:
    shape = np.shape(value)
    if samples is None:
        return jnp.zeros(shape, np.float32)
    m = jnp.abs(samples)
    top = jnp.max(m, axis=0)
    unit = jnp.where(top > 0, top, 1)
    return top * jnp.sqrt(jnp.mean((m / unit) ** 2, axis=0))  # scaled: squares stay in range


def _inexact(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = jnp.result_type(x)
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) and jnp.issubdtype(dtype, jnp.inexact)


def _read(env: dict, var: Any) -> Value:
    return (var.val, None) if compat.is_literal(var) else env[var]


def _run(jaxpr: Any, consts: Any, ins: list[Value], seed: Any) -> tuple[list[Value], Any]:
    """`jaxpr` evaluated on values with error samples: its outputs', and the seed to draw from next
    (a uint32, stepped once per equation)."""
    env: dict = {}
    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = (c, None)
    for var, p in zip(jaxpr.invars, ins, strict=True):
        env[var] = p
    for eqn in jaxpr.eqns:
        if eqn.effects and not eqn.outvars:
            continue  # a debug print: made once, by the program itself
        name = eqn.primitive.name
        if eqn.effects and name not in _CONTROL:
            raise _Unscalable(name)
        seed = seed * jnp.uint32(1664525) + jnp.uint32(1013904223)  # this equation's (an LCG)
        args = [_read(env, v) for v in eqn.invars]
        outs = _control(eqn, args, seed) if name in _CONTROL else _equation(eqn, args, seed)
        for var, p in zip(eqn.outvars, outs, strict=True):
            if not compat.is_dropvar(var):
                env[var] = p
    return [_read(env, v) for v in jaxpr.outvars], seed


def _equation(eqn: Any, ins: list[Value], seed: Any) -> list[Value]:
    """One operation: its result, its operands' errors carried through its derivative, and a
    fresh rounding error of its own."""
    values = [v for v, _ in ins]
    outs = compat.bind_equation(eqn.primitive, eqn.params, values)
    carried = _carried(eqn, ins, outs)
    sizes = _rounding(eqn, values, outs)
    result = []
    for i, (out, t, size) in enumerate(zip(outs, carried, sizes, strict=True)):
        if size is not None:
            noise = _noise(seed + jnp.uint32(7919 * i), out, size)
            t = noise if t is None else t + noise
        result.append((out, t))
    return result


def _carried(eqn: Any, ins: list[Value], outs: list) -> list:
    """The operands' error samples carried through the operation's derivative (None: no error);
    non-finite samples (0·inf in a derivative) count as none."""
    moving = [i for i, (_, t) in enumerate(ins) if t is not None]
    if not moving or not any(_inexact(o) for o in outs):
        return [None] * len(outs)
    values = [v for v, _ in ins]

    def at(*xs: Any) -> list:
        vals = list(values)
        for i, x in zip(moving, xs, strict=True):
            vals[i] = x
        return compat.bind_equation(eqn.primitive, eqn.params, vals)

    primals = [values[i] for i in moving]
    try:
        samples = jax.vmap(lambda *ts: jax.jvp(at, primals, list(ts))[1])(
            *[ins[i][1].astype(jnp.result_type(values[i])) for i in moving]
        )
    except Exception:  # noqa: BLE001 - no derivative (a callback, a custom call): no error carried
        return [None] * len(outs)
    return [
        jnp.where(jnp.isfinite(t), t, 0) if _inexact(o) and t.dtype != jax.dtypes.float0 else None
        for o, t in zip(outs, samples, strict=True)
    ]


def _rounding(eqn: Any, values: list, outs: list) -> list:
    """The size of the rounding each output adds (None: none): one unit roundoff of |result|, and
    for a dot, a convolution or a sum also of the root of the sum of its terms' squares (taken
    scaled, so that squares neither overflow nor vanish) at the precision it accumulates in."""
    name = eqn.primitive.name
    if name in _EXACT or not any(_inexact(o) for o in outs):
        return [None] * len(outs)
    if name == "convert_element_type" and _inexact(values[0]) and _inexact(outs[0]):
        if _eps(outs[0]) <= _eps(values[0]):
            return [None]  # widening: exact
    own = [_finite(_eps(o) * jnp.abs(o)) if _inexact(o) else None for o in outs]
    if name in _PRODUCTS:
        (a, sa), (b, sb) = (_scaled(v) for v in values)
        a, b = (x.astype(jnp.promote_types(a.dtype, b.dtype)) for x in (a, b))
        params = {**eqn.params, "preferred_element_type": a.dtype}
        terms = jnp.sqrt(compat.bind_equation(eqn.primitive, params, [a**2, b**2])[0]) * sa * sb
        return [_finite(jnp.hypot(_accumulation_eps(eqn, values) * terms, own[0]))]
    if name in _SUMS or name == "scatter-add":
        data = [0, 2] if name == "scatter-add" else [0]
        scaled = {i: _scaled(values[i]) for i in data}
        s = jnp.maximum(*[scaled[i][1] for i in data]) if len(data) > 1 else scaled[data[0]][1]
        squares = [(scaled[i][0] * scaled[i][1] / s) ** 2 if i in scaled else v for i, v in enumerate(values)]
        terms = jnp.sqrt(compat.bind_equation(eqn.primitive, eqn.params, squares)[0]) * s
        return [_finite(jnp.hypot(_eps(outs[0]) * terms, own[0]))]
    return own


def _eps(x: Any) -> Any:
    """The machine epsilon of a floating-point value's type (of its parts, for a complex one)."""
    return jnp.finfo(jnp.result_type(x)).eps


def _accumulation_eps(eqn: Any, values: list) -> Any:
    """The epsilon a dot or convolution rounds its products and sums at: its operands' type's, or
    float32's for narrower ones (XLA accumulates them in float32), or TF32's (2^-10) for float32
    operands on a GPU under jax's default precision."""
    floats = [v for v in values if _inexact(v)]  # an integer operand (int8 x float32) is exact
    eps = max(float(_eps(v)) for v in floats)
    if eps > float(jnp.finfo(jnp.float32).eps):
        return jnp.finfo(jnp.float32).eps
    f32 = all(jnp.result_type(v) == jnp.float32 for v in floats)
    default = all(p is None or str(p).endswith("DEFAULT") for p in eqn.params.get("precision") or ())
    configured = jax.config.jax_default_matmul_precision in (None, "default", "tensorfloat32")
    if f32 and default and configured and jax.default_backend() == "gpu":
        return 2.0**-10
    return eps


def _scaled(x: Any) -> tuple[Any, Any]:
    """(|x| / s, s) with s the largest finite |x| (1 where there is none), in float32, or float64
    for a 64-bit value."""
    m = jnp.abs(x)
    m = m.astype(jnp.float64 if m.dtype.itemsize == 8 and jax.config.jax_enable_x64 else jnp.float32)
    m = jnp.where(jnp.isfinite(m), m, 0)
    s = jnp.max(m, initial=0)
    s = jnp.where(s > 0, s, 1)
    return m / s, s


def _finite(size: Any) -> Any:
    return jnp.where(jnp.isfinite(size), size, 0)


def _noise(seed: Any, out: Any, size: Any) -> Any:
    """SAMPLES random errors of `size` (uniform, of unit variance; a complex value's parts each of
    its part's size), from an integer hash of the entry's index and `seed`: elementwise integer
    ops, which compile to little (a PRNG per operation made the program 20-150x slower to compile)."""
    dtype = jnp.result_type(out)
    shape = (SAMPLES, *np.shape(out))

    def uniform(salt: int) -> Any:
        h = lax.iota(jnp.uint32, int(np.prod(shape))).reshape(shape) * jnp.uint32(0x9E3779B1)
        h = h ^ (seed + jnp.uint32(salt))
        h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
        h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
        h = h ^ (h >> 16)
        unit = (h >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # [0, 1)
        return (unit * 2 - 1) * np.sqrt(3.0)

    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.finfo(dtype).eps
        re, im = uniform(1) * jnp.abs(out.real) * part, uniform(2) * jnp.abs(out.imag) * part
        return (re + 1j * im).astype(dtype)
    return (uniform(0) * size).astype(dtype)


def _control(eqn: Any, ins: list[Value], seed: Any) -> list[Value]:
    """A call, loop or branch: its body run the same way, inside the same kind of loop or branch
    (the loop's condition and the branch index read values; the seed is carried, so each step
    draws errors of its own)."""
    name, params = eqn.primitive.name, eqn.params
    if name == "cond":
        branches = [lambda ops, s, br=br: _run_filled(br, list(ops), s) for br in params["branches"]]
        return list(lax.switch(ins[0][0], branches, _filled(ins[1:]), seed)[0])
    if name == "scan":
        body, nc, ncarry = params["jaxpr"], compat.scan_num_consts(params), compat.scan_num_carry(params)
        consts, carry, xs = ins[:nc], _filled(ins[nc : nc + ncarry]), ins[nc + ncarry :]
        xs = [(v, None if t is None else jnp.moveaxis(t, 0, 1)) for v, t in xs]  # scanned axis first

        def step(c: tuple, x: tuple) -> tuple:
            outs, s = _run_filled(body, [*consts, *c[0], *x], c[1])
            return (outs[:ncarry], s), outs[ncarry:]

        (last, _), ys = lax.scan(step, (carry, seed), xs, length=params["length"], reverse=params["reverse"])
        return [*last, *[(v, None if t is None else jnp.moveaxis(t, 1, 0)) for v, t in ys]]
    if name == "while":
        cond, body = params["cond_jaxpr"], params["body_jaxpr"]
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        cconsts, bconsts, init = ins[:cn], ins[cn : cn + bn], _filled(ins[cn + bn :])

        def test(c: tuple) -> Any:
            return _run(cond.jaxpr, cond.consts, [*cconsts, *c[0]], c[1])[0][0][0]

        return list(
            lax.while_loop(test, lambda c: _run_filled(body, [*bconsts, *c[0]], c[1]), (init, seed))[0]
        )
    body = compat.call_body(eqn)  # a jit, a checkpoint, a custom_jvp/custom_vjp primal
    return _run(body.jaxpr, body.consts, ins, seed)[0]


def _run_filled(body: Any, ins: list[Value], seed: Any) -> tuple[tuple, Any]:
    """A loop's or branch's closed body run on `ins`: its outputs as the loop carries them, and the
    next seed."""
    outs, seed = _run(body.jaxpr, body.consts, ins, seed)
    return _filled(outs), seed


def _filled(values: list[Value]) -> tuple:
    """Values as a loop carries them: every floating-point value with its samples (zeros where
    exact), so that the carry keeps one structure from step to step."""
    filled = []
    for v, t in values:
        v = jnp.asarray(v) if not hasattr(v, "dtype") else v
        if _inexact(v) and t is None:
            t = jnp.zeros((SAMPLES, *np.shape(v)), v.dtype)
        filled.append((v, t))
    return tuple(filled)

"""verify's allowance for cancellation: the scale at which each output's rounding errors lie.

`verify` compares a rewritten program's outputs with jax.jit's relative to jax.jit's outputs. Where
an output is a small difference of large terms (a residual, a gradient at an optimum, an objective
near zero), every order of evaluation rounds at the scale of the terms, not of the result
(docs/numerics.md, "Cancellation"), so two correct programs can differ by far more than the
tolerance relative to the result. This runs the program as written on (value, scale) pairs to find
that scale, `|f|(|x|)` of the reordering bound extended past sums and products: sums add their
operands' scales, products and dots combine scales with absolute values, layout ops move scales as
they move values, every other operation carries its operands' scales through its derivative
(jax.jvp), and each rounding operation adds its result's magnitude. Loops, branches and calls are
run the same way inside (`lax.scan`, `lax.while_loop`, `lax.switch` on pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import compat

__all__ = ["scales_function"]

Pair = tuple[Any, Any]  # (value, scale): the scale is float32, or float64 for 64-bit values

# operations that only move or pick entries: the same operation moves the scales (the positions of
# the operands that are data; the others, indices and predicates, keep their values)
_MOVES = {
    **dict.fromkeys(
        [
            "transpose",
            "reshape",
            "broadcast_in_dim",
            "squeeze",
            "expand_dims",
            "rev",
            "slice",
            "concatenate",
            "copy",
            "copy_p",
        ],
        None,
    ),  # every operand is data
    "dynamic_slice": (0,),
    "dynamic_update_slice": (0, 1),
    "gather": (0,),
    "pad": (0, 1),
    "select_n": "cases",  # the first operand is the predicate
}
_SUMS = frozenset({"add", "sub", "add_any"})
_SAME = frozenset({"neg", "conj", "real", "imag", "reduce_precision"})  # no rounding of their own
_CALLS = compat.INLINED_CALLS | {"custom_jvp_call", "custom_vjp_call"}
_SIGNS = 20261207  # the seed of the random signs `_through_derivative` gives its tangents


class _Unscalable(Exception):
    """The program calls out with results (io_callback): running it again would call again."""


def scales_function(flat: Callable, leaves: list) -> Callable[..., list] | None:
    """A jitted function of a signature's leaves returning each output's error scale (an array of
    its shape), or None where the program cannot be run on pairs (it calls out with results)."""
    closed = jax.make_jaxpr(flat)(*leaves)
    try:
        jax.eval_shape(lambda *xs: _run(closed.jaxpr, closed.consts, [_pair(x) for x in xs]), *leaves)
    except _Unscalable:
        return None
    return jax.jit(lambda *xs: [s for _, s in _run(closed.jaxpr, closed.consts, [_pair(x) for x in xs])])


def _scale_dtype(dtype: Any) -> Any:
    dt = np.dtype(dtype) if not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else None
    return np.float64 if dt is not None and dt in (np.float64, np.complex128) else np.float32


def _inexact(dtype: Any) -> bool:
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) and jnp.issubdtype(dtype, jnp.inexact)


def _magnitude(x: Any) -> Any:
    """|x| as a scale (zeros for integers, booleans and keys, which carry no rounding)."""
    dtype, shape = jnp.result_type(x) if not hasattr(x, "dtype") else x.dtype, np.shape(x)
    if not _inexact(dtype):
        return jnp.zeros(shape, _scale_dtype(dtype))
    return lax.convert_element_type(jnp.abs(x), _scale_dtype(dtype))


def _pair(x: Any) -> Pair:
    return x, _magnitude(x)


def _fit(scale: Any, value: Any) -> Any:
    """`scale` in `value`'s scale dtype and shape, strongly typed (loop carries must match)."""
    dtype = value.dtype if hasattr(value, "dtype") else jnp.result_type(value)
    if not _inexact(dtype):
        return jnp.zeros(np.shape(value), _scale_dtype(dtype))
    return lax.convert_element_type(jnp.broadcast_to(scale, np.shape(value)), _scale_dtype(dtype))


def _read(env: dict, var: Any) -> Pair:
    if compat.is_literal(var):
        value = np.asarray(var.val, dtype=var.aval.dtype) if hasattr(var.aval, "dtype") else var.val
        return var.val, _magnitude(value)
    return env[var]


def _run(jaxpr: Any, consts: Any, pairs: list) -> list[Pair]:
    """`jaxpr` evaluated on (value, scale) pairs: its outputs' pairs."""
    env: dict = {}
    for var, c in zip(jaxpr.constvars, consts, strict=True):
        env[var] = _pair(c)
    for var, p in zip(jaxpr.invars, pairs, strict=True):
        env[var] = p
    for eqn in jaxpr.eqns:
        if eqn.effects and not eqn.outvars:
            continue  # a debug print: made once, by the program itself
        if eqn.effects and eqn.primitive.name not in _CALLS | {"scan", "while", "cond"}:
            raise _Unscalable(eqn.primitive.name)
        outs = _equation(eqn, [_read(env, v) for v in eqn.invars])
        for var, p in zip(eqn.outvars, outs, strict=True):
            if not compat.is_dropvar(var):
                env[var] = (p[0], _fit(p[1], p[0]))
    return [_read(env, v) for v in jaxpr.outvars]


def _equation(eqn: Any, ins: list[Pair]) -> list[Pair]:
    name, params = eqn.primitive.name, eqn.params
    if name in _CALLS or name in ("scan", "while", "cond"):
        return _control(eqn, ins)
    values = [v for v, _ in ins]
    outs = compat.bind_equation(eqn.primitive, params, values)
    if name in _MOVES:
        where = _MOVES[name]
        data = range(len(ins)) if where is None else range(1, len(ins)) if where == "cases" else where
        moved = [s if i in data else v for i, (v, s) in enumerate(ins)]
        if name == "gather":
            params = {**params, "fill_value": 0}
        return [(outs[0], compat.bind_equation(eqn.primitive, params, moved)[0])]
    rounding = _magnitude(outs[0])
    if name in _SAME:
        return [(outs[0], ins[0][1])]
    if name in _SUMS:
        return [(outs[0], _quadrature(ins[0][1], ins[1][1], rounding))]
    if name == "mul":
        (a, sa), (b, sb) = ins
        return [(outs[0], _quadrature(sa * _magnitude(b), _magnitude(a) * sb, rounding))]
    if name == "dot_general":
        (a, sa), (b, sb) = ins
        acc = {**params, "preferred_element_type": rounding.dtype}
        ma, mb = (lax.convert_element_type(_magnitude(x), rounding.dtype) for x in (a, b))
        left = compat.bind_equation(eqn.primitive, acc, [_fit(sa, ma) ** 2, mb**2])[0]
        right = compat.bind_equation(eqn.primitive, acc, [ma**2, _fit(sb, mb) ** 2])[0]
        return [(outs[0], jnp.sqrt(left + right + rounding**2))]
    if name in ("reduce_sum", "cumsum"):
        return [
            (
                outs[0],
                jnp.sqrt(compat.bind_equation(eqn.primitive, params, [ins[0][1] ** 2])[0] + rounding**2),
            )
        ]
    if name == "convert_element_type":
        moved = compat.bind_equation(eqn.primitive, {**params, "new_dtype": rounding.dtype}, [ins[0][1]])[0]
        return [(outs[0], _quadrature(moved, rounding))]
    return _through_derivative(eqn, ins, outs)


def _quadrature(*scales: Any) -> Any:
    """Independent rounding errors' scales combined as they add up on average: sqrt(sum of squares)."""
    return jnp.sqrt(sum(s**2 for s in scales))


def _through_derivative(eqn: Any, ins: list[Pair], outs: list) -> list[Pair]:
    """Any other operation: its operands' scales carried through its derivative, plus the
    magnitude of its result (one rounding); the magnitude alone where jax has no derivative.
    The tangents are the scales with random signs (a fixed seed), so that an operation that mixes
    entries (a solve, an FFT) adds them as independent errors add, not as signed values cancel."""

    def tangent(i: int, v: Any, s: Any) -> Any:
        dtype = v.dtype if hasattr(v, "dtype") else jnp.result_type(v)
        if not _inexact(dtype):
            return np.zeros(np.shape(v), jax.dtypes.float0)
        signs = jax.random.rademacher(jax.random.fold_in(jax.random.key(_SIGNS), i), np.shape(v), s.dtype)
        return lax.convert_element_type(s * signs, dtype)

    def bound(*xs: Any) -> list:
        return compat.bind_equation(eqn.primitive, eqn.params, list(xs))

    try:
        _, carried = jax.jvp(bound, [v for v, _ in ins], [tangent(i, v, s) for i, (v, s) in enumerate(ins)])
    except Exception:  # noqa: BLE001 - no derivative (a callback, a custom call): rounding alone
        carried = [None] * len(outs)
    pairs = []
    for out, t in zip(outs, carried, strict=True):
        scale = _magnitude(out)
        if t is not None and _inexact(out.dtype) and t.dtype != jax.dtypes.float0:
            scale = _quadrature(scale, _magnitude(t))
        pairs.append((out, scale))
    return pairs


def _control(eqn: Any, ins: list[Pair]) -> list[Pair]:
    """A call, loop or branch run on pairs: its body evaluated on pairs, inside the same kind of
    loop or branch (the loop's condition and the branch index read values)."""
    name, params = eqn.primitive.name, eqn.params
    if name in _CALLS:
        body = compat.call_body(eqn)
        return _run(body.jaxpr, body.consts, ins)
    if name == "cond":
        branches = [
            lambda ops, br=br: tuple(_fitted(_run(br.jaxpr, br.consts, list(ops))))
            for br in params["branches"]
        ]
        return list(lax.switch(ins[0][0], branches, tuple(ins[1:])))
    if name == "scan":
        body, nc, ncarry = params["jaxpr"], compat.scan_num_consts(params), compat.scan_num_carry(params)
        consts, carry, xs = ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]

        def step(c: tuple, x: tuple) -> tuple:
            outs = _fitted(_run(body.jaxpr, body.consts, [*consts, *c, *x]))
            return tuple(outs[:ncarry]), tuple(outs[ncarry:])

        last, ys = lax.scan(step, tuple(carry), tuple(xs), length=params["length"], reverse=params["reverse"])
        return [*last, *ys]
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    cconsts, bconsts, init = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
    return list(
        lax.while_loop(
            lambda c: _run(cond.jaxpr, cond.consts, [*cconsts, *c])[0][0],
            lambda c: tuple(_fitted(_run(body.jaxpr, body.consts, [*bconsts, *c]))),
            tuple(init),
        )
    )


def _fitted(pairs: list[Pair]) -> list[Pair]:
    """Pairs as a loop carries them: each scale in its value's scale dtype."""
    return [(v, _fit(s, v)) for v, s in pairs]

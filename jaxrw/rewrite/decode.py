"""Extracted choice -> a JAX callable, built through a per-constructor table of jax.lax calls.

No source is generated or evaluated: the returned function walks the chosen nodes in dependency
order and calls the table entry of each. Original equations (opaque and parameterised ops) are
re-bound exactly as traced, so decoding an unrewritten program reproduces it bit for bit.
Subterms built from constants alone (concatenations or transposes of closed-over weights) are
evaluated once here and enter the program as constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import compat
from ..errors import RewriteStageError
from .cost import HOISTABLE, itemsize, relayout
from .encode import Program
from .extract import reachable
from .graph import EGraphView, Node
from .terms import DEFAULT_CFG

__all__ = ["decode", "DECODERS", "FOLDABLE", "Hoisted", "check_decoded"]

_UNARY_FNS: dict[str, Callable] = {
    "exp": lax.exp,
    "exp2": lax.exp2,
    "log": lax.log,
    "log1p": lax.log1p,
    "expm1": lax.expm1,
    "tanh": lax.tanh,
    "logistic": lax.logistic,
    "sin": lax.sin,
    "cos": lax.cos,
    "tan": lax.tan,
    "sqrt": lax.sqrt,
    "rsqrt": lax.rsqrt,
    "cbrt": lax.cbrt,
    "abs": lax.abs,
    "sign": lax.sign,
    "floor": lax.floor,
    "ceil": lax.ceil,
    "erf": lax.erf,
    "erf_inv": lax.erf_inv,
    "is_finite": lax.is_finite,
    "not": lax.bitwise_not,
    "asin": lax.asin,
    "acos": lax.acos,
    "atan": lax.atan,
    "sinh": lax.sinh,
    "cosh": lax.cosh,
    "asinh": lax.asinh,
    "acosh": lax.acosh,
    "atanh": lax.atanh,
    "square": lax.square,
}
_BINARY_FNS: dict[str, Callable] = {
    "max": lax.max,
    "min": lax.min,
    "pow": lax.pow,
    "atan2": lax.atan2,
    "rem": lax.rem,
    "and": lax.bitwise_and,
    "or": lax.bitwise_or,
    "xor": lax.bitwise_xor,
    "eq": lax.eq,
    "ne": lax.ne,
    "lt": lax.lt,
    "le": lax.le,
    "gt": lax.gt,
    "ge": lax.ge,
    "nextafter": lax.nextafter,
}
# Constructors that are exact data movement: applied to constants they are folded at build time
# (as are the size-keeping layout changes of cost.RELAYOUTS).
FOLDABLE = frozenset({"concat", "transpose", "slice"})


class _Ctx:
    def __init__(self, program: Program, view: EGraphView, args: list[Any], original: frozenset[str]):
        self.program = program
        self.view = view
        self.args = args
        self.original = original  # e-classes of the program as written (not created by rewrites)
        self.opaque_cache: dict[tuple, list[Any]] = {}


def _dot(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    nb, lc, rc, cfg = node.attrs
    dims = (((lc,), (rc,)), (tuple(range(nb)), tuple(range(nb))))
    if cfg == DEFAULT_CFG:
        # a dot a rule created where the program had none to copy: bf16/f16 accumulate in f32
        a, b = vals
        dt = a.dtype
        if jnp.issubdtype(dt, jnp.floating) and jnp.finfo(dt).bits < 32:
            out = lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
            return lax.convert_element_type(out, dt)
        return lax.dot_general(a, b, dims, preferred_element_type=dt)
    prim, params = ctx.program.params[cfg]
    return prim.bind(vals[0], vals[1], dimension_numbers=dims, **params)


def _scalar(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    num, den, dt = node.attrs
    dtype = jnp.dtype(dt)
    if jnp.issubdtype(dtype, jnp.integer):
        return np.asarray(num // den, dtype=dtype)
    return np.asarray(num / den, dtype=dtype)


def _reduce_typed(fn: Callable) -> Callable[[_Ctx, Node, list[Any]], Any]:
    return lambda ctx, n, v: fn(v[0], tuple(n.attrs[0]))


def _pad(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    cfg = node.attrs[0]
    triples = tuple(tuple(cfg[i : i + 3]) for i in range(0, len(cfg), 3))
    return lax.pad(vals[0], vals[1], triples)


def _op(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    _name, pid = node.attrs
    prim, params = ctx.program.params[pid]
    return compat.bind_equation(prim, params, vals)[0]


def _opaque(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    eqn_idx, out = node.attrs
    key = (eqn_idx, tuple(id(v) for v in vals))
    if key not in ctx.opaque_cache:
        replacement = ctx.program.eqn_fns.get(eqn_idx)
        if replacement is not None:  # control flow whose bodies were rewritten
            ctx.opaque_cache[key] = list(replacement(vals))
        else:
            eqn = ctx.program.eqns[eqn_idx]
            ctx.opaque_cache[key] = compat.bind_equation(eqn.primitive, eqn.params, vals)
    return ctx.opaque_cache[key][out]


def _sum(ctx: _Ctx, node: Node, vals: list[Any]) -> Any:
    (x,) = vals
    axes = tuple(node.attrs[0])
    dt = x.dtype
    if jnp.issubdtype(dt, jnp.floating) and jnp.finfo(dt).bits < 32 and node.eclass not in ctx.original:
        # a reduction created by a rewrite in bf16/f16 accumulates in float32
        return lax.convert_element_type(lax.reduce_sum(lax.convert_element_type(x, jnp.float32), axes), dt)
    return lax.reduce_sum(x, axes)


DECODERS: dict[str, Callable[[_Ctx, Node, list[Any]], Any]] = {
    "var": lambda ctx, n, v: ctx.args[n.attrs[0]],
    "const": lambda ctx, n, v: ctx.program.consts[n.attrs[0]],
    "add": lambda ctx, n, v: lax.add(*v),
    "sub": lambda ctx, n, v: lax.sub(*v),
    "mul": lambda ctx, n, v: lax.mul(*v),
    "div": lambda ctx, n, v: lax.div(*v),
    "neg": lambda ctx, n, v: lax.neg(*v),
    "unary": lambda ctx, n, v: _UNARY_FNS[n.attrs[0]](*v),
    "binary": lambda ctx, n, v: _BINARY_FNS[n.attrs[0]](*v),
    "dot": _dot,
    "transpose": lambda ctx, n, v: lax.transpose(v[0], tuple(n.attrs[0])),
    "concat": lambda ctx, n, v: lax.concatenate(v, n.attrs[0]),
    "slice": lambda ctx, n, v: lax.slice_in_dim(v[0], n.attrs[1], n.attrs[2], axis=n.attrs[0]),
    "sum": _sum,
    "op": _op,
    "opaque": _opaque,
    # typed forms (terms.py): each binds the primitive it is named after, with the same params
    "scalar": _scalar,
    "integer_pow": lambda ctx, n, v: lax.integer_pow(v[0], n.attrs[0]),
    "stack": lambda ctx, n, v: lax.stack(v, n.attrs[0]),
    "broadcast_in_dim": lambda ctx, n, v: lax.broadcast_in_dim(v[0], tuple(n.attrs[0]), tuple(n.attrs[1])),
    "reshape": lambda ctx, n, v: lax.reshape(v[0], tuple(n.attrs[0])),
    "squeeze": lambda ctx, n, v: lax.squeeze(v[0], (n.attrs[0],)),
    "convert_element_type": lambda ctx, n, v: lax.convert_element_type(v[0], jnp.dtype(n.attrs[0])),
    "select_n": lambda ctx, n, v: lax.select_n(*v),
    "iota": lambda ctx, n, v: lax.broadcasted_iota(jnp.dtype(n.attrs[0]), tuple(n.attrs[1]), n.attrs[2]),
    "pad": _pad,
    "slice_nd": lambda ctx, n, v: lax.slice(v[0], tuple(n.attrs[0]), tuple(n.attrs[1])),
    "reduce_max": _reduce_typed(lax.reduce_max),
    "reduce_min": _reduce_typed(lax.reduce_min),
}


def _flatten_concats(view: EGraphView, choice: dict[str, str], node: Node) -> list[str]:
    """Operands of a left-nested chain of binary concats along one axis, as one n-ary concat."""
    axis = node.attrs[0]
    rights = []
    while True:  # a loop, not recursion: jnp.concatenate of 1,100 arrays is a chain of 1,099 links
        left, right = node.children
        rights.append(right)
        node = view.nodes[choice[left]]
        if node.op != "concat" or node.attrs[0] != axis:
            return [left, *reversed(rights)]


# Parameter sets one hoisted signature keeps values for at once, where they fit max_hoist_bytes: a
# few checkpoints or ensemble members called in turn (each set is one more copy of the values)
MAX_SETS = 4


@dataclass
class Hoisted:
    """The program split for hoisting: `prologue(*slow_leaves)` computes the values that depend
    only on slow (hoisted) inputs and constants; `main(*all_leaves, *values)` does the rest, and
    `main_used(*leaves_it_reads, *values)` is the same without the leaves it does not read (most
    slow ones), so the hot call passes fewer arrays."""

    prologue: Callable[..., list[Any]]
    main: Callable[..., list[Any]]
    slow: tuple[int, ...]
    nbytes: int  # size of the values the prologue hands to main (kept between calls)
    n_values: int
    main_args: tuple[int, ...]  # the leaves main reads, in order
    main_used: Callable[..., list[Any]]
    sets: int = 1  # parameter sets whose values may be kept at once (`fit`: 1 to MAX_SETS)

    def fit(self, max_bytes: int) -> int:
        """Sets the number of parameter sets whose values fit `max_bytes` together (at least one:
        the caller checked that one fits), at most MAX_SETS, and returns it."""
        self.sets = MAX_SETS if self.nbytes <= 0 else max(1, min(MAX_SETS, max_bytes // self.nbytes))
        return self.sets


def decode(
    program: Program, view: EGraphView, choice: dict[str, str], original_classes: frozenset[str] = frozenset()
) -> Callable[..., list[Any]]:
    """A function of the flat inputs returning the flat outputs of the chosen program. When the
    view has slow inputs, the function carries `.hoisted`, its prologue/main split (or None)."""
    order = reachable(view, choice, view.outputs)
    nodes = {c: view.nodes[choice[c]] for c in order}
    # n-ary concatenates: inner links of a same-axis chain are not materialized on their own
    concat_parts: dict[str, list[str]] = {}
    for c, n in nodes.items():
        if n.op == "concat":
            concat_parts[c] = _flatten_concats(view, choice, n)
    folded = _fold_constants(program, view, nodes, order, concat_parts, original_classes)
    live = _live(nodes, concat_parts, folded, view.outputs)
    order = [c for c in order if c in live]  # not the folded values' operands, nor inner links

    def evaluate(args: list[Any], env: dict[str, Any], classes: list[str]) -> dict[str, Any]:
        ctx = _Ctx(program, view, args, original_classes)
        for c in classes:
            if c in env:
                continue
            n = nodes[c]
            # bound where the class's original equation was written (its named scope); a class
            # only a rewrite made has none
            at = view.order.get(c, 0) - 1
            with compat.written_at(program.sources[at] if 0 <= at < len(program.sources) else None):
                if n.op == "concat":  # unused inner links of the chain are dropped by XLA
                    env[c] = lax.concatenate([env[p] for p in concat_parts[c]], n.attrs[0])
                else:
                    env[c] = DECODERS[n.op](ctx, n, [env[ch] for ch in n.children])
        return env

    def run(*args: Any) -> list[Any]:
        env = evaluate(list(args), dict(folded), order)
        return _as_traced(program, [env[c] for c in view.outputs])

    run.hoisted = _split(program, view, nodes, order, concat_parts, folded, evaluate) if view.slow else None  # type: ignore[attr-defined]
    return run


def _as_traced(program: Program, outs: list[Any]) -> list[Any]:
    """The outputs with the traced program's weak types: a rewrite can drop the only strongly
    typed operand (x @ ones(4) -> sum(x) of a weak x) or bring in a strong scalar (y*3 + y ->
    y*4), and a weak type decides how the caller's next operation promotes."""
    return [compat.with_weak_type(x, bool(a.weak_type)) for x, a in zip(outs, program.out_avals, strict=True)]


def _split(program, view, nodes, order, concat_parts, folded, evaluate) -> Hoisted | None:
    """Split at the classes built from constants and slow inputs by hoistable ops."""
    pro: set[str] = set()
    for c in order:
        n = nodes[c]
        if n.op == "var":
            ok = n.attrs[0] in view.slow
        elif n.op == "const":
            ok = True
        else:
            parts = _operands(nodes, concat_parts, c)  # a chain's parts: its inner links are not in order
            ok = (n.op in HOISTABLE or relayout(n, view)) and all(ch in pro for ch in parts)
        if ok:
            pro.add(c)
    pro_order = [c for c in order if c in pro]  # before pruning: a relayout may feed both sides
    needed = set(_unrelayout(nodes, view, concat_parts, pro, view.outputs))
    values = [c for c in order if c in pro and c in needed and nodes[c].op not in ("var", "const")]
    values = [c for c in values if c not in folded]
    if not values:
        return None
    main_order = [c for c in order if c not in pro or c in needed]
    main_args = tuple(sorted({nodes[c].attrs[0] for c in main_order if nodes[c].op == "var"}))
    slow = tuple(sorted(view.slow))
    n_args = max([nodes[c].attrs[0] + 1 for c in order if nodes[c].op == "var"] + [slow[-1] + 1])

    def prologue(*slow_leaves: Any) -> list[Any]:
        args: list[Any] = [None] * n_args
        for i, x in zip(slow, slow_leaves, strict=True):
            args[i] = x
        env = evaluate(args, dict(folded), pro_order)
        return [env[c] for c in values]

    def main_used(*used_and_values: Any) -> list[Any]:
        k = len(main_args)
        args: list[Any] = [None] * n_args
        for i, x in zip(main_args, used_and_values[:k], strict=True):
            args[i] = x
        env = dict(folded)
        env.update(zip(values, used_and_values[k:], strict=True))
        env = evaluate(args, env, main_order)
        return _as_traced(program, [env[c] for c in view.outputs])

    def main(*leaves_and_values: Any) -> list[Any]:
        k = len(leaves_and_values) - len(values)
        return main_used(*[leaves_and_values[i] for i in main_args], *leaves_and_values[k:])

    nbytes = sum(int(math.prod(view.shapes[c])) * itemsize(view.dtypes.get(c, "float32")) for c in values)
    return Hoisted(prologue, main, slow, nbytes, len(values), main_args, main_used)


def _fold_constants(
    program: Program,
    view: EGraphView,
    nodes: dict[str, Node],
    order: list[str],
    concat_parts: dict[str, list[str]],
    original: frozenset[str],
) -> dict[str, Any]:
    """Evaluate, once, data-movement nodes whose operands are all closed-over constants: those the
    rest of the program reads (a stack of 32 weights is one concatenate of its 32 parts, not its
    31 prefixes). Eagerly even when decode runs inside a jit trace (optimize builds a signature
    while jax.jit traces its fast path): staged, the folded values would be tracers (found by
    fuzzing). Constants that are themselves tracers (closed over from an outer trace) are not
    folded: they exist only in that trace."""
    foldable: set[str] = set()
    for c in order:
        n = nodes[c]
        if n.op == "const":  # not a tracer: arrays an outer jit closed over are evaluated in its trace
            k = n.attrs[0]
            ok = program.const_is_arg[k] and not compat.is_tracer(program.consts[k])
        else:
            parts = _operands(nodes, concat_parts, c)
            ok = (n.op in FOLDABLE or relayout(n, view)) and c not in original and bool(parts)
            ok = ok and all(p in foldable for p in parts)
        if ok:
            foldable.add(c)
    values: dict[str, Any] = {}
    ctx = _Ctx(program, view, [], original)

    def value(c: str) -> Any:
        got = values.get(c)
        if got is None:
            n = nodes[c]
            if n.op == "const":
                got = program.consts[n.attrs[0]]
            elif n.op == "concat":
                got = np.asarray(lax.concatenate([value(p) for p in concat_parts[c]], n.attrs[0]))
            else:
                got = np.asarray(DECODERS[n.op](ctx, n, [value(ch) for ch in n.children]))
            values[c] = got
        return got

    read = _unrelayout(nodes, view, concat_parts, foldable, view.outputs)
    with jax.ensure_compile_time_eval():
        return {c: value(c) for c in read if nodes[c].op != "const"}


def _unrelayout(
    nodes: dict[str, Node],
    view: EGraphView,
    concat_parts: dict[str, list[str]],
    done: set[str],
    outputs: list[str],
) -> list[str]:
    """The classes of `done` (folded or hoisted; pruned in place) that the rest of the program
    reads. A relayout read there leaves `done`: as a value of its own it would be a copy of its
    operand (a reshaped weight, kept beside the weight), while inside the program it is a bitcast."""
    while True:
        read = [c for c in _live(nodes, concat_parts, done, outputs) if c in done]
        moved = {c for c in read if relayout(nodes[c], view)}
        if not moved:
            return read
        done -= moved


def _operands(nodes: dict[str, Node], concat_parts: dict[str, list[str]], c: str) -> list[str]:
    """What computing class `c` reads: a concat chain's parts, else the node's children."""
    return concat_parts[c] if nodes[c].op == "concat" else list(nodes[c].children)


def _live(
    nodes: dict[str, Node], concat_parts: dict[str, list[str]], stops: set[str] | dict, outputs: list[str]
) -> set[str]:
    """Classes the outputs read, through concat chains' parts (not their inner links), not
    looking inside `stops` (values given)."""
    live: set[str] = set()
    stack = list(outputs)
    while stack:
        c = stack.pop()
        if c in live:
            continue
        live.add(c)
        if c not in stops:
            stack.extend(_operands(nodes, concat_parts, c))
    return live


def check_decoded(fn: Callable, specs: list, closed: Any) -> None:
    """Trace the decoded program abstractly: a failure, or outputs whose shapes, dtypes or weak
    types differ from the traced program's, is a decode-stage error (optimize checks this before
    any call)."""
    try:
        outs = jax.eval_shape(fn, *specs)
    except Exception as e:  # noqa: BLE001 - reported with its stage
        raise RewriteStageError("decode", e) from e
    got = [(tuple(o.shape), o.dtype, bool(getattr(o, "weak_type", False))) for o in outs]
    want = [(tuple(v.aval.shape), v.aval.dtype, bool(v.aval.weak_type)) for v in closed.jaxpr.outvars]
    if got != want:
        raise RewriteStageError("decode", TypeError(f"decoded outputs {got} differ from the traced {want}"))

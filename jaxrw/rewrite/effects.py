"""Programs that call `jax.debug.print` or `jax.debug.callback`: the calls are taken out, the
values they read become extra outputs of the program that is rewritten, and the rewritten
program's function makes the same calls with those values after computing them, in the
program's order.

Only debug calls, at the program's top level or in nested jits (inlined, as the encoder inlines
them). The calls read values and return none, so making them after the computation changes
nothing jax promises: unordered ones have no order; ordered ones (`ordered=True`) keep theirs
among themselves, as they are made in program order and jax threads its token through them
across calls. Any other effect (IO callbacks, a debug call inside a scan's body or a checkpoint
region) keeps the program as written, as before (`encode` refuses it).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from .. import compat

__all__ = ["Callbacks", "encoded_positions", "split_callbacks"]

# the primitives of jax.debug.callback and jax.debug.print (jax 0.11 and 0.12)
CALLBACK_PRIMITIVES = frozenset({"debug_callback", "debug_print"})


def _debug_only(effects: Any) -> bool:
    """Whether every effect is a jax.debug call's (`ordered=True` or not)."""
    return all(type(e).__name__ in ("DebugEffect", "OrderedDebugEffect") for e in effects)


@dataclass(frozen=True)
class Callbacks:
    """The debug calls taken out of a program: each equation with where its operands come from,
    ("out", k): the rewritten program's output `n_out + k`, or ("lit", value): a literal."""

    eqns: tuple[Any, ...]
    sources: tuple[tuple[tuple[str, Any], ...], ...]
    n_out: int  # the program's own outputs; the callbacks' values follow them

    def wrap(self, fn: Callable[..., list]) -> Callable[..., list]:
        """`fn` (the rewritten program, with the callbacks' values as extra outputs) making the
        calls, in the program's order, and returning the program's own outputs."""

        def with_callbacks(*args: Any) -> list:
            outs = list(fn(*args))
            extra = outs[self.n_out :]
            for eqn, sources in zip(self.eqns, self.sources, strict=True):
                vals = [extra[v] if kind == "out" else v for kind, v in sources]
                compat.bind_equation(eqn.primitive, eqn.params, vals)
            return outs[: self.n_out]

        return with_callbacks

    def applied(self, result: Any, pure: Any) -> Any:
        """`result` (a RewriteResult of `pure`, the program without the calls) as the program's
        own: its function makes the calls and returns the program's outputs alone, and its
        `reference` is the program as written without them (verify=True compares with that:
        jax.jit's run would make the calls a second time)."""
        if result.fn is not None:
            result.fn = self.wrap(result.fn)
        result.report.n_outputs = self.n_out
        result.report.n_equations += len(self.eqns)
        result.reference = lambda *xs: _evaluate(pure.jaxpr, pure.consts, list(xs))[: self.n_out]
        return result


def _evaluate(jaxpr: Any, consts: list, args: list) -> list:
    """`jaxpr` bound equation by equation, with the nested jits and closed calls that make debug
    calls evaluated in place (their equations bound at this level), every other one bound whole."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(v: Any) -> Any:
        return v.val if compat.is_literal(v) else env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.effects and eqn.primitive.name in compat.ENCODER_INLINED:
            body = compat.call_body(eqn)
            outs = _evaluate(body.jaxpr, body.consts, ins)
        else:
            outs = compat.bind_equation(eqn.primitive, eqn.params, ins)
        env.update((v, x) for v, x in zip(eqn.outvars, outs, strict=True) if not compat.is_dropvar(v))
    return [read(v) for v in jaxpr.outvars]


def _calls_inlined(closed: Any) -> Any:
    """`closed` with the nested jits and closed calls that make debug calls inlined (traced
    again), so those calls are at its top level: the encoder inlines such calls anyway. A
    checkpoint region is no such call: it stays a region (and keeps its effect: a fallback)."""
    if not any(e.effects and e.primitive.name in compat.ENCODER_INLINED for e in closed.jaxpr.eqns):
        return closed
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.in_avals]
    return jax.make_jaxpr(lambda *xs: _evaluate(closed.jaxpr, closed.consts, list(xs)))(*specs)


def split_callbacks(closed: Any) -> tuple[Any, Callbacks] | None:
    """(`closed` without its debug calls and with their operands as extra outputs, the calls),
    or None where it has another effect or one that is not a debug call at the top level or in
    a nested jit."""
    if not closed.effects or not _debug_only(closed.effects):
        return None
    closed = _calls_inlined(closed)
    jaxpr = closed.jaxpr
    kept, calls = [], []
    for eqn in jaxpr.eqns:
        if not eqn.effects:
            kept.append(eqn)
        elif eqn.primitive.name in CALLBACK_PRIMITIVES and not eqn.outvars and _debug_only(eqn.effects):
            calls.append(eqn)
        else:  # a call or loop whose body has the effect: not taken apart here
            return None
    extra: list[Any] = []
    where: dict[Any, int] = {}
    sources = []
    for eqn in calls:
        got = []
        for v in eqn.invars:
            if compat.is_literal(v):
                got.append(("lit", v.val))
                continue
            if v not in where:
                where[v] = len(extra)
                extra.append(v)
            got.append(("out", where[v]))
        sources.append(tuple(got))
    pure = compat.jaxpr_with(jaxpr, kept, [*jaxpr.outvars, *extra])
    calls_out = Callbacks(tuple(calls), tuple(sources), len(jaxpr.outvars))
    return compat.ClosedJaxpr(pure, closed.consts), calls_out


def encoded_positions(original: list, encoded: list) -> list[int] | None:
    """Where each equation of the program encoded without its debug calls (`encoded`, calls
    inlined as the encoder inlines them) sits among the original's (`original`, likewise): the
    same sequence less the calls, so explain numbers equations as the user's program has them.
    None where the sequences differ otherwise."""
    if len(original) == len(encoded) and all(map(operator.is_, original, encoded)):
        return list(range(len(original)))
    kept = [i for i, e in enumerate(original) if e.primitive.name not in CALLBACK_PRIMITIVES]
    same = [original[i].primitive.name for i in kept] == [e.primitive.name for e in encoded]
    return kept if same else None

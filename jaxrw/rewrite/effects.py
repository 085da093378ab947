"""Programs that call `jax.debug.print` or `jax.debug.callback`: the calls are taken out, the
values they read become extra outputs of the program that is rewritten, and the rewritten
program's function makes the same calls with those values after computing them, in the
program's order.

Only debug calls, at the program's top level or in nested jits (inlined, as the encoder inlines
them). The calls read values and return none, so making them after the computation changes
nothing jax promises: unordered ones have no order; ordered ones (`ordered=True`) keep theirs
among themselves, as they are made in program order and jax threads its token through them
across calls.

A scan, while or cond whose body makes debug calls stays in the program that is rewritten, as
an opaque equation (a term of its own: never merged with an identical one), and one of its
outputs becomes a hidden output of that program too, so extraction never drops it however its
results are used (`run.py` checks that the chosen program binds it exactly once). Its body is
rewritten as any program (control.py, through rewrite_jaxpr): its own calls are taken out and
made again at the end of the rewritten body. Ordered calls: at most one such equation with
ordered ones per program, and no ordered call taken out before it (those are made after it).
A scan, while or cond with no output (a cond that only prints: `lax.cond(step % 100 == 0, lambda:
jax.debug.print(...), lambda: None)`) is taken out whole, as a call is: its
operands become extra outputs and it is bound again after the program, unrewritten, as jax.jit
runs it. Any other effect (IO callbacks, a debug call in a checkpoint region or a custom_jvp
function) keeps the program as written, as before (`encode` refuses it; in a loop's body, the
body is kept as written).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from .. import compat
from .control import LOOP_PRIMITIVES

__all__ = ["Callbacks", "bound_once", "encoded_positions", "loops_only", "split_callbacks", "taken_out"]

# the primitives of jax.debug.callback and jax.debug.print (jax 0.11 and 0.12)
CALLBACK_PRIMITIVES = frozenset({"debug_callback", "debug_print"})


def _debug_only(effects: Any) -> bool:
    """Whether every effect is a jax.debug call's (`ordered=True` or not)."""
    return all(type(e).__name__ in ("DebugEffect", "OrderedDebugEffect") for e in effects)


def _ordered(effects: Any) -> bool:
    return any(type(e).__name__ == "OrderedDebugEffect" for e in effects)


def taken_out(eqn: Any) -> bool:
    """Whether `split_callbacks` takes `eqn` out of the program whole, to bind it again after the
    rewritten program: a debug call, or a scan, while or cond that makes debug calls and has no
    output (nothing in the program could keep it). A traced program has no dropped outputs (an
    unused one is a plain variable, and such a loop is kept by a hidden output instead), but a
    dropped one is taken as none."""
    if not eqn.effects or not _debug_only(eqn.effects):
        return False
    if eqn.primitive.name in CALLBACK_PRIMITIVES:
        return not eqn.outvars
    return eqn.primitive.name in LOOP_PRIMITIVES and all(map(compat.is_dropvar, eqn.outvars))


def loops_only(closed: Any) -> bool:
    """Whether every effect of `closed` is a debug call's made in the body of a scan, while or
    cond at its top level, each of which has an output among the program's (so extraction keeps
    it), at most one of them with ordered calls: the form `split_callbacks` leaves, which the
    encoder accepts."""
    if not _debug_only(closed.effects):
        return False
    outs = {v for v in closed.jaxpr.outvars if not compat.is_literal(v)}
    ordered = 0
    for eqn in closed.jaxpr.eqns:
        if not eqn.effects:
            continue
        if eqn.primitive.name not in LOOP_PRIMITIVES or not _debug_only(eqn.effects):
            return False
        if not outs.intersection(eqn.outvars):
            return False
        ordered += _ordered(eqn.effects)
    return ordered <= 1


def bound_once(program: Any, nodes: list[Any]) -> bool:
    """Whether the chosen program (`nodes`: the e-nodes its classes chose) binds each of
    `program`'s equations that have effects exactly once: an opaque node of it is chosen, and
    all of them read the same operands (decode binds an equation once per operand values)."""
    reads: dict[int, set] = {i: set() for i, e in enumerate(program.eqns) if e.effects}
    for n in nodes:
        if n.op == "opaque" and n.attrs[0] in reads:
            reads[n.attrs[0]].add(n.children)
    return all(len(r) == 1 for r in reads.values())


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

    def value_outputs(self) -> frozenset[int]:
        """The outputs of the program without the calls that are the calls' values."""
        n = len({v for sources in self.sources for kind, v in sources if kind == "out"})
        return frozenset(range(self.n_out, self.n_out + n))

    def applied(self, result: Any, pure: Any) -> Any:
        """`result` (a RewriteResult of `pure`, the program without the calls) as the program's
        own: its function makes the calls and returns the program's outputs alone, and its
        `reference` is the program as written without them (verify=True compares with that:
        jax.jit's run would make the calls a second time)."""
        if result.fn is not None:
            result.fn = self.wrap(result.fn)
        result.report.n_outputs = self.n_out
        result.report.n_equations += len(self.eqns)
        stripped = _without_calls(pure.jaxpr)  # the calls in loop bodies too: made once, by fn
        result.reference = lambda *xs: _evaluate(stripped, pure.consts, list(xs))[: self.n_out]
        return result


def _without_calls(jaxpr: Any) -> Any:
    """`jaxpr` without its debug calls, at any depth (the bodies of loops, conds, calls,
    checkpoint regions and custom_jvp/vjp primal functions): the same values, no effects."""
    eqns = []
    for eqn in jaxpr.eqns:
        if not eqn.effects:
            eqns.append(eqn)
        elif eqn.primitive.name not in CALLBACK_PRIMITIVES:
            params = {k: _param_without_calls(v) for k, v in eqn.params.items()}
            eqns.append(eqn.replace(params=params, effects=frozenset()))
    return jaxpr.replace(eqns=eqns, effects=frozenset())


def _param_without_calls(p: Any) -> Any:
    if isinstance(p, compat.ClosedJaxpr):
        return compat.ClosedJaxpr(_without_calls(p.jaxpr), p.consts)
    if isinstance(p, compat.Jaxpr):
        return _without_calls(p)
    if isinstance(p, tuple) and any(isinstance(x, compat.ClosedJaxpr | compat.Jaxpr) for x in p):
        return tuple(map(_param_without_calls, p))  # cond's branches
    return p


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
    """(`closed` without its top-level debug calls, with their operands and then one output of
    each loop or cond whose body makes calls as extra outputs, the calls and the loops taken out
    whole), or None where it has another effect, a call elsewhere (a checkpoint region), or
    ordered calls whose order this would change (see the module's docstring)."""
    if not closed.effects or not _debug_only(closed.effects):
        return None
    closed = _calls_inlined(closed)
    jaxpr = closed.jaxpr
    kept, calls, anchors = [], [], []
    first_ordered_call = ordered_loop = None
    for i, eqn in enumerate(jaxpr.eqns):
        if not eqn.effects:
            kept.append(eqn)
        elif taken_out(eqn):  # a call, or a loop or cond that only makes calls
            calls.append(eqn)
            if _ordered(eqn.effects) and first_ordered_call is None:
                first_ordered_call = i
        elif eqn.primitive.name in LOOP_PRIMITIVES and _debug_only(eqn.effects):
            outs = [v for v in eqn.outvars if not compat.is_dropvar(v)]
            if _ordered(eqn.effects):
                if ordered_loop is not None or first_ordered_call is not None:
                    return None  # two (decode may swap them), or one after an ordered call
                ordered_loop = i
            kept.append(eqn)
            anchors.append(outs[0])
        else:  # a call whose body has the effect (a checkpoint region): not taken apart here
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
    # the loops' hidden outputs follow the calls' values (Callbacks.wrap returns neither)
    pure = compat.jaxpr_with(jaxpr, kept, [*jaxpr.outvars, *extra, *anchors])
    calls_out = Callbacks(tuple(calls), tuple(sources), len(jaxpr.outvars))
    return compat.ClosedJaxpr(pure, closed.consts), calls_out


def encoded_positions(original: list, encoded: list) -> list[int] | None:
    """Where each equation of the program encoded without its debug calls (`encoded`, calls
    inlined as the encoder inlines them) sits among the original's (`original`, likewise): the
    same sequence less the calls, so explain numbers equations as the user's program has them.
    None where the sequences differ otherwise."""
    if len(original) == len(encoded) and all(map(operator.is_, original, encoded)):
        return list(range(len(original)))
    kept = [i for i, e in enumerate(original) if not taken_out(e)]
    same = [original[i].primitive.name for i in kept] == [e.primitive.name for e in encoded]
    return kept if same else None

"""Optimizing inside control flow: the bodies of scan, while_loop (fori_loop) and cond/switch,
checkpoint regions, and the primal functions of custom_jvp/custom_vjp.

Each body is a jaxpr of its own: it is rewritten by the same pipeline (same rules, cost model and
guard), recursively. Loop bodies treat their constant operands (`num_consts` of a scan,
`body_nconsts` of a while) as slow inputs, so work that depends only on them (products or
concatenations of loop-invariant weights) is hoisted out of the loop: it runs once before the
loop and enters it as extra constants.

A checkpoint (remat) region is rewritten as a region of its own, so it stays one. A custom_jvp/
custom_vjp function's primal body is rewritten like a branch; its differentiation rules
(the user's jvp, or fwd/bwd) are kept as they are: they describe the same function, so they stay
consistent with the rewritten primal, and jax.grad still uses them, not a derivative of the rewrite.

The encoder calls `body_hook(eqn)` for every equation it keeps opaque; a non-None answer is a
function `vals -> outputs` the decoder uses instead of re-binding the original equation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from .. import compat

__all__ = ["make_body_hook", "LOOP_PRIMITIVES"]

LOOP_PRIMITIVES = frozenset({"scan", "while", "cond"})
CUSTOM_RULE_PRIMITIVES = frozenset({"custom_jvp_call", "custom_vjp_call"})

# rewrite(closed_body, slow_input_indices, output_indices_in_cone) -> RewriteResult (or raises);
# an output in the cone reaches a saturating op outside the body (nonfinite.py)
Rewriter = Callable[[Any, frozenset[int], frozenset[int]], Any]


def _where(eqn: Any, part: str = "") -> str:
    """A body's name in reports and explain: its equation, the part, the user's line."""
    source = compat.source_line(eqn)
    return f"{eqn.primitive.name}{' ' + part if part else ''}" + (f" @ {source}" if source else "")


def _specs(closed: Any) -> list[Any]:
    return [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
        for v in closed.jaxpr.invars
    ]


def _retrace(fn: Callable, specs: list[Any]) -> Any | None:
    """A closed jaxpr of `fn` for a body, or None when it closes over arrays (bodies can't)."""
    closed = jax.make_jaxpr(lambda *xs: list(fn(*xs)))(*specs)
    return None if closed.consts else closed


def _loop_body(eqn: Any, rewrite: Rewriter, body_key: str, first: int, bodies: list) -> Any:
    """A replacement for a scan/while equation whose body was rewritten, or None."""
    p = eqn.params
    body = p[body_key]
    is_scan = eqn.primitive.name == "scan"
    nc = compat.scan_num_consts(p) if is_scan else p["body_nconsts"]
    # every output may reach a saturating op: a carry feeds the next step, which may apply one
    res = rewrite(body, frozenset(range(nc)), frozenset(range(len(body.jaxpr.outvars))))
    bodies.append((_where(eqn, "body"), res))
    if res.fn is None:
        return None
    hoisted = getattr(res.fn, "hoisted", None)
    specs = _specs(body)
    if hoisted is None:
        new_body = _retrace(res.fn, specs)
        if new_body is None:
            return None
        params = {**p, body_key: new_body}
        return lambda vals: compat.bind_equation(eqn.primitive, params, vals)
    k = hoisted.n_values

    def run(vals: list[Any]) -> list[Any]:
        pre, consts, rest = vals[:first], vals[first : first + nc], vals[first + nc :]
        extra = hoisted.prologue(*[consts[i] for i in hoisted.slow])
        extra_specs = [
            jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=compat.get_aval(x).weak_type) for x in extra
        ]

        def body_fn(*xs: Any) -> list[Any]:  # (consts, extra, carry/xs) -> main(consts, carry/xs, extra)
            return hoisted.main(*xs[:nc], *xs[nc + k :], *xs[nc : nc + k])

        new_body = _retrace(body_fn, specs[:nc] + extra_specs + specs[nc:])
        if new_body is None:  # pragma: no cover - main never closes over arrays
            return compat.bind_equation(eqn.primitive, p, vals)
        if is_scan:
            params = compat.scan_with_extra_consts(p, new_body, k)
        else:
            params = {**p, body_key: new_body, "body_nconsts": nc + k}
        return compat.bind_equation(eqn.primitive, params, [*pre, *consts, *extra, *rest])

    return run


def _rewritten(body: Any, rewrite: Rewriter, bodies: list, where: str, out_cone: frozenset[int]) -> Any:
    """A body (closed jaxpr, no slow inputs) rewritten and retraced, or None where it is kept."""
    res = rewrite(body, frozenset(), out_cone)
    bodies.append((where, res))
    return None if res.fn is None else _retrace(res.fn, _specs(body))


def _cond(eqn: Any, rewrite: Rewriter, bodies: list, out_cone: frozenset[int]) -> Any:
    branches = list(eqn.params["branches"])
    changed = False
    for i, br in enumerate(branches):
        new = _rewritten(br, rewrite, bodies, _where(eqn, f"branch {i}"), out_cone)
        if new is not None:
            branches[i] = new
            changed = True
    if not changed:
        return None
    params = {**eqn.params, "branches": tuple(branches)}
    return lambda vals: compat.bind_equation(eqn.primitive, params, vals)


def _has_products(jaxpr: Any) -> bool:
    """Whether a jaxpr (or one nested in it) holds a dot_general: what the rules mostly act on."""
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            return True
        if any(map(_has_products, jax.extend.core.jaxprs_in_params(e.params))):  # ClosedJaxprs opened
            return True
    return False


def _region(eqn: Any, rewrite: Rewriter, bodies: list, key: str, out_cone: frozenset[int]) -> Any:
    """A replacement for an equation whose one body (`params[key]`) was rewritten, or None: the
    primal of a custom_jvp_call/custom_vjp_call, or a checkpoint (remat) region. Bodies without
    products (relu, softmax, gelu and the like: dozens per model) are left as they are: each
    rewrite costs a fresh e-graph, and the elementwise rules gain little there."""
    body = eqn.params[key]
    closed_given = isinstance(body, jax.extend.core.ClosedJaxpr)
    closed = body if closed_given else jax.extend.core.ClosedJaxpr(body, [])
    new = _rewritten(closed, rewrite, bodies, _where(eqn), out_cone) if _has_products(closed.jaxpr) else None
    if new is None:
        return None
    params = {**eqn.params, key: new if closed_given else new.jaxpr}
    return lambda vals: compat.bind_equation(eqn.primitive, params, vals)


def make_body_hook(rewrite: Rewriter, bodies: list) -> Callable[[Any], Any]:
    """The encoder's hook: rewrite the bodies of control-flow equations with `rewrite`, adding
    (where, RewriteResult) to `bodies` for each. `out_cone`: the equation's outputs that reach a
    saturating op in the program around it."""

    def hook(eqn: Any, out_cone: frozenset[int] = frozenset()) -> Any:
        name = eqn.primitive.name
        if name == "scan":
            # scan operands: consts, carry, xs; the consts are loop-invariant
            return _loop_body(eqn, rewrite, "jaxpr", 0, bodies)
        if name == "while":
            # while operands: cond consts, body consts, carry; only the body is rewritten
            return _loop_body(eqn, rewrite, "body_jaxpr", eqn.params["cond_nconsts"], bodies)
        if name == "cond":
            return _cond(eqn, rewrite, bodies, out_cone)
        if name in CUSTOM_RULE_PRIMITIVES and not eqn.params.get("symbolic_zeros"):
            return _region(eqn, rewrite, bodies, "call_jaxpr", out_cone)
        if name in compat.REMAT_CALLS:
            return _region(eqn, rewrite, bodies, "jaxpr", out_cone)
        return None

    return hook

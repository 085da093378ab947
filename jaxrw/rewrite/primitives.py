"""Which jax primitives the encoder models, and as what: typed elementwise constructors, named
unary and binary ops, ops kept with their parameters (`COVERED`), and elementwise calls
(custom_jvp/vjp regions priced and bound as one fused op). Everything else stays opaque."""

from __future__ import annotations

from typing import Any

from .. import compat
from .terms import Tensor

__all__ = ["ELEMENTWISE_TYPED", "UNARY", "BINARY", "ELEMENTWISE_CALL", "COVERED", "elementwise_call"]

# Elementwise primitives with a typed or named constructor (decoded through jax.lax).
ELEMENTWISE_TYPED = {
    "add": Tensor.add,
    "add_any": Tensor.add,
    "sub": Tensor.sub,
    "mul": Tensor.mul,
    "div": Tensor.div,
}
UNARY = frozenset(
    {
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sin",
        "cos",
        "tan",
        "sqrt",
        "rsqrt",
        "cbrt",
        "abs",
        "sign",
        "floor",
        "ceil",
        "erf",
        "erf_inv",
        "is_finite",
        "not",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "square",
    }
)
BINARY = frozenset(
    {"max", "min", "pow", "atan2", "rem", "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "nextafter"}
)
# The `Tensor.op` name of a custom_jvp/custom_vjp call whose body is elementwise (jax.nn.relu):
# bound as traced, its differentiation rule kept, and priced as the fused elementwise op XLA makes
# of it (the call is inlined when lowered), not as a kernel of its own.
ELEMENTWISE_CALL = "elementwise_call"
CUSTOM_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call"})
# Primitives an elementwise call's body may hold (operands of its shape or scalars).
BODY_ELEMENTWISE = (
    UNARY | BINARY | frozenset(ELEMENTWISE_TYPED) | {"neg", "integer_pow", "select_n", "convert_element_type"}
)
# Covered primitives kept with their parameters (bound exactly as traced).
COVERED = frozenset(
    {
        "reshape",
        "broadcast_in_dim",
        "squeeze",
        "expand_dims",
        "pad",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "convert_element_type",
        "select_n",
        "iota",
        "integer_pow",
        "slice",
        "concatenate",
        "transpose",
        "reduce_sum",
        "dot_general",
        "copy",
        "copy_p",
        "stop_gradient",
        "clamp",
        "argmax",
        "argmin",
        "cumsum",
        "dynamic_slice",
        "dynamic_update_slice",
        "rev",
        "reduce_precision",
        "square",
        "neg",
    }
    | UNARY
    | BINARY
)


def elementwise_call(eqn: Any) -> bool:
    """Whether a custom_jvp/custom_vjp call computes its one output elementwise from operands of
    that shape (or scalars): its body holds only elementwise primitives and inlined calls of them."""
    out = eqn.outvars[0].aval
    if any(getattr(v.aval, "shape", None) not in (out.shape, ()) for v in eqn.invars):
        return False
    body = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    if body is None:
        return False
    return _elementwise_body(getattr(body, "jaxpr", body), out.shape)


def _elementwise_body(jaxpr: Any, shape: tuple[int, ...]) -> bool:
    for e in jaxpr.eqns:
        if e.primitive.name in compat.ENCODER_INLINED:
            if not _elementwise_body(compat.call_body(e).jaxpr, shape):
                return False
        elif e.primitive.name not in BODY_ELEMENTWISE or e.effects:
            return False
        if any(getattr(v.aval, "shape", None) not in (shape, ()) for v in [*e.invars, *e.outvars]):
            return False
    return True

"""Places in a program the encoder records for seeds (rules/__init__.py: Rule.seed): unbatched
dots that `batch.stack_dots` may stack, and outer products (dots that contract no axis, or
multiplies of broadcasts), which `outer.product` writes as facts for the outer rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from .. import compat
from .egg_source import Sym

__all__ = ["DotSite", "OuterSite", "outer_form", "broadcast_outer"]


@dataclass(frozen=True)
class DotSite:
    """An unbatched dot of the program as written, of operands of rank 1 or 2 and one dtype:
    what `batch.stack_dots` groups (equal shapes, form and level) into one batched dot."""

    term: Sym  # the dot's let name
    a: Sym
    b: Sym
    sa: tuple[int, ...]
    sb: tuple[int, ...]
    lc: int
    rc: int
    cfg: int
    level: int
    dtype: str


@dataclass(frozen=True)
class OuterSite:
    """An outer product past `nb` leading batch axes: each output element is one product
    a[.., i] b[.., j]. A dot_general that contracts no axis (per-example gradients under
    jax.vmap), or, `written`, a multiply of a and b broadcast against each other (jnp.outer,
    x[:, :, None] * y[:, None, :]). `widen`: the operands are converted to `dtype` first (a
    dot's wider preferred_element_type)."""

    term: Sym
    a: Sym
    b: Sym
    sa: tuple[int, ...]
    sb: tuple[int, ...]
    nb: int
    dtype: str
    widen: bool = False
    written: bool = False


# preferred_element_type wider than the operands where a product of two operands is exact in it
# (8- and 11-bit significands make at most 22 bits; float32 has 24, float64 53)
_EXACT_WIDER = {("bfloat16", "float32"), ("float16", "float32"), ("bfloat16", "float64"),
                ("float16", "float64"), ("float32", "float64")}  # fmt: skip


def outer_form(eqn: Any) -> tuple[tuple[int, ...], tuple[int, ...], int, str, bool] | None:
    """(sa, sb, nb, dtype, widen) of an OuterSite where `eqn` is a dot_general that contracts no
    axis of two vectors past the same nb <= 2 leading batch axes, and computes each product as
    an elementwise multiply does: one precision (None), real or integer operands of one dtype,
    and a result type that is theirs or one in which their product is exact."""
    p = eqn.params
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    nb = len(lb)
    if lc or rc or tuple(lb) != tuple(range(nb)) or tuple(rb) != tuple(range(nb)) or nb > 2:
        return None
    if {len(v.aval.shape) for v in eqn.invars} != {nb + 1}:  # vectors past the batch (the rules' form)
        return None
    if any(p.get(k) is not None for k in ("precision", "out_sharding")):
        return None
    a, b = (v.aval for v in eqn.invars)
    in_dt = str(a.dtype)
    real = jnp.issubdtype(a.dtype, jnp.floating) or jnp.issubdtype(a.dtype, jnp.integer)
    if in_dt != str(b.dtype) or not real:
        return None
    pet = p.get("preferred_element_type")
    out_dt = in_dt if pet is None else str(np.dtype(pet))
    if out_dt != in_dt and (in_dt, out_dt) not in _EXACT_WIDER:
        return None
    return tuple(a.shape), tuple(b.shape), nb, out_dt, out_dt != in_dt


def broadcast_outer(eqn: Any, broadcasts: dict[Any, Any]) -> tuple[Any, Any, int] | None:
    """(p, q, nb) where `eqn` multiplies p and q (jaxpr variables of one dtype, [.., n] and
    [.., m]) broadcast against each other past nb <= 2 leading batch axes: p along the output's
    axis nb, q along nb + 1, each to the output's size or 1 on the other's axis. `broadcasts`:
    the broadcast_in_dim equations seen so far, by output variable."""
    out = eqn.outvars[0].aval
    nb = len(out.shape) - 2
    found = [broadcasts.get(v) for v in eqn.invars if not compat.is_literal(v)]
    if not 0 <= nb <= 2 or len(found) != 2 or None in found:
        return None
    lead = tuple(range(nb))
    for bp, bq in (found, found[::-1]):
        p, q = bp.invars[0], bq.invars[0]
        dp, dq = (tuple(int(i) for i in b.params["broadcast_dimensions"]) for b in (bp, bq))
        own = (tuple(p.aval.shape), tuple(q.aval.shape)) == (
            (*out.shape[:nb], out.shape[nb]),
            (*out.shape[:nb], out.shape[nb + 1]),
        )
        one_type = str(p.aval.dtype) == str(q.aval.dtype) == str(out.dtype)
        if dp == (*lead, nb) and dq == (*lead, nb + 1) and own and one_type:
            return p, q, nb
    return None

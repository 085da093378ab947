"""Platform-dependent conds (`lax.platform_dependent`): what the branch jax runs here computes,
where it can be read. jax 0.12 traces jnp.diagonal of a square matrix to one (a gather by
default, Σ_0 I∘x for Mosaic), which the e-graph keeps opaque; the encoder records what these
functions find (encode.py `platform_cond`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import compat

__all__ = ["running_branch", "gathered_diagonal", "constant_value", "CONSTANT_ELEMENTS"]

_GPU_PLATFORMS = ("cuda", "rocm", "gpu")


def running_branch(eqn: Any) -> Any:
    """The branch of a platform-dependent cond that jax runs on the default backend: the one
    naming the platform, else the default one (None in `branches_platforms`); None if unclear."""
    backend = jax.default_backend()
    names = _GPU_PLATFORMS if backend in _GPU_PLATFORMS else (backend,)
    named = [i for i, p in enumerate(eqn.params["branches_platforms"]) if p and set(p) & set(names)]
    default = [i for i, p in enumerate(eqn.params["branches_platforms"]) if p is None]
    chosen = named or default
    return eqn.params["branches"][chosen[0]] if len(chosen) == 1 else None


def gathered_diagonal(branch: Any) -> int | None:
    """k where `branch`'s first output is x[i, i] of its square operand k (a gather of the
    diagonal, jnp.diagonal's default form), else None."""
    jaxpr = branch.jaxpr
    out = jaxpr.outvars[0] if jaxpr.outvars else None
    eqn = next((e for e in jaxpr.eqns if out in e.outvars), None)
    if eqn is None or eqn.primitive.name != "gather" or eqn.invars[0] not in jaxpr.invars:
        return None
    shape_x = tuple(eqn.invars[0].aval.shape)
    dims = eqn.params["dimension_numbers"]
    square = len(shape_x) == 2 and shape_x[0] == shape_x[1] and tuple(out.aval.shape) == shape_x[:1]
    plain = (
        tuple(dims.offset_dims) == ()
        and tuple(dims.collapsed_slice_dims) == (0, 1)
        and tuple(dims.start_index_map) == (0, 1)
        and not tuple(getattr(dims, "operand_batching_dims", ()))
        and tuple(eqn.params["slice_sizes"]) == (1, 1)
    )
    if not (square and plain):
        return None
    indices = constant_value(jaxpr, list(branch.consts), eqn.invars[1])
    n = shape_x[0]
    if indices is None or indices.shape != (n, 2) or not (indices == np.arange(n)[:, None]).all():
        return None
    return jaxpr.invars.index(eqn.invars[0])


CONSTANT_ELEMENTS = 1 << 16  # the largest value `constant_value` evaluates (and a program keeps)


def _elements(v: Any) -> int:
    return int(np.prod(getattr(v.aval, "shape", ())))


def constant_value(jaxpr: Any, consts: list, var: Any) -> np.ndarray | None:
    """The value of `var` where it depends on no input of `jaxpr` (iotas, literals, constants)
    and no value on the way holds more than CONSTANT_ELEMENTS, evaluated now; else None."""
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}
    env = dict(zip(jaxpr.constvars, consts, strict=True))

    def value(v: Any) -> Any:
        if compat.is_literal(v):
            return v.val
        if v not in env:
            e = producers.get(v)
            small = e is not None and all(_elements(o) <= CONSTANT_ELEMENTS for o in e.outvars)
            if not small or e.effects or e.params.get("branches") is not None:
                raise LookupError(v)  # an input, a large value, or nothing to evaluate here
            res = e.primitive.bind(*[value(x) for x in e.invars], **e.params)
            env.update(zip(e.outvars, res if e.primitive.multiple_results else [res], strict=True))
        return env[v]

    try:
        with jax.ensure_compile_time_eval():
            return np.asarray(value(var))
    except LookupError:
        return None

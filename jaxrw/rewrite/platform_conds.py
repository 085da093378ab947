"""Platform-dependent conds (`lax.platform_dependent`): what the branch jax runs here computes,
where it can be read. jax 0.12 traces jnp.diagonal of a square matrix to one (a gather by
default, Σ_0 I∘x for Mosaic), which the e-graph keeps opaque; the encoder records what these
functions find (encode.py `platform_cond`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import compat

__all__ = ["running_branch", "gathered_diagonal", "diagonal_gather", "constant_value", "CONSTANT_ELEMENTS"]

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
    """k where `branch`'s first output is x[.., i, i] of its square operand k (a gather of the
    diagonal, jnp.diagonal's default form), else None."""
    jaxpr = branch.jaxpr
    out = jaxpr.outvars[0] if jaxpr.outvars else None
    eqn = next((e for e in jaxpr.eqns if out in e.outvars), None)
    if eqn is None or eqn.invars[0] not in jaxpr.invars:
        return None
    if not diagonal_gather(jaxpr, list(branch.consts), eqn):
        return None
    return jaxpr.invars.index(eqn.invars[0])


def diagonal_gather(jaxpr: Any, consts: list | None, eqn: Any) -> bool:
    """Whether `eqn`, an equation of `jaxpr`, gathers x[.., i, i]: the diagonal of its operand's
    last two axes (min of the two long), past any leading batch axes it takes whole (jax.vmap of
    jnp.diagonal, jnp.diagonal(x, axis1=-2, axis2=-1)); its indices, input-independent, are
    evaluated to check. `consts` are the values of jaxpr's constvars (None: not known here)."""
    if eqn.primitive.name != "gather":
        return False
    shape_x, shape_out = tuple(eqn.invars[0].aval.shape), tuple(eqn.outvars[0].aval.shape)
    nb = len(shape_x) - 2
    if nb < 0 or shape_out != (*shape_x[:nb], min(shape_x[nb:])):
        return False
    dims = eqn.params["dimension_numbers"]
    plain = (
        tuple(dims.offset_dims) == tuple(range(nb))
        and tuple(dims.collapsed_slice_dims) == (nb, nb + 1)
        and tuple(dims.start_index_map) == (nb, nb + 1)
        and not tuple(getattr(dims, "operand_batching_dims", ()))
        and tuple(eqn.params["slice_sizes"]) == (*shape_x[:nb], 1, 1)
    )
    if not plain:
        return False
    indices = constant_value(jaxpr, consts, eqn.invars[1])
    n = min(shape_x[nb:])
    return indices is not None and indices.shape == (n, 2) and bool((indices == np.arange(n)[:, None]).all())


CONSTANT_ELEMENTS = 1 << 16  # the largest value `constant_value` evaluates (and a program keeps)


def _elements(v: Any) -> int:
    return int(np.prod(getattr(v.aval, "shape", ())))


_NUMPY_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "and": np.logical_and,
    "or": np.logical_or,
}


def _in_numpy(eqn: Any, args: list) -> np.ndarray | None:
    """The one output of an index computation's equation (iota, comparisons, select_n, broadcasts,
    concatenation), computed in NumPy; None for other primitives, or where NumPy's value differs
    in shape or dtype from the equation's (jax then evaluates it). jax evaluates each new primitive
    and shape through a compiled program: jnp.diagonal's indices took 0.5 s of a first build."""
    name, p, out = eqn.primitive.name, eqn.params, eqn.outvars[0].aval
    xs = [np.asarray(a) for a in args]
    if name == "iota":
        shape, dim = p["shape"], p["dimension"]
        along = np.arange(shape[dim], dtype=out.dtype).reshape(
            [-1 if i == dim else 1 for i in range(len(shape))]
        )
        res = np.broadcast_to(along, shape)
    elif name in _NUMPY_BINARY and len(xs) == 2:
        res = _NUMPY_BINARY[name](*xs)
    elif name == "select_n" and xs[0].dtype == np.bool_ and len(xs) == 3:
        res = np.where(xs[0], xs[2], xs[1])
    elif name == "broadcast_in_dim":
        dims = p["broadcast_dimensions"]
        placed = xs[0].reshape(
            [xs[0].shape[dims.index(i)] if i in dims else 1 for i in range(len(p["shape"]))]
        )
        res = np.broadcast_to(placed, p["shape"])
    elif name == "concatenate":
        res = np.concatenate(xs, axis=p["dimension"])
    elif name in ("reshape", "squeeze"):
        res = xs[0].reshape(out.shape)
    elif name == "convert_element_type" and np.can_cast(xs[0].dtype, out.dtype, "safe"):
        res = xs[0].astype(out.dtype)
    else:
        return None
    res = np.asarray(res)
    return res if res.shape == tuple(out.shape) and res.dtype == out.dtype else None


def constant_value(jaxpr: Any, consts: list | None, var: Any) -> np.ndarray | None:
    """The value of `var` where it depends on no input of `jaxpr` (iotas, literals, constants)
    and no value on the way holds more than CONSTANT_ELEMENTS, evaluated now; else None (also
    where it reads a constvar and `consts` is None)."""
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}
    env = {} if consts is None else dict(zip(jaxpr.constvars, consts, strict=True))

    def value(v: Any) -> Any:
        if compat.is_literal(v):
            return v.val
        if v not in env:
            e = producers.get(v)
            small = e is not None and all(_elements(o) <= CONSTANT_ELEMENTS for o in e.outvars)
            if not small or e.effects or e.params.get("branches") is not None:
                raise LookupError(v)  # an input, a large value, or nothing to evaluate here
            args = [value(x) for x in e.invars]
            res = _in_numpy(e, args)
            if res is None:
                res = e.primitive.bind(*args, **e.params)
            env.update(zip(e.outvars, res if e.primitive.multiple_results else [res], strict=True))
        return env[v]

    try:
        with jax.ensure_compile_time_eval():
            return np.asarray(value(var))
    except LookupError:
        return None

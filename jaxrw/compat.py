"""Differences between the JAX versions jaxrw supports (0.11 and 0.12), each shim in one place."""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from typing import Any, NamedTuple

import jax
from jax import core as _core

try:  # jax >= 0.4.30 exposes the jaxpr types here; 0.11 and 0.12 both do.
    from jax.extend import core as jex_core
except ImportError:  # pragma: no cover - older jax is not supported, kept for a clear error
    jex_core = None

Literal = jex_core.Literal
Var = jex_core.Var
DropVar = jex_core.DropVar
ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# Call primitives whose body can be inlined. jax 0.11 names the jit call `pjit`; jax 0.12 names it
# `jit`. `closed_call`/`core_call` and remat (`checkpoint`, named `remat2` in older builds) are the
# same in both. The encoder inlines all but remat (`ENCODER_INLINED`): a checkpoint region is kept
# as a region, its body rewritten on its own (rewrite/control.py), so that jax.grad of the
# optimized program still rematerializes it instead of saving its activations.
REMAT_CALLS = frozenset({"checkpoint", "remat", "remat2"})
INLINED_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"}) | REMAT_CALLS
ENCODER_INLINED = INLINED_CALLS - REMAT_CALLS


def call_body(eqn: Any) -> ClosedJaxpr:
    """The body of an inlinable call equation as a ClosedJaxpr (param name differs by primitive)."""
    body = eqn.params.get("jaxpr", None)
    if body is None:
        body = eqn.params.get("call_jaxpr")
    if isinstance(body, ClosedJaxpr):
        return body
    return ClosedJaxpr(body, ())


def bind_equation(prim: Any, params: dict, args: list) -> list:
    """Bind `prim` like jax.core.eval_jaxpr does, always returning a list of outputs.
    jax 0.11 and 0.12: get_bind_params returns the params alone (older jax also returned
    "subfuns" to pass before the operands; both shapes are accepted)."""
    got = prim.get_bind_params(params)
    subfuns, bind_params = got if isinstance(got, tuple) else ((), got)
    out = prim.bind(*subfuns, *args, **bind_params)
    return list(out) if prim.multiple_results else [out]


def jaxpr_with(jaxpr: Any, eqns: list, outvars: list) -> Any:
    """`jaxpr` with other equations and outputs, and the effects of those equations alone (the
    caller took the debug calls out; loops that make some may stay); its debug info names each
    added output, as jax's checks ask one path per output."""
    info = jaxpr.debug_info
    paths = getattr(info, "result_paths", None)
    if isinstance(paths, tuple) and len(paths) == len(jaxpr.outvars) <= len(outvars):
        info = info._replace(result_paths=(*paths, *["debug callback value"] * (len(outvars) - len(paths))))
    effects = frozenset().union(*(e.effects for e in eqns))
    return jaxpr.replace(eqns=eqns, outvars=outvars, effects=effects, debug_info=info)


def is_literal(x: Any) -> bool:
    return isinstance(x, Literal)


def is_dropvar(x: Any) -> bool:
    return isinstance(x, DropVar)


def is_tracer(x: Any) -> bool:
    return isinstance(x, _core.Tracer)


try:  # jax's current trace (private; jax 0.11 and 0.12): EvalTrace at the top level
    from jax._src.core import EvalTrace as _EvalTrace
    from jax._src.core import trace_ctx as _trace_ctx
except ImportError:  # pragma: no cover - another jax: stage a scalar and look at it
    _EvalTrace = _trace_ctx = None


def under_trace() -> bool:
    """Whether jax is tracing here (an outer jit, grad, vmap, scan body), even when no argument
    is a tracer (arrays captured from outside): whatever jax computes now is a tracer, so nothing
    computed now may be cached, timed or compared as a concrete value."""
    if _trace_ctx is not None:
        return not isinstance(_trace_ctx.trace, _EvalTrace)
    return is_tracer(jax.numpy.zeros(()))


def traced(values: Any) -> bool:
    """Whether any of `values` is a tracer or jax is tracing here (`under_trace`). The map of the
    builtin isinstance runs without a Python frame per value: 2.9 µs for 64 leaves on this
    project's CPU against 5.1 µs through is_tracer."""
    return any(map(isinstance, values, itertools.repeat(_core.Tracer))) or under_trace()


def device_kind() -> str:
    """'cuda', 'rocm', 'tpu' or 'cpu' for the default backend."""
    platform = jax.default_backend()
    return {"gpu": "cuda"}.get(platform, platform)


def thunky_module() -> Any | None:
    """`jax.experimental.thunky` (jax >= 0.12), or None where this JAX has none."""
    try:
        from jax.experimental import thunky  # type: ignore[attr-defined]
    except ImportError:
        return None
    return thunky


def same_treedef(a: Any, b: Any) -> bool:
    """Whether two pytree structures are one, as jax.jit's cache tells them apart: by hash and
    `==`. In jax 0.12 `==` of two registered dataclasses' treedefs ignores their classes when
    their fields match (`Tanh(w)` and `Relu(w)`); the hash does not (a review's repro: the second
    class was served the first's program)."""
    return a == b and hash(a) == hash(b)


def dataclass_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data and meta field names of a class registered with jax.tree_util.register_dataclass,
    which jax flattens as `getattr` of each, in order (children and aux data); None for any other
    class, or where this JAX keeps them otherwise. Read from the flatten function jax 0.11 and
    0.12 keep in their registry (the C++ registry does not say)."""
    try:
        from jax._src import tree_util

        flatten = tree_util._registry[cls].to_iter
        if flatten.__qualname__ != "_register_dataclass.<locals>.flatten_func":
            return None
        cells = dict(zip(flatten.__code__.co_freevars, flatten.__closure__ or (), strict=True))
        data, meta = cells["data_fields"].cell_contents, cells["meta_fields"].cell_contents
    except (AttributeError, ImportError, KeyError, TypeError, ValueError):
        return None
    names_ok = all(type(x) is tuple and all(type(n) is str for n in x) for x in (data, meta))
    return (data, meta) if names_ok else None


def get_aval(x: Any) -> Any:
    """The abstract value of an array, tracer or scalar. jax 0.12 removed jax.core.get_aval;
    jax.typeof exists in 0.11 and 0.12."""
    typeof = getattr(jax, "typeof", None)
    if typeof is not None:
        return typeof(x)
    return _core.get_aval(x)  # pragma: no cover - jax < 0.6


def single_device_sharding(device: Any) -> Any:
    """The sharding of an array on `device` alone: jax >= 0.12.1 deprecates constructing
    SingleDeviceSharding and makes it with make_single_device_sharding."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)


def hidden_constant_bytes(lowered: Any) -> int:
    """Bytes of the closed-over arrays that this JAX passes to a lowered jit as hidden arguments.
    jax >= 0.12.1 does (`jax_use_simplified_jaxpr_constants`), so XLA's memory_analysis() counts
    them among the arguments; earlier versions embed them in the program and count none."""
    lowering = getattr(lowered, "_lowering", None)
    consts = list(getattr(lowering, "const_args", ()) or ())
    kept = getattr(lowering, "compile_args", {}).get("kept_var_idx")
    return sum(int(getattr(c, "nbytes", 0)) for i, c in enumerate(consts) if kept is None or i in kept)


def with_weak_type(x: Any, weak: bool) -> Any:
    """`x` (an array or tracer) marked weakly typed or not, its dtype unchanged. jax has no public
    way to make a value weak; lax's private converter (in 0.11 and 0.12) takes the flag."""
    if bool(getattr(get_aval(x), "weak_type", False)) == weak:
        return x
    from jax._src.lax import lax as _lax

    return _lax._convert_element_type(x, jax.numpy.result_type(x), weak_type=weak)


def scan_num_consts(params: dict) -> int:
    """Loop-invariant operands of a scan. jax 0.11/0.12 describe the operands with a flat tree
    `ft_in` = (consts, carry, xs); older jax had `num_consts`."""
    if "num_consts" in params:
        return int(params["num_consts"])
    consts, _carry, _xs = params["ft_in"].unpack()
    return len(consts)


def scan_num_carry(params: dict) -> int:
    """Carried operands of a scan (after its `scan_num_consts` constants; the rest are scanned)."""
    if "num_carry" in params:
        return int(params["num_carry"])
    return len(params["ft_in"].unpack()[1])


def scan_with_extra_consts(params: dict, body: Any, k: int) -> dict:
    """Scan parameters for the same loop with `k` more leading constants and a new body."""
    if "num_consts" in params:
        out = {**params, "jaxpr": body, "num_consts": params["num_consts"] + k}
        if "linear" in params:
            out["linear"] = (False,) * k + tuple(params["linear"])
        return out
    from jax._src import flattree as ft  # jax 0.11/0.12 (private module; no public equivalent)

    consts, carry, xs = params["ft_in"].unpack()
    return {**params, "jaxpr": body, "ft_in": ft.pack((ft.nones(len(consts) + k), carry, xs))}


def source_line(eqn: Any) -> str:
    """`file:line (function)` of the user code that made `eqn` (jax 0.11/0.12:
    jax.extend.source_info_util.summarize)."""
    try:
        from jax.extend.source_info_util import summarize

        text = summarize(eqn.source_info)
    except Exception:  # noqa: BLE001 - source info is best effort
        return ""
    if not text or text.startswith("unknown"):
        return ""
    loc, _, fn = text.partition(" ")
    path, _, rest = loc.partition(":")
    line = rest.split(":")[0]
    return f"{os.path.basename(path)}:{line} {fn}".strip()


def traced_as(flat: Any, fn: Any, args: tuple, kwargs: dict, statics: tuple, n_leaves: int) -> Any:
    """`flat` (a function of a call's flat dynamic leaves) traced as jax.jit traces `fn` on that
    call: jax's errors and the jaxpr's argument names then name the user's function and its
    parameters (`mask`, `params['w']`), not jaxrw's wrapper and `leaves[1]`. jax reads a wrapper's
    debug info from `__fun_debug_info__` (api_util.save_wrapped_fun_debug_info, jax 0.11 and
    0.12); where the names do not map one to a leaf, `flat` is left as it is."""
    try:  # names only: never a reason to fail (another jax may spell these otherwise)
        from jax._src import api_util

        static_argnums, static_argnames = statics
        info = api_util.debug_info(
            "jit", fn, args, kwargs, static_argnums=static_argnums, static_argnames=static_argnames
        )
        names = info.arg_names
        if names is not None and len(names) == n_leaves:
            api_util.save_wrapped_fun_debug_info(flat, info)
    except Exception:  # noqa: BLE001
        pass
    return flat


def fun_name(fn: Any) -> str:
    """jax.jit's name for `fn`: its `__name__`, a partial's function's, else "<unnamed function>"."""
    name = getattr(fn, "__name__", None)
    while name is None and isinstance(fn, functools.partial):
        fn = fn.func
        name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else "<unnamed function>"  # an object's __getattr__ may lie


def weakly_referable(fn: Any) -> Any:
    """`fn`, or where it cannot be weakly referenced (`operator.itemgetter(0)`, `attrgetter`,
    `methodcaller`) a Python function that calls it: jax.jit keys its caches on a weak reference
    to the function, and a second jax.jit of such an object crashes the interpreter (jax 0.12.1;
    jaxrw jits a function again for explain, grad and bench). Its `__wrapped__` is `fn`."""
    try:
        weakref.ref(fn)
        return fn
    except TypeError:
        pass

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return named_as(call, fn, signature=True)


def wraps_as(obj: Any, fn: Any) -> None:
    """`obj` (an optimized function) named as `fn` (jax.jit's names for a partial or a callable
    object where it has none), with `fn`'s attributes where they are not `obj`'s own: copied over
    them, a callable object's `fn` or `schedule` (or an optimized function's state) replaced its."""
    functools.update_wrapper(obj, fn, updated=())
    for name, value in getattr(fn, "__dict__", {}).items():
        if name not in obj.__dict__ and not hasattr(type(obj), name):
            setattr(obj, name, value)
    if "__name__" not in obj.__dict__:
        obj.__name__ = fun_name(fn)
    if "__qualname__" not in obj.__dict__:
        obj.__qualname__ = obj.__name__


def named_as(wrapper: Any, fn: Any, suffix: str = "", signature: bool = False) -> Any:
    """`wrapper` (a function of jaxrw's that jax.jit compiles) named as the user's `fn` (plus
    `suffix`), so XLA's program names, compile logs and profiles read `jit(f)`, not jaxrw's
    `jit(inline)`; with `signature`, also its `__wrapped__`, through which jax reads `fn`'s
    parameters (argument names in errors, static and donated names). Returns `wrapper`."""
    name = fun_name(fn) + suffix
    try:  # names only: never a reason to fail (an object may refuse new attributes)
        wrapper.__name__ = wrapper.__qualname__ = name
        if signature:
            wrapper.__wrapped__ = fn
    except (AttributeError, TypeError):
        pass
    return wrapper


class Source(NamedTuple):
    """Where an equation was written: its traceback and its name stack (jax.named_scope), with the
    scope of the nested jits it was inlined from before it."""

    traceback: Any
    name_stack: Any


def source_of(eqn: Any, scope: Any = None) -> Source:
    """`eqn`'s Source, its name stack under `scope` (an inlining jit's, or None)."""
    info = eqn.source_info
    return Source(info.traceback, info.name_stack if scope is None else scope + info.name_stack)


def written_at(source: Source | None) -> Any:
    """A context that binds as jax's own eval_jaxpr binds an equation: under its traceback and its
    name stack after the current one; where `source` is None (a term only a rewrite made), under
    a scope named "jaxrw", so profiles and HLO dumps show which operations jaxrw wrote."""
    if source is None:
        return jax.named_scope("jaxrw")
    from jax._src import source_info_util

    name_stack = source_info_util.current_name_stack() + source.name_stack
    return source_info_util.user_context(source.traceback, name_stack=name_stack)


def infer_argnums_and_argnames(sig: Any, argnums: Any, argnames: Any) -> tuple[tuple, tuple]:
    """jax.jit's completion of static or donated arguments: the names of the given indices, or the
    indices of the given names, through the signature `sig` (jax 0.11 and 0.12 alike)."""
    from jax._src import api_util

    return api_util.infer_argnums_and_argnames(sig, argnums, argnames)

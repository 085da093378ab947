"""Argument signatures: the keys optimize() caches compiled programs under (one per structure,
shapes, dtypes and static values), the abstract values it traces with, and what it keeps per
signature (`Entry`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from . import compat, error_scale
from .errors import InvalidArgumentError, InvalidOptionError

if TYPE_CHECKING:
    from .hoist import HotPath
    from .rewrite.run import RewriteReport

__all__ = ["Entry", "as_written", "leaf_key", "leaf_owners", "spec", "static_key"]


def leaf_key(x: Any) -> tuple:
    """(shape, dtype, weak type[, explicit sharding]) of an array leaf or Python scalar, the same
    for its tracer inside jit (optimize's fast path looks signatures up by their tracers); a clear
    error for anything else (non-arrays must be marked static)."""
    aval = getattr(x, "aval", None)  # fast path: jax arrays and tracers carry their abstract value
    if aval is not None and hasattr(aval, "weak_type"):
        sharding = explicit_sharding(aval)
        key = (aval.shape, aval.dtype, aval.weak_type)
        return key if sharding is None else (*key, sharding)
    if isinstance(x, jax.Array | np.ndarray | np.generic) or compat.is_tracer(x):
        try:
            aval = compat.get_aval(x)
        except TypeError as e:  # e.g. NumPy string or object arrays
            raise InvalidArgumentError(
                f"argument leaf of dtype {getattr(x, 'dtype', '?')} is not a JAX array type; valid: arrays "
                "of numeric or bool dtypes (mark other values static with static_argnums/static_argnames)"
            ) from e
        key = (tuple(aval.shape), aval.dtype, bool(getattr(aval, "weak_type", False)))
        sharding = explicit_sharding(aval)
        return key if sharding is None else (*key, sharding)
    if isinstance(x, bool | int | float | complex):  # the key its tracer has under jit (weak type)
        return _scalar_key(x)
    raise InvalidArgumentError(
        f"argument leaf {x!r} of type {type(x).__name__} is not an array; valid: jax/numpy arrays and Python "
        "scalars (mark other values static with static_argnums/static_argnames)"
    )


def leaf_keys(leaves: list, call: tuple, static_argnums: tuple[int, ...]) -> tuple:
    """The keys of a call's flat leaves; for a leaf that is no array, an error that names where it
    is in `call` (the dynamic (args, kwargs)), as jax.jit's does: "argument 2 ['opt']['name']"."""
    try:
        return tuple(map(leaf_key, leaves))
    except InvalidArgumentError as e:
        for path, x in jax.tree_util.tree_flatten_with_path(call)[0]:
            try:
                leaf_key(x)
            except InvalidArgumentError:
                first, rest = path[1], jax.tree_util.keystr(path[2:])
                if path[0].idx == 0:  # positional: its index in the user's call, statics counted
                    pos = [i for i in range(len(call[0]) + len(static_argnums)) if i not in static_argnums]
                    where = f"argument {pos[first.idx]}"
                else:
                    where = f"keyword argument {first.key!r}"
                raise InvalidArgumentError(f"{where}{rest and ' at ' + rest}: {e}") from None
        raise


_scalar_keys: dict[tuple[type, bool], tuple] = {}  # (Python type, x64 on) -> its key


def _scalar_key(x: bool | int | float | complex) -> tuple:
    """A Python scalar's key: jax.typeof costs ~1.5 µs a call, so one per type and x64 setting
    (ints past int32 each as jax decides; jax.jit's own error comes later for those too large)."""
    if type(x) is int and not -(2**31) <= x < 2**31:
        try:
            aval = compat.get_aval(x)
        except (OverflowError, TypeError):
            return ("py", "int")
        return (aval.shape, aval.dtype, aval.weak_type)
    cached = (type(x), jax.config.jax_enable_x64)
    key = _scalar_keys.get(cached)
    if key is None:
        aval = compat.get_aval(x)
        key = _scalar_keys[cached] = (aval.shape, aval.dtype, aval.weak_type)
    return key


def explicit_sharding(aval: Any) -> Any:
    """The sharding of an array on a mesh with Explicit axes (jax.make_mesh's default in jax 0.12),
    which is part of its type: shard_map checks it against in_specs, so it is traced and keyed
    with it. None on other meshes (Auto: XLA places the values), as it is for unsharded arrays."""
    sharding = getattr(aval, "sharding", None)
    return sharding if sharding is not None and getattr(sharding.mesh, "explicit_axes", ()) else None


def split_inner_axis(leaves: list) -> str:
    """Where a call's arrays are split over several devices along an axis other than their first
    (a tensor-parallel layout: column-split weights), said in words; "" where none is (replicated,
    one device, or split along the batch axis alone). Read from concrete arrays and
    ShapeDtypeStructs, and from tracers on meshes with Explicit axes (elsewhere a tracer's
    placement is XLA's to choose)."""
    for i, x in enumerate(leaves):
        if compat.is_tracer(x):
            placed = explicit_sharding(compat.get_aval(x))
            if placed is None:
                continue
            sizes = dict(zip(placed.mesh.axis_names, placed.mesh.axis_sizes, strict=True))
            ways = {
                a: math.prod(sizes[m] for m in ((part,) if isinstance(part, str) else part))
                for a, part in enumerate(placed.spec)
                if part is not None
            }
        elif isinstance(x, jax.Array | jax.ShapeDtypeStruct) and _split_placement(x):  # over several devices
            shard = x.sharding.shard_shape(x.shape)
            ways = {
                a: whole // part for a, (part, whole) in enumerate(zip(shard, x.shape, strict=True)) if part
            }
        else:
            continue
        inner = {a: n for a, n in ways.items() if a > 0 and n > 1}  # a mesh axis of size 1 splits nothing
        if inner:
            a = max(inner)
            return (
                f"argument leaf {i} {compat.get_aval(x).str_short()} is split {inner[a]} ways along axis {a}"
            )
    return ""


def _split_placement(x: Any) -> bool:
    """An array, or a ShapeDtypeStruct given a sharding, placed over several devices in parts."""
    sharding = getattr(x, "sharding", None)
    return sharding is not None and hasattr(sharding, "shard_shape") and not sharding.is_fully_replicated


def spec(x: Any) -> Any:
    """The ShapeDtypeStruct a leaf is traced as (with its sharding where that is part of its type)."""
    aval = compat.get_aval(x)
    weak = getattr(aval, "weak_type", False)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=weak, sharding=explicit_sharding(aval))


def wider_than_config(leaves: list) -> str:
    """The 64-bit dtypes among arrays made under x64 and passed with it off: '' if none. jax.jit
    traces such an array as it is (a float64 result), while `spec` would narrow it to float32, so
    such a call runs jax.jit's program. PRNG keys (extended dtypes) are never such."""
    wide = {
        str(x.dtype)
        for x in leaves
        if isinstance(x, jax.Array)
        and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)
        and jax.dtypes.canonicalize_dtype(x.dtype) != x.dtype
    }
    return ", ".join(sorted(wide))


def _is_shape(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def abstract(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a jax.ShapeDtypeStruct (a shape, not an array)."""
    return any(map(_is_shape, jax.tree_util.tree_leaves((args, kwargs), is_leaf=_is_shape)))


def with_shapes_traced(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """`fn(*args, **kwargs)` under jax.eval_shape, each ShapeDtypeStruct in them a tracer of
    its shape and every other value as given (static values stay hashable)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_shape)
    where = [i for i, x in enumerate(leaves) if _is_shape(x)]

    def run(*shaped: Any) -> Any:
        filled = list(leaves)
        for i, x in zip(where, shaped, strict=True):
            filled[i] = x
        a, kw = jax.tree_util.tree_unflatten(tree, filled)
        return fn(*a, **kw)

    return jax.eval_shape(run, *(leaves[i] for i in where))


def trace_config() -> tuple:
    """The settings that change what a function traces to, as jax.jit keys its cache on them:
    64-bit types (jnp.arange is int64 under x64), the default matmul precision, and type and rank
    promotion (under "strict" or "raise" jax.jit raises where the default promotes), and the mesh
    `jax.set_mesh` gives (a sharding constraint traced under one mesh fails under another)."""
    c = jax.config
    return (
        ("x64", c.jax_enable_x64),
        ("precision", c.jax_default_matmul_precision),
        ("promotion", c.jax_numpy_dtype_promotion, c.jax_numpy_rank_promotion),
        ("mesh", jax.sharding.get_abstract_mesh()),
    )


def split_config(statics: tuple) -> tuple[tuple, tuple]:
    """A key's statics as (the static arguments', trace_config's items): split_statics puts the
    latter last."""
    at = len(statics) - len(trace_config())
    return statics[:at], statics[at:]


def as_bound(statics: tuple) -> tuple:
    """A key's statics as a bound function compares them (at its trace): without trace_config's
    matmul precision and promotion rules, under which its values keep their types and shapes (a
    compiled executable runs under any), with x64 and the mesh (types and placement change)."""
    arguments, config = split_config(statics)
    return arguments + tuple(c for c in config if c[0] not in ("precision", "promotion"))


def static_key(v: Any, what: str) -> Any:
    """A static argument as a cache key: it must be hashable, and is keyed with its type, as
    jax.jit keys it (1, 1.0 and True are equal in Python but trace differently)."""
    try:
        hash(v)
    except TypeError as e:
        raise InvalidOptionError(
            f"static {what} must be hashable; got {type(v).__name__} {v!r} (valid: hashable values such as "
            "int, str, tuple)"
        ) from e
    return (type(v), v)


def leaf_owners(in_tree: Any, kwargs: dict, static_argnums: Any, static_argnames: Any) -> list[int | str]:
    """For each flat leaf of a call's dynamic (args, kwargs), the positional index in the user's
    call or the keyword it came from (static arguments are not flattened, so indices skip them)."""
    args_tree, kwargs_tree = in_tree.children()
    static = sorted(static_argnums)
    owners: list[int | str] = []
    for pos, sub in enumerate(args_tree.children()):
        orig = pos
        for st in static:
            if st <= orig:
                orig += 1
        owners += [orig] * sub.num_leaves
    names = sorted(k for k in kwargs if k not in static_argnames)
    for name, sub in zip(names, kwargs_tree.children(), strict=True):
        owners += [name] * sub.num_leaves
    return owners


@dataclass
class Entry:
    """What optimize() keeps per signature: the program that runs it and how it was chosen."""

    call: Callable[..., Any]
    out_tree: Any
    report: RewriteReport
    fallback: str | None = None  # the cause, when jax.jit runs instead
    trace: Any = None  # (closed jaxpr, RewriteResult, profile), kept only for explain
    proven: bool = False  # the rewritten program compiled and ran once
    fn: Callable[..., Any] | None = None  # the program as a plain function (inlined by the fast path)
    schedule: str = "xla"  # what runs it: "xla", or a schedule auto/streams chose (thunky.select)
    hot: HotPath | None = None  # a hoisted signature's quickest call, made at its first cached call
    reference: Callable[..., list] | None = None  # verify's, where jax.jit's makes jax.debug calls
    scales: Any = None  # verify's error scales of the outputs (error_scale), False where none

    @property
    def handed_off(self) -> bool:
        """Hoisted, but its slow arrays changed on every call: jax.jit's program runs (its report
        says after how many calls)."""
        return bool(self.report.handed_off)

    def expected(self, jitted: Callable, args: tuple, kwargs: dict, leaves: list) -> Any:
        """verify=True's reference outputs: jax.jit's, or for a program that makes jax.debug calls
        those of the program as written without them (jax.jit's would make them a second time)."""
        if self.reference is None:
            return jitted(*args, **kwargs)
        return jax.tree_util.tree_unflatten(self.out_tree, self.reference(*leaves))

    def error_scales(
        self, jitted: Callable, statics: tuple, args: tuple, kwargs: dict, in_tree: Any, leaves: list
    ) -> list | None:
        """verify's scales of this signature's outputs at `leaves` (`error_scale`), or None where
        there are none: the program calls out with results, a donated input is gone, or they
        could not be had. They trace jax.jit's function (`jitted`), whose trace jax keeps: the
        user's Python does not run again."""
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves):
            return None
        try:
            if self.scales is None:
                flat = flat_function(jitted, *statics, args, kwargs, in_tree)
                self.scales = error_scale.scales_function(flat, leaves) or False
            return self.scales(*leaves) if self.scales else None
        except Exception:  # noqa: BLE001 - without scales, the plain check stands
            self.scales = False
            return None

    def fall_back(self, why: str) -> Entry:
        """This signature runs jax.jit from now on (`why`), and its report says so (once).
        Returns the entry."""
        if self.fallback is None:
            self.fallback = why
            self.report.fell_back(why)
        return self


def as_written(entry: Entry) -> bool:
    """Whether a signature runs the user's function unchanged under XLA's own schedule: kept by the
    guard, fallen back, or handed off (hoisting)."""
    original = entry.fallback is not None or entry.handed_off or not entry.report.rewritten
    return original and entry.schedule == "xla"


def flat_function(
    fn: Callable, static_argnums: tuple, static_argnames: tuple, args: tuple, kwargs: dict, in_tree: Any
) -> Callable:
    """`fn` as a function of a call's flat dynamic leaves (`in_tree`'s), the call's static values
    put back in place: what a signature traces. Only the static values are kept: the program must
    not hold the call's arrays (or tracers)."""
    static_args = {i: args[i] for i in static_argnums if i < len(args)}
    static_kw = {k: v for k, v in kwargs.items() if k in static_argnames}
    n, names = len(args), list(kwargs)

    def flat(*leaves: Any) -> Any:
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        it = iter(dyn_args)
        full = [static_args[i] if i in static_args else next(it) for i in range(n)]
        return fn(*full, **{k: static_kw[k] if k in static_kw else dyn_kwargs[k] for k in names})

    return flat


def split_statics(
    args: tuple, kwargs: dict, static_argnums: tuple, static_argnames: tuple
) -> tuple[tuple, tuple]:
    """A call's (dynamic args and kwargs, hashable static values and the config that changes a
    trace): what its signature is keyed and traced by."""
    if not (kwargs or static_argnums):
        return (args, {}), trace_config()
    static_pos = set(static_argnums)
    dyn_args = tuple(a for i, a in enumerate(args) if i not in static_pos)
    statics = []
    for i in sorted(static_pos):
        if i < len(args):
            statics.append((i, static_key(args[i], f"argument {i}")))
    dyn_kwargs = {}
    for k, v in sorted(kwargs.items()):
        if k in static_argnames:
            statics.append((k, static_key(v, f"argument {k!r}")))
        else:
            dyn_kwargs[k] = v
    return (dyn_args, dyn_kwargs), (*statics, *trace_config())


def name_programs(result: Any, fn: Callable) -> None:
    """A rewrite's functions named as the user's `fn` (its prologue as `f_prologue`): what the
    Python call path compiles (verify, schedules, hoisting) reads `jit(f)` in XLA's logs and
    profiles, as jax.jit's program does."""
    compat.named_as(result.fn, fn)
    if result.reference is not None:
        compat.named_as(result.reference, fn, "_reference")
    hoisted = getattr(result.fn, "hoisted", None)
    if hoisted is not None:
        compat.named_as(hoisted.prologue, fn, "_prologue")
        compat.named_as(hoisted.main_used, fn)
        compat.named_as(hoisted.main, fn)

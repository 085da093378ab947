"""Identity checks of a pytree of jax arrays without flattening it: the hoisted quick path
(hoist.HotPath) asks on every call whether the hoisted arguments still hold the arrays its cached
values belong to, and flattening a parameter dict costs more than the rest of that call."""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import compat

__all__ = ["SCALARS", "checker", "scalar_key", "snapshot", "stand_in"]

# Containers of this many leaves or more compare their first leaf before the rest: a check that
# fails (another parameter set's arrays, tried slot after slot) stops there, for ~0.2 µs more
# where it holds (5% of a 64-leaf check on this project's CPU)
LONG = 16
# kinds of `snapshot` nodes
_LEAF, _NONE, _DICT, _DICT_OF_LEAVES, _SEQ, _SEQ_OF_LEAVES, _SCALAR, _ATTRS, _ATTRS_OF_LEAVES = range(9)
# Python scalars: immutable, so their value (with their type, which sets the traced dtype) is as
# sound a key as an array's identity; a scale or schedule value is often a new float each call
SCALARS = (bool, int, float, complex)


def scalar_key(x: Any) -> tuple:
    """What a Python scalar is compared by: its type and value, and the signs of its zeros
    (0.0 == -0.0, but 1/x tells them apart). NaN never equals a later NaN: those calls flatten."""
    if type(x) is float:
        return (float, x, math.copysign(1.0, x))
    if type(x) is complex:
        return (complex, x, math.copysign(1.0, x.real), math.copysign(1.0, x.imag))
    return (type(x), x)


def snapshot(tree: Any) -> tuple | None:
    """What `checker` compares a later call's arguments with: the identity of every jax array in
    `tree` and the containers around them (dicts with string keys, lists, tuples, namedtuples,
    dataclasses registered with jax.tree_util.register_dataclass, None), and the value of every
    Python scalar (`scalar_key`). None for any other pytree node (a custom class may change
    inside; those calls are flattened)."""
    if isinstance(tree, jax.Array) and not compat.is_tracer(tree):
        return (_LEAF, id(tree))
    if type(tree) in SCALARS:
        return (_SCALAR, scalar_key(tree))
    if tree is None:
        return (_NONE,)
    if type(tree) is dict and all(type(k) is str for k in tree):
        kind, kids = (_DICT_OF_LEAVES, _DICT), tuple(map(snapshot, tree.values()))
        head: Any = tuple(tree)
    elif type(tree) in (list, tuple) or _plain_namedtuple(tree):
        kind, kids, head = (_SEQ_OF_LEAVES, _SEQ), tuple(map(snapshot, tree)), type(tree)
    elif (fields := _dataclass_fields(tree)) is not None:
        data, meta, values, children = fields
        kind, kids = (_ATTRS_OF_LEAVES, _ATTRS), tuple(map(snapshot, children))
        head = (type(tree), data, meta, values)
    else:
        return None
    if any(k is None for k in kids):
        return None
    if all(k[0] == _LEAF for k in kids):
        return (kind[0], head, tuple(k[1] for k in kids))
    return (kind[1], head, kids)


def _plain_namedtuple(tree: Any) -> bool:
    """A namedtuple (parameters as `Params(w=..., b=...)`) that jax flattens as its fields in
    order: its class is no pytree of its own (jax names the node `namedtuple[...]`; a class
    registered otherwise may drop fields or carry aux data, a review's repros) and keeps tuple's
    own iteration, which the checks read. Asked when the snapshot is taken: a class registered
    as a pytree after its first calls is not seen (jax asks for registration before use)."""
    cls = type(tree)
    if not (isinstance(tree, tuple) and isinstance(getattr(cls, "_fields", None), tuple)):
        return False
    if any(getattr(cls, m) is not getattr(tuple, m) for m in ("__iter__", "__len__", "__getitem__")):
        return False
    node = jax.tree_util.tree_structure(tree, is_leaf=lambda x: x is not tree)
    return str(node).startswith("PyTreeDef(CustomNode(namedtuple[")


def _dataclass_fields(tree: Any) -> tuple[tuple[str, ...], tuple[str, ...], tuple, list] | None:
    """The data and meta field names of a dataclass registered with jax (`compat.dataclass_fields`),
    its meta values and its children (the data fields' values), where jax flattens `tree` as
    those fields (asked of jax itself, one level down: the names read from its registry must give
    its children and aux data) and its meta values are hashable, as jax.jit needs to key a trace
    by them; else None. A name with a dot is refused: `attrgetter`, which the checks use, would
    read "b.w" as `t.b.w` (a review's repro)."""
    fields = compat.dataclass_fields(type(tree))
    if fields is None:
        return None
    data, meta = fields
    if any("." in n for n in data + meta):
        return None
    try:
        keyed, node = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
        values = tuple(getattr(tree, n) for n in meta)
        hash(values)
        same = node.node_data() == (type(tree), values)
    except Exception:  # a meta value jax could not key a trace by either
        return None
    kids = [(getattr(path[0], "name", None) if len(path) == 1 else None, x) for path, x in keyed]
    flat_as_fields = len(kids) == len(data) and all(
        k == n and x is getattr(tree, n) for (k, x), n in zip(kids, data, strict=True)
    )
    return (data, meta, values, [x for _, x in kids]) if same and flat_as_fields else None


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """The attributes `names` of an object, as a tuple (attrgetter gives one name's value bare)."""
    if len(names) == 1:
        name = names[0]
        return lambda t: (getattr(t, name),)
    return operator.attrgetter(*names) if names else lambda t: ()


def _attrs_checker(head: tuple, same_data: Callable[[tuple], bool]) -> Callable[[Any], bool]:
    """`checker` of a registered dataclass: the same class, data fields as `same_data` says, and
    meta values equal to the snapshot's (what jax's treedefs compare; a comparison that raises
    counts as different: that call flattens)."""
    cls, data, meta, values = head
    get_data, get_meta = _getter(data), _getter(meta)

    def same_meta(t: Any) -> bool:
        try:
            return bool(get_meta(t) == values)
        except Exception:
            return False

    if not meta:
        return lambda t: type(t) is cls and same_data(get_data(t))
    return lambda t: type(t) is cls and same_data(get_data(t)) and same_meta(t)


def checker(snap: tuple) -> Callable[[Any], bool]:
    """A function telling whether a tree holds the same objects as when `snap` was taken, so that
    flattening it would give the same leaves and structure: one closure per container, made once,
    each comparing its leaves' identities in one list (no flattening: that costs ~10 µs for a
    56-leaf parameter dict on this project's CPU, as it sorts the keys; the check of NasRNN's 16
    leaves in a dict of two lists takes ~1 µs)."""
    kind, call = snap[0], operator.call
    if kind == _LEAF:
        leaf = snap[1]
        return lambda t: id(t) == leaf
    if kind == _NONE:
        return lambda t: t is None
    if kind == _SCALAR:
        key, of = snap[1], snap[1][0]
        return lambda t: type(t) is of and scalar_key(t) == key
    if kind == _DICT_OF_LEAVES:
        keys, ids = snap[1], list(snap[2])
        if len(ids) < LONG:
            return lambda t: type(t) is dict and tuple(t) == keys and [id(x) for x in t.values()] == ids
        first = ids[0]  # another set's arrays differ here: known in 0.2 µs, not 4 µs (64 leaves)
        return lambda t: (
            type(t) is dict
            and id(next(iter(t.values()), None)) == first
            and tuple(t) == keys
            and [id(x) for x in t.values()] == ids
        )
    if kind == _SEQ_OF_LEAVES:
        kind_of, ids = snap[1], list(snap[2])
        if len(ids) < LONG:
            return lambda t: type(t) is kind_of and [id(x) for x in t] == ids
        first, n = ids[0], len(ids)
        return lambda t: (
            type(t) is kind_of and len(t) == n and id(t[0]) == first and [id(x) for x in t] == ids
        )
    if kind == _ATTRS_OF_LEAVES:
        ids = list(snap[2])
        return _attrs_checker(snap[1], lambda got: [id(x) for x in got] == ids)
    kids = tuple(map(checker, snap[2]))
    if kind == _ATTRS:
        return _attrs_checker(snap[1], lambda got: all(map(call, kids, got)))
    if kind == _DICT:
        keys = snap[1]
        return lambda t: type(t) is dict and tuple(t) == keys and all(map(call, kids, t.values()))
    kind_of, n = snap[1], len(kids)
    return lambda t: type(t) is kind_of and len(t) == n and all(map(call, kids, t))


def stand_in(leaf: Any) -> Callable[[], Any] | None:
    """What gives the quick path a leaf it passes on while `checker` holds: a weak reference to a
    jax array (alive: the checked tree holds it), or a Python scalar converted to a jax array once
    (the check compared the call's scalar by value; jax.jit would convert it on every call, ~2 µs
    on this project's CPU). None where the scalar does not convert (an int past int32)."""
    if type(leaf) not in SCALARS:
        return weakref.ref(leaf)
    try:
        with jax.ensure_compile_time_eval():  # a concrete array, even inside another jit's trace
            held = jax.numpy.asarray(leaf)
    except (OverflowError, TypeError, ValueError):
        return None
    return lambda: held

"""Reading and replacing one leaf of a parameter pytree by its key path, as the call-sequence
test's caller does (tests/test_call_sequences.py): in place, in the caller's own containers, or
by copies of them. Containers: dicts, lists, tuples, namedtuples and registered dataclasses."""

from __future__ import annotations

import dataclasses
from typing import Any


def index(container: Any, k: Any) -> Any:
    """Where path entry `k` points in `container`: a dict key, a sequence index, a namedtuple
    field's position or a dataclass field's name."""
    if hasattr(k, "name"):  # GetAttrKey: a namedtuple's or a dataclass's field
        return container._fields.index(k.name) if isinstance(container, tuple) else k.name
    return k.key if hasattr(k, "key") else k.idx


def child(container: Any, k: Any) -> Any:
    i = index(container, k)
    return getattr(container, i) if dataclasses.is_dataclass(container) else container[i]


def get(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = child(tree, k)
    return tree


def set_inplace(tree: Any, path: tuple, value: Any) -> Any:
    """The tree with the leaf at `path` replaced in its innermost mutable container (tuples are
    rebuilt up to the nearest mutable parent; a dataclass's field is set on the object, frozen
    or not, as equinox does in its constructors): the same root, or a new one where none is
    mutable (a namedtuple of arrays)."""
    *head, _ = path
    chain = [tree]
    for k in head:
        chain.append(child(chain[-1], k))
    new = value
    for container, k in zip(reversed(chain), reversed(path), strict=False):
        idx = index(container, k)
        if isinstance(container, tuple):
            items = list(container)
            items[idx] = new
            new = retuple(container, items)
            continue
        if dataclasses.is_dataclass(container):
            object.__setattr__(container, idx, new)
        else:
            container[idx] = new
        return tree
    return new


def set_copy(tree: Any, path: tuple, value: Any) -> Any:
    """The tree with the leaf at `path` replaced, every container on the way a copy."""
    if not path:
        return value
    k, *rest = path
    idx = index(tree, k)
    if dataclasses.is_dataclass(tree):
        return dataclasses.replace(tree, **{idx: set_copy(getattr(tree, idx), rest, value)})
    if isinstance(tree, dict):
        out = dict(tree)
        out[idx] = set_copy(tree[idx], rest, value)
        return out
    items = list(tree)
    items[idx] = set_copy(tree[idx], rest, value)
    return retuple(tree, items) if isinstance(tree, tuple) else items


def retuple(like: tuple, items: list) -> tuple:
    """A tuple of `like`'s type (a namedtuple's too) holding `items`."""
    return type(like)(*items) if hasattr(like, "_fields") else tuple(items)


def copy_containers(tree: Any) -> Any:
    """The tree in new containers, the same leaves."""
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: copy_containers(getattr(tree, f.name)) for f in dataclasses.fields(tree) if f.init}
        return dataclasses.replace(tree, **fields)
    if isinstance(tree, dict):
        return {k: copy_containers(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return retuple(tree, [copy_containers(v) for v in tree])
    if isinstance(tree, list):
        return [copy_containers(v) for v in tree]
    return tree

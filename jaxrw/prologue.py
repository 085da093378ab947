"""Prologue values of hoisted signatures (`optimize(hoist_argnums=...)`): the work that depends only
on the slow (hoisted) arrays, cached by the arrays' identity, and shared between the signatures
whose prologue is one program.

jax arrays are immutable, so the identity (`id`) of every slow leaf is a sound cache key as long
as the leaf is alive: only weak references and finalizers point at cached leaves, and a finalizer
drops the values when one dies, so a new array that recycles an old id is never mistaken for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.extend

from . import compat
from .signature import leaf_key

__all__ = ["PrologueValues", "shared_prologue"]


class PrologueValues:
    """One signature's prologue values for one set of slow arrays, cached by the arrays' identity.
    Signatures whose prologue is one program (`shared_prologue`: batch sizes or cache lengths that
    differ while the parameters do not) share its jit and take each other's values for the same
    arrays (`group`): one set of merged weights, computed once and kept once. Each keeps a slot
    of its own, so signatures called on different parameter sets do not evict each other."""

    def __init__(self, prologue: Callable[..., list[Any]], group: list[PrologueValues] | None = None):
        self.prologue = prologue
        self.group = [] if group is None else group  # every cache of this prologue program
        self.group.append(self)
        self.ids: tuple[int, ...] | None = None  # of the slow leaves the cached values belong to
        self.values: list[Any] | None = None
        self.finalizers: list[weakref.finalize] = []  # clear the cache when a leaf of `ids` dies
        self.runs = 0  # prologue runs
        self.fills = 0  # times values were cached: run here or taken from another signature

    def _invalidate(self) -> None:
        self.ids = None
        self.values = None

    def held_elsewhere(self, ids: tuple[int, ...]) -> list[Any] | None:
        """The values another signature of this prologue holds for the arrays `ids`, if any."""
        for other in self.group:
            if other is not self and other.values is not None and other.ids == ids:
                return other.values
        return None

    def values_for(self, slow: list[Any]) -> list[Any]:
        """The values for the concrete slow leaves `slow`: the cached ones if they belong to these
        leaves, else another signature's for them, else computed (and cached where every leaf is
        a jax array)."""
        ids = tuple(map(id, slow))
        values = self.values
        if values is None or ids != self.ids:
            values = self.held_elsewhere(ids)
            if values is None:
                values = self.prologue(*slow)
                self.runs += 1
                if not all(isinstance(x, jax.Array) for x in slow):
                    # a NumPy array passed where the signature was built on jax arrays (one key
                    # for both): it can change in place under the same id, so it is not kept
                    return values
            for f in self.finalizers:  # the old leaves' deaths must not clear these values
                f.detach()
            self.ids, self.values = ids, values
            self.fills += 1
            me = weakref.ref(self)  # a parameter array alive must not keep these values alive
            self.finalizers = [weakref.finalize(x, _invalidate, me) for x in slow]
        return values

    def clear(self) -> None:
        """Drop the values now (Optimized.clear_cache), not when the arrays die."""
        for f in self.finalizers:
            f.detach()
        self.finalizers = []
        self._invalidate()


def _invalidate(ref: weakref.ref) -> None:
    """A slow array died: its signature's values, if that cache still exists, are dropped."""
    cache = ref()
    if cache is not None:
        cache._invalidate()


def shared_prologue(registry: dict, hoisted: Any, leaves: list) -> PrologueValues:
    """A value cache for `hoisted.prologue` on these slow leaves, in the group `registry` (an
    Optimized's, per instance) keeps for the signatures whose prologue traces to the same
    program on the same kinds of leaves with the same constant arrays; a group of its own where
    that cannot be told (a constant that is a tracer, a prologue that does not trace)."""
    prologue = jax.jit(hoisted.prologue)
    try:
        slow = [leaves[i] for i in hoisted.slow]
        keys = tuple(map(leaf_key, slow))
        specs = [jax.ShapeDtypeStruct(k[0], k[1], weak_type=k[2]) for k in keys]
        closed = jax.make_jaxpr(hoisted.prologue)(*specs)  # not the jit: its constants are inside
        constants = _constants(closed)
        if any(map(compat.is_tracer, constants)):  # an outer trace's: its id outlives it
            return PrologueValues(prologue)
        key = (keys, str(closed), tuple(map(id, constants)))
    except Exception:  # noqa: BLE001 - a cache of its own: only sharing is lost
        return PrologueValues(prologue)
    jitted, group = registry.setdefault(key, (prologue, []))
    return PrologueValues(jitted, group)


def _constants(closed: Any) -> list[Any]:
    """The constant arrays of a closed jaxpr and of every closed jaxpr in its equations' params
    (a printed jaxpr names them, without their values)."""
    found, todo = list(closed.consts), [closed.jaxpr]
    while todo:
        for eqn in todo.pop().eqns:
            for v in eqn.params.values():
                for item in v if isinstance(v, tuple | list) else (v,):
                    if isinstance(item, jax.extend.core.ClosedJaxpr):
                        found += item.consts
                        todo.append(item.jaxpr)
                    elif isinstance(item, jax.extend.core.Jaxpr):
                        todo.append(item)
    return found

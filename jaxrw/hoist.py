"""The hoisted call path (`optimize(hoist_argnums=...)`): prologue values cached by the identity
of the slow arrays, and when the slow arrays change on every call, jax.jit's own program.

jax arrays are immutable, so the identity (`id`) of every slow leaf is a sound cache key as long
as the leaf is alive: only weak references and finalizers point at cached leaves, and a finalizer
drops the cache when one dies, so a new array that recycles an old id is never mistaken for it.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any

import jax

from . import compat

__all__ = ["HoistedCall", "picker"]


def picker(idx: tuple[int, ...]) -> Any:
    """A fast `lambda xs: tuple(xs[i] for i in idx)` (the hoisted hot path runs it per call)."""
    if not idx:
        return lambda xs: ()
    get = operator.itemgetter(*idx)
    return get if len(idx) > 1 else (lambda xs: (get(xs),))


class HoistedCall:
    """Runs the prologue only when the slow arrays change, then the main program.

    Policy on new slow arrays: the prologue runs the first time the signature is called and
    whenever the same new arrays come twice in a row (they are being reused: evaluation, decode
    loops). Arrays that differ from the previous call's (a training loop, where parameters change
    on every step) go to jax.jit's program instead (`wants_direct`): merged weights would cost a
    concatenation per call there, so the rewritten program would be slower than jax.jit.
    Slow leaves that are tracers (jit/grad/vmap with respect to the parameters) run the prologue
    as ordinary traced computation and are never cached."""

    def __init__(self, hoisted: Any, donate: tuple[int, ...]):
        self.slow = hoisted.slow
        self.nbytes = hoisted.nbytes
        self.used = hoisted.main_args
        self.pick_slow = picker(self.slow)
        self._pick_used = picker(self.used)
        self.prologue = jax.jit(hoisted.prologue)
        donate_used = tuple(k for k, i in enumerate(self.used) if i in donate)
        self.main = jax.jit(hoisted.main_used, donate_argnums=donate_used)
        self.ids: tuple[int, ...] | None = None  # of the slow leaves the cached values belong to
        self.values: list[Any] | None = None
        self._refs: list[weakref.ref] | None = None
        self.seen: tuple[int, ...] | None = None  # slow leaf ids of the previous call
        self.prologue_runs = 0
        self.direct_runs = 0

    def _invalidate(self) -> None:
        self.ids = None
        self.values = None

    def run(self, leaves: list[Any] | tuple[Any, ...], values: list[Any]) -> Any:
        return self.main(*self._pick_used(leaves), *values)

    def wants_direct(self, ids: tuple[int, ...]) -> bool:
        """For a call whose slow arrays are not the cached ones: True when jax.jit's program
        should run (the arrays differ from the previous call's too), False when the prologue
        should (first call, or the same new arrays twice in a row)."""
        seen, self.seen = self.seen, ids
        direct = self.prologue_runs > 0 and ids != seen
        self.direct_runs += direct
        return direct

    def __call__(self, *leaves: Any) -> Any:
        slow = list(self.pick_slow(leaves))
        if any(compat.is_tracer(x) for x in slow):
            return self.run(leaves, self.prologue(*slow))
        ids = tuple(map(id, slow))
        self.seen = ids
        values = self.values
        if values is None or ids != self.ids:
            values = self.prologue(*slow)
            self.ids, self.values = ids, values
            self._refs = [weakref.ref(x) for x in slow]
            for x in slow:
                weakref.finalize(x, self._invalidate)
            self.prologue_runs += 1
        return self.run(leaves, values)

"""The hoisted call path (`optimize(hoist_argnums=...)`): prologue values cached by the identity
of the slow arrays, and when the slow arrays change on every call, jax.jit's own program.

jax arrays are immutable, so the identity (`id`) of every slow leaf is a sound cache key as long
as the leaf is alive: only weak references and finalizers point at cached leaves, and a finalizer
drops the cache when one dies, so a new array that recycles an old id is never mistaken for it.
"""

from __future__ import annotations

import functools
import operator
import weakref
from typing import Any

import jax

from . import compat
from .signature import leaf_key  # the signature key optimize uses

__all__ = ["HoistedCall", "HotPath", "NotHot", "MISS", "HANDOFF_AFTER", "picker", "bind"]


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
        self.streak = 0  # direct runs in a row (HANDOFF_AFTER of them hand the signature to jax.jit)

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
        self.streak = self.streak + 1 if direct else 0
        return direct

    @property
    def handoff_due(self) -> bool:
        """The slow arrays changed on HANDOFF_AFTER calls in a row: they are not slow here."""
        return self.streak >= HANDOFF_AFTER

    def __call__(self, *leaves: Any) -> Any:
        slow = list(self.pick_slow(leaves))
        if any(compat.is_tracer(x) for x in slow):
            return self.run(leaves, self.prologue(*slow))
        ids = tuple(map(id, slow))
        self.seen, self.streak = ids, 0
        values = self.values
        if values is None or ids != self.ids:
            values = self.prologue(*slow)
            self.ids, self.values = ids, values
            self._refs = [weakref.ref(x) for x in slow]
            for x in slow:
                weakref.finalize(x, self._invalidate)
            self.prologue_runs += 1
        return self.run(leaves, values)


class NotHot(Exception):  # noqa: N818 - a signal, caught by Optimized.__call__
    """Raised while a HotPath's jit traces arguments of another signature than its own."""


MISS = object()  # HotPath could not take the call: the full call path does

# After this many calls in a row with new slow arrays (a training loop calling the function
# outside jit), the signature runs jax.jit's program through jax's C++ dispatch (Optimized's
# fast path): any Python per call costs 20-35 us on the H200 host measured (bench/README.md)
HANDOFF_AFTER = 16


class HotPath:
    """The quickest call of a hoisted signature whose slow arrays are cached.

    Python checks only the identity of the hoisted arguments' leaves; the rest (flattening, the
    signatures of the other arguments, the output tree) is jax's C++ dispatch of one jax.jit that
    takes the prologue values as an argument. Arguments of another signature reach that jit as a
    new trace, which raises NotHot; the caller then turns the path off for good, so alternating
    signatures never pay a trace per call. One per signature (`_Entry.hot`), refreshed when the
    prologue reruns for new slow arrays."""

    def __init__(self, opt: Any, entry: Any, key: tuple):
        h = self.h = entry.call
        self.entry = entry
        self.ids: tuple[int, ...] | None = None  # of the hoisted leaves the values belong to
        self.h_ids: tuple[int, ...] | None = None  # h.ids then: replaced if the prologue reruns
        self._pos = tuple(sorted(opt.hoist_argnums))
        self._names = tuple(sorted(opt.hoist_argnames))

        def body(values: list, *args: Any, **kwargs: Any) -> Any:
            dyn, statics = opt._split(args, kwargs)
            leaves, tree = jax.tree_util.tree_flatten(dyn)
            if (tree, tuple(map(leaf_key, leaves)), statics) != key:
                raise NotHot
            return jax.tree_util.tree_unflatten(entry.out_tree, h.run(leaves, values))

        def shift(idx: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(i + 1 for i in idx)

        self.call = jax.jit(
            body,
            static_argnums=shift(opt.static_argnums),
            static_argnames=opt.static_argnames,
            donate_argnums=shift(opt.donate_argnums),
        )

    def _slow_leaves(self, args: tuple, kwargs: dict) -> list[Any]:
        slow = [args[i] for i in self._pos if i < len(args)]
        if self._names:
            slow += [kwargs.get(k) for k in self._names]
        return jax.tree_util.tree_leaves(slow)

    def refresh(self, args: tuple, kwargs: dict) -> None:
        """Now cached: the values the prologue computed for these arguments' hoisted leaves."""
        self.ids = tuple(map(id, self._slow_leaves(args, kwargs)))
        self.h_ids = self.h.ids

    def __call__(self, opt: Any, args: tuple, kwargs: dict) -> Any:
        """The result, or MISS; NotHot when the jit meets another signature."""
        slow = self._slow_leaves(args, kwargs)
        ids = tuple(map(id, slow))
        h = self.h
        if ids == self.ids and h.ids is self.h_ids and h.values is not None:
            h.seen, h.streak = ids, 0
            return self.call(h.values, *args, **kwargs)
        # new slow arrays, changing on every call: jax.jit's program (see HoistedCall)
        if slow and not compat.is_tracer(slow[0]) and h.wants_direct(ids):
            return opt._run_direct(self.entry, args, kwargs)
        return MISS


def bind(opt: Any, args: tuple, kwargs: dict) -> Any:
    """`Optimized.bind`: the function of the non-hoisted arguments with the hoisted ones fixed.

    The prologue runs here, once. Each call is then one jax.jit dispatch (jax's C++ path) of the
    main program with the prologue values and the bound arrays passed as arguments: no identity
    check per call, so it is sound by construction (the values belong to these arrays)."""
    from .errors import InvalidOptionError

    if not (opt.hoist_argnums or opt.hoist_argnames):
        raise InvalidOptionError("bind needs hoist_argnums or hoist_argnames (the arguments to fix)")
    if opt.static_argnums or opt.static_argnames:
        raise InvalidOptionError("bind does not support static_argnums/static_argnames; call the function")
    missing = [i for i in opt.hoist_argnums if i >= len(args)] + [
        k for k in opt.hoist_argnames if k not in kwargs
    ]
    if missing:
        raise InvalidOptionError(f"bind: hoisted arguments {missing!r} not given; pass every argument once")
    hoisted_pos = tuple(i for i in opt.hoist_argnums if i < len(args))
    fixed_args = {i: args[i] for i in hoisted_pos}
    fixed_kwargs = {k: kwargs[k] for k in opt.hoist_argnames}
    entry, key, leaves = opt._entry_for(args, kwargs)  # built if new
    h = entry.call

    def full(fixed: tuple, fixed_kw: dict, fast: tuple, fast_kw: dict) -> tuple[tuple, dict]:
        it = iter(fast)
        n = len(fast) + len(fixed)
        a = tuple(fixed[hoisted_pos.index(i)] if i in hoisted_pos else next(it) for i in range(n))
        return a, {**fast_kw, **fixed_kw}

    if not isinstance(h, HoistedCall) or entry.fallback is not None:  # nothing hoisted: a plain call

        def plain(*fast: Any, **fast_kw: Any) -> Any:
            a, kw = full(tuple(fixed_args.values()), fixed_kwargs, fast, fast_kw)
            return opt(*a, **kw)

        return plain
    values = h.prologue(*h.pick_slow(leaves))

    def body(values: list, fixed: tuple, fixed_kw: dict, *fast: Any, **fast_kw: Any) -> Any:
        a, kw = full(fixed, fixed_kw, fast, fast_kw)
        lv, tree = jax.tree_util.tree_flatten((a, kw))
        if (tree, tuple(map(leaf_key, lv))) != key[:2]:
            raise InvalidOptionError(
                "a bound function was called with arguments of another structure, shape or dtype "
                "than it was bound with; bind again for them"
            )
        return jax.tree_util.tree_unflatten(entry.out_tree, h.run(lv, values))

    return functools.partial(jax.jit(body), values, tuple(fixed_args.values()), fixed_kwargs)

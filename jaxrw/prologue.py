"""Prologue values of hoisted signatures (`optimize(hoist_argnums=...)`): the work that depends only
on the slow (hoisted) arrays, cached by the arrays' identity, and shared between the signatures
whose prologue is one program; and the policy of when the prologue runs (`HoistedCall`).

jax arrays are immutable, so the identity (`id`) of every slow leaf is a sound cache key as long
as the leaf is alive: only weak references and finalizers point at cached leaves, and a finalizer
drops the values when one dies, so a new array that recycles an old id is never mistaken for it.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.extend

from . import compat
from .logs import warn_user
from .rewrite.decode import MAX_SETS
from .schedule.xla_modes import tuned_jit
from .signature import leaf_key

__all__ = [
    "EVICT_AFTER",
    "HANDOFF_AFTER",
    "MAX_SETS",
    "HoistedCall",
    "KeptValues",
    "PrologueValues",
    "RECENT_SETS",
    "UnbuiltCalls",
    "picker",
    "shared_prologue",
]

log = logging.getLogger("jaxrw")


# After this many calls in a row with new slow arrays (a training loop calling the function
# outside jit), the signature runs jax.jit's program through jax's C++ dispatch (Optimized's
# fast path): any Python per call costs 20-35 us on the H200 host measured (bench/HISTORY.md)
HANDOFF_AFTER = 16
# How many recent sets that ran jax.jit's program are remembered, so that one coming back is
# known: a signature's sets (`HoistedCall.last_direct`), and calls at shapes no signature is built
# for yet (`UnbuiltCalls`: arrays that come back get a signature of their own, models of other
# shapes in turn). Arrays new on every call never come back (a training loop keeps nothing).
RECENT_SETS = 16
# A full slot is replaced only where it went unused for this many direct runs, and at most once
# per this many: more sets in rotation than slots keep as many as there are slots (each slot is
# used every round); a new group of sets takes the slots of one no longer called
EVICT_AFTER = 8


def picker(idx: tuple[int, ...]) -> Any:
    """A fast `lambda xs: tuple(xs[i] for i in idx)` (the hoisted hot path runs it per call)."""
    if not idx:
        return lambda xs: ()
    get = operator.itemgetter(*idx)
    return get if len(idx) > 1 else (lambda xs: (get(xs),))


class DirectRun(NamedTuple):
    """A parameter set jax.jit's program ran for (`HoistedCall.last_direct`): its arrays' ids, weak
    references to them (a set "comes back" only while its arrays live: a new set may take a dead
    one's ids), and the signature's direct-run counts at its last two such runs."""

    ids: tuple[int, ...]
    refs: list[weakref.ref]
    earlier: int  # -1 where it ran directly once
    last: int


class HoistedCall:
    """Runs the prologue only when the slow arrays change, then the main program.

    Policy on new slow arrays: the prologue runs the first time the signature is called and
    whenever the same new arrays come twice in a row (they are being reused: evaluation, decode
    loops). Arrays that differ from the previous call's (a training loop, where parameters change
    on every step) go to jax.jit's program instead (`wants_direct`): merged weights would cost a
    concatenation per call there, so the rewritten program would be slower than jax.jit. "The
    same" means the same objects, alive (`seen_refs`): arrays made for each call and dead after it
    (`opt(cast(params), x)`) pass their ids on to the next call's, which are new arrays again.
    Slow leaves that are tracers (jit/grad/vmap with respect to the parameters) run the prologue
    as ordinary traced computation and are never cached. The cached values live in `cache`
    (PrologueValues: this signature's slot, grouped with those of the same prologue program).

    Fixed parameter sets in turn (checkpoints, a model and its averaged weights, ensemble
    members): a set that comes back while jax.jit's program ran for it lately (one of the last
    RECENT_SETS sets it ran for, still alive), with another set's cached call between, gets values
    of its own in an extra slot (`spares`) where the values fit max_hoist_bytes that many times
    (`Hoisted.sets`, at most MAX_SETS), so every call runs hoisted. A set coming back while every
    slot is full replaces one that neither of the last two sets called used, nor any set for
    EVICT_AFTER direct runs (`PrologueValues.stamp`), at most once per EVICT_AFTER direct runs:
    more sets in rotation than slots keep four of them and never run the prologue per call (six
    sets of 64 leaves in turn: 0.97-1.19x of jax.jit's time on this project's CPU, the two left
    out paying the full call path; 1.35-1.45x when one was kept). A set called more often than
    a kept one, or whose second call in a row finds the slots full, is decided by `_slot_for`.
    Before, a second set ran jax.jit's program behind the hoisted call's Python on every call
    (1.33x of jax.jit's time for 64 small leaves on this project's CPU; 0.85x with a second
    slot), and so did a third and fourth in rotation (1.29x; bench/hoist_signatures_cpu.py)."""

    def __init__(
        self, hoisted: Any, donate: tuple[int, ...], mode: str = "xla", kept: Any = None, leaves: Any = None
    ):
        """`kept`: the instance's KeptValues, whose groups share prologue values between signatures
        (`shared_prologue`, on the call's `leaves`); None: a cache of its own."""
        self.mode = mode  # XLA's schedule for the main program's top-level calls (schedule.xla_modes)
        self.slow = hoisted.slow
        self.nbytes = hoisted.nbytes
        self.used = hoisted.main_args
        self.pick_slow = picker(self.slow)
        # the abstract values of the slow leaves it was built for (`owns`), where `leaves` is given
        self.slow_avals = None if leaves is None else avals_of(self.pick_slow(leaves))
        self._pick_used = picker(self.used)
        if kept is not None and leaves is not None:
            self.cache = shared_prologue(kept, hoisted, leaves)
        else:
            self.cache = PrologueValues(jax.jit(hoisted.prologue))
        self.prologue = self.cache.prologue
        donate_used = tuple(k for k, i in enumerate(self.used) if i in donate)
        self.main = jax.jit(hoisted.main_used, donate_argnums=donate_used)  # nestable in a trace
        self.main_top = tuned_jit(hoisted.main_used, mode, self.main, donate_argnums=donate_used)
        self.seen: tuple[int, ...] | None = None  # slow leaf ids of the previous call
        # the ids of the last new arrays asked about (`wants_direct`) and weak references to them:
        # the same ids on the next call are the same arrays only while those live (arrays that die
        # after each call give their ids to the next call's new ones)
        self.seen_refs: tuple[tuple[int, ...], list[weakref.ref]] | None = None
        self.before: tuple[int, ...] | None = None  # and of the set called before that one
        self.evicted_at = -EVICT_AFTER  # direct_runs when a set last replaced a full slot
        self.sets = hoisted.sets  # parameter sets whose values may be kept at once (1 to MAX_SETS)
        self.spares: list[PrologueValues] = []  # slots after the first, made as sets come back
        # the arrays jax.jit's program last ran for (the last RECENT_SETS, newest last)
        self.last_direct: list[DirectRun] = []
        # a set come back: the slot it goes to (0 the first, k the k-th spare, len(spares)+1 new)
        self.into: tuple[tuple[int, ...], int] | None = None
        self.direct_runs = 0
        self.streak = 0  # direct runs in a row (HANDOFF_AFTER of them hand the signature to jax.jit)

    # the cache's state, read where one signature's view of it is meant
    ids = property(lambda self: self.cache.ids)
    values = property(lambda self: self.cache.values)
    prologue_runs = property(lambda self: self.cache.runs + sum(s.runs for s in self.spares))
    slots = property(lambda self: [self.cache, *self.spares])  # the first slot, then the spares

    def spare_slot(self, ids: tuple[int, ...]) -> PrologueValues | None:
        """The slot after the first that holds values for the arrays `ids`, if any."""
        for slot in self.spares:
            if slot.values is not None and slot.ids == ids:
                return slot
        return None

    def spare_values(self, ids: tuple[int, ...]) -> list[Any] | None:
        """The values of a slot after the first where they belong to the arrays `ids`."""
        slot = self.spare_slot(ids)
        return None if slot is None else slot.values

    def run(self, leaves: list[Any] | tuple[Any, ...], values: list[Any], nested: bool = False) -> Any:
        """The main program; `nested`: inside another jit's trace (no compiler options there)."""
        return (self.main if nested else self.main_top)(*self._pick_used(leaves), *values)

    def saw(self, ids: tuple[int, ...]) -> None:
        """A call on the arrays `ids` ran on a slot's values: a run of new arrays starts again.
        `seen` and `before` are the last two sets called, each once. (The quickest call,
        HotPath.call_class, does the same inline.)"""
        if ids != self.seen:
            self.before, self.seen = self.seen, ids
            self._stamp(ids)
        self.streak = 0

    def _stamp(self, ids: tuple[int, ...]) -> None:
        """The slot holding the arrays `ids` is in use now (`_slot_for` replaces stale ones only)."""
        for slot in self.slots:
            if slot.ids == ids:
                slot.stamp = self.direct_runs

    def owns(self, slow: Any) -> bool:
        """Whether the slow leaves `slow` have the shapes and dtypes this signature was built for:
        arrays of another (a second model called with the same data) are not this policy's to
        decide; the full call path finds their own signature."""
        return self.slow_avals is None or avals_of(slow) == self.slow_avals

    def can_keep(self, ids: tuple[int, ...]) -> bool:
        """Whether values for the arrays `ids` would be kept in the first slot: held by a slot of
        this prologue already (no new bytes), or fitting the instance's bound there."""
        return self._held(ids) or self.fits(0)

    def _held(self, ids: tuple[int, ...]) -> bool:
        """Whether a slot of this prologue holds values for the arrays `ids` (this signature's
        spares, or another signature's slot): no prologue run, no new bytes."""
        return self.spare_values(ids) is not None or self.cache.held_elsewhere(ids) is not None

    def fits(self, slot: int, quiet: bool = False) -> bool:
        """Whether a set's values fit the instance's bound (`KeptValues`) in slot `slot` (0 the
        first, k the k-th spare, len(spares)+1 a new one), in place of what that slot holds.
        `quiet`: a question only (report), not a call's decision: nothing is said."""
        slots = self.slots
        return self.cache.kept.room(slots[slot] if slot < len(slots) else None, self.nbytes, quiet)

    def refused_for(self, leaves: Sequence[Any]) -> str:
        """Why a call with the argument leaves `leaves` would run jax.jit's program for want of
        room under max_hoist_bytes (their values held nowhere and not fitting beside those kept
        for other calls), else "" (report(): what the next call does, asked without running it)."""
        slow = list(self.pick_slow(leaves))
        if not slow or compat.traced(slow) or self._held(tuple(map(id, slow))) or self.fits(0, quiet=True):
            return ""
        kept = self.cache.kept
        held = kept.held(leaving=self.cache)
        return (
            f"not kept for these arguments: their {self.nbytes} bytes and the {held} bytes kept for "
            f"other calls would pass max_hoist_bytes {kept.max_bytes}; their calls run jax.jit's program"
        )

    def _came_back(self, ids: tuple[int, ...]) -> DirectRun | None:
        """The record (`last_direct`) of the arrays `ids` if jax.jit's program ran for them lately
        and they are alive, else None."""
        return next((d for d in self.last_direct if alive(d, ids)), None)

    def _free_slot(self) -> int | None:
        """A slot holding no values (its arrays died, or it was cleared), else a new one while
        there is room (`sets`): its index (0 the first, k the k-th spare); None if every slot is
        full."""
        slots = self.slots
        free = next((k for k, slot in enumerate(slots) if slot.values is None), None)
        return free if free is not None or len(slots) >= self.sets else len(slots)

    def _slot_for(self, recent: tuple[Any, ...], back: DirectRun | None) -> int | None:
        """Where a set coming back goes (`back`: its record in `last_direct`, if any): a free slot
        (`_free_slot`), else the least lately used slot that none of the `recent` sets (the last
        two called) used and that went unused for EVICT_AFTER direct runs or while this set ran
        directly twice (it is called more often), or whose values another signature holds, at
        most once per EVICT_AFTER direct runs; None: it stays direct. Sets in turn, each used once
        a round, keep their slots."""
        free = self._free_slot()
        if free is not None:
            return free
        runs = self.direct_runs
        if runs - self.evicted_at < EVICT_AFTER:
            return None
        earlier = back.earlier if back is not None else -1  # the earlier of its last two direct runs
        slots = self.slots
        # a slot whose values another signature holds costs no prologue run to give up: its set
        # is still served from there (batch sizes sharing values)
        shared = {id(o.values) for o in self.cache.group if o.values is not None and o not in slots}
        out = [
            k
            for k, s in enumerate(slots)
            if s.ids not in recent
            and (runs - s.stamp >= EVICT_AFTER or earlier > s.stamp or id(s.values) in shared)
        ]
        return min(out, key=lambda k: (slots[k].stamp, -k)) if out else None

    def wants_direct(
        self, ids: tuple[int, ...], slow: Any, own: bool = True, unbuilt_back: bool = False
    ) -> bool:
        """For a call whose slow arrays are not the cached ones: True when jax.jit's program
        should run (the arrays differ from the previous call's too), False when the prologue
        should (first call, or the same new arrays twice in a row) or another signature of the
        same prologue holds values for them (or this one's second slot, `spare`), or where a set
        comes back that a slot is to keep (`into`, read by values_for). `slow`: the call's slow
        arrays, whose ids are `ids`. Not `own`: a call at shapes no signature is built for yet
        (`hoist.structure_hit`), decided apart from this signature's own calls (True unless its
        arrays came back, `unbuilt_back` from `UnbuiltCalls`: a model at other shapes called in
        turn with this one gets a signature of its own, new parameters on every call build
        nothing; a run of such calls counts toward this signature's handoff, as a training loop
        at those shapes)."""
        held = self._held(ids)
        if not own:
            direct = not held and self.cache.fills > 0 and not unbuilt_back
            self.direct_runs += direct
            self.streak = self.streak + 1 if direct else 0
            return direct
        seen, before = self.seen, self.before
        again = ids == seen and alive(self.seen_refs, ids)  # the last call's arrays, again
        if ids != seen:
            self.before, self.seen = seen, ids
        back = None if self.sets == 1 else self._came_back(ids)
        # weak references to the call's arrays: those kept for them already where they came back
        refs = None if again else back.refs if back is not None else weak_refs(slow)
        if refs is not None:
            self.seen_refs = (ids, refs)
        if self.into is not None and self.into[0] == ids:  # decided by an earlier ask in this call
            self.streak = 0
            return False
        if held:  # in a slot of this prologue: no prologue run
            self.streak = 0
            return False
        # back after jax.jit's program ran for it lately, another set's call between (sets in
        # turn), or the same arrays twice while the first slot holds another set alive: a slot of
        # its own where `_slot_for` finds one, else the twice-called set stays direct (the kept
        # set is not evicted for it: five sets each called twice in turn reran the prologue)
        returning = back is not None and ids != seen
        twice = again and self.sets > 1 and self.cache.values is not None
        blocked = False
        if returning or twice:
            slot = self._slot_for((seen, before), back)
            if slot is not None and self.fits(slot):
                slots = self.slots
                if slot < len(slots) and slots[slot].values is not None:  # replaces a set: counted
                    self.evicted_at = self.direct_runs
                self.last_direct = [d for d in self.last_direct if d.ids != ids]
                self.into, self.streak = (ids, slot), 0
                return False
            blocked = twice
        # the prologue runs for the first call and the same new arrays twice, where its values
        # fit max_hoist_bytes beside those kept for other calls. A set refused for room and
        # reused (`again`) does not count toward the handoff, so it is hoisted once kept values
        # are freed; arrays new on every call do (a training loop whose first set was refused)
        direct = (self.cache.fills > 0 and not again) or blocked
        refused = not direct and not self.fits(0)
        direct = direct or refused
        self.direct_runs += direct
        if direct and self.sets > 1:  # for _came_back and _slot_for, which only sets in turn ask
            recent = [d for d in self.last_direct if d.ids != ids][-(RECENT_SETS - 1) :]
            refs = refs if refs is not None else weak_refs(slow)
            earlier = back.last if back is not None else -1  # its direct run before this one
            self.last_direct = [*recent, DirectRun(ids, refs, earlier, self.direct_runs)]
        # in a row: every call on the cached arrays resets the streak (here, HotPath and
        # Optimized's quickest call, HotPath.call_class); seen == self.ids restarts it as well
        counted = direct and not (refused and again)
        self.streak = (1 if seen == self.ids else self.streak + 1) if counted else 0
        return direct

    @property
    def handoff_due(self) -> bool:
        """The slow arrays changed on HANDOFF_AFTER calls in a row: they are not slow here."""
        return self.streak >= HANDOFF_AFTER

    def __call__(self, *leaves: Any) -> Any:
        slow = list(self.pick_slow(leaves))
        if compat.traced(slow):
            # in a trace the prologue's values are tracers: traced through, never cached
            return self.run(leaves, self.prologue(*slow), nested=True)
        return self.run(leaves, self.values_for(slow))

    def values_for(self, slow: list[Any]) -> list[Any]:
        """The prologue's values for the concrete slow leaves `slow` (`PrologueValues.values_for`):
        from a slot after the first where one holds them or a set that came back is to go there
        (`wants_direct`), else from the first; a call on them starts a run of calls on new
        arrays again."""
        ids = tuple(map(id, slow))
        self.saw(ids)
        values = self.spare_values(ids)
        if values is not None:
            return values
        into, self.into = self.into, None
        slot = into[1] if into is not None and into[0] == ids and ids != self.cache.ids else 0
        # another signature's values for these arrays, while the first slot holds another set:
        # shared into a free slot (no prologue run, no copy), so that neither set evicts the
        # other; with none free, used as they are, kept in no slot of this signature
        shared = self.sets > 1 and self.cache.values is not None and ids != self.cache.ids
        elsewhere = self.cache.held_elsewhere(ids) if shared and into is None else None
        if elsewhere is not None:
            slot = self._free_slot()  # not the first: it holds values (`shared`)
            if slot is None:
                return elsewhere
        if slot > len(self.spares):
            self.spares.append(PrologueValues(self.cache.prologue, self.cache.group, self.cache.kept))
            n = len(self.spares) + 1
            log.info("jaxrw: %d parameter sets in turn: each kept (%d bytes)", n, n * self.nbytes)
        values = (self.cache if slot == 0 else self.spares[slot - 1]).values_for(slow)
        self._stamp(ids)  # filled now: in use
        return values


class KeptValues:
    """Every prologue value one Optimized keeps: the groups of signatures whose prologue is one
    program (`shared_prologue`), and max_hoist_bytes over all their slots at once, each set of
    values counted once however many slots share it. Per signature, `Hoisted.fit` bounds the
    slots; this bounds them together, for signatures at other parameter shapes or programs. A
    set that would pass the bound is not kept: its calls run jax.jit's program (said once).
    `Optimized.bind`'s values are not counted: the bound function holds them, for the caller."""

    def __init__(self, max_bytes: int | None = None, name: str = "") -> None:
        self.max_bytes = max_bytes  # None: unbounded
        self.name = name  # of the optimized function, for the message
        self.groups: dict[Any, tuple[Any, list[PrologueValues]]] = {}  # shared_prologue's
        self.slots: weakref.WeakSet[PrologueValues] = weakref.WeakSet()
        self.told = False

    def held(self, leaving: PrologueValues | None = None) -> int:
        """Bytes of the values kept now, but for those only `leaving` holds (about to be replaced)."""
        kept = [s for s in list(self.slots) if s is not leaving and s.values is not None]
        return sum({id(s.values): s.nbytes for s in kept}.values())  # shared values count once

    def room(self, slot: PrologueValues | None, nbytes: int, quiet: bool = False) -> bool:
        """Whether `nbytes` more fit, in place of what `slot` holds (None: a new slot); says once
        when they do not, unless `quiet`."""
        if self.max_bytes is None:
            return True
        held = self.held(leaving=slot)
        fits = held + nbytes <= self.max_bytes
        if not fits and not self.told and not quiet:
            self.told = True
            warn_user(
                f"jaxrw: {self.name}: not hoisted for these arguments: their {nbytes} bytes of kept "
                f"values and the {held} bytes kept for other calls would pass max_hoist_bytes "
                f"{self.max_bytes}; their calls run jax.jit's program"
            )
        return fits

    def clear(self) -> None:
        """Drop every kept value now (Optimized.clear_cache), and the groups."""
        for slot in list(self.slots):
            slot.clear()
        self.groups.clear()


class PrologueValues:
    """One signature's prologue values for one set of slow arrays, cached by the arrays' identity.
    Signatures whose prologue is one program (`shared_prologue`: batch sizes or cache lengths that
    differ while the parameters do not) share its jit and take each other's values for the same
    arrays (`group`): one set of merged weights, computed once and kept once. Each keeps a slot
    of its own, so signatures called on different parameter sets do not evict each other. New
    values are kept only where they fit the instance's bound (`kept`)."""

    def __init__(
        self,
        prologue: Callable[..., list[Any]],
        group: list[PrologueValues] | None = None,
        kept: KeptValues | None = None,
    ):
        self.prologue = prologue
        self.nbytes = 0  # of `values`
        self.ids: tuple[int, ...] | None = None  # of the slow leaves the cached values belong to
        self.values: list[Any] | None = None
        self.finalizers: list[weakref.finalize] = []  # clear the cache when a leaf of `ids` dies
        self.runs = 0  # prologue runs
        self.fills = 0  # times values were cached: run here or taken from another signature
        self.stamp = 0  # the signature's direct runs when its set last became the one called
        # shown to the group and the instance's bound last, whole
        self.group = [] if group is None else group  # every cache of this prologue program
        self.group.append(self)
        self.kept = KeptValues() if kept is None else kept
        self.kept.slots.add(self)

    def _invalidate(self) -> None:
        self.ids = None
        self.values = None
        self.nbytes = 0

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
                if not self.kept.room(self, values_bytes(values)):  # HoistedCall asks first
                    return values
            for f in self.finalizers:  # the old leaves' deaths must not clear these values
                f.detach()
            # in this order: a quick path reading without the instance's lock checks the token
            # before and after it reads the values (hoist.HotPath.call_class)
            self.ids = None
            self.values, self.nbytes = values, values_bytes(values)
            self.ids = ids
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


def alive(kept: tuple | None, ids: tuple[int, ...]) -> bool:
    """Whether `kept` (ids and weak references first) is of the arrays `ids`, every one alive (a
    dead array's id may be a new array's now)."""
    return kept is not None and kept[0] == ids and all(r() is not None for r in kept[1])


def weak_refs(slow: Any) -> list[weakref.ref]:
    """Weak references to the jax arrays among `slow` (others cannot be kept an eye on)."""
    return [weakref.ref(x) for x in slow if isinstance(x, jax.Array)]


class UnbuiltCalls:
    """The slow arrays of the last RECENT_SETS calls of one pytree structure at shapes no
    signature is built for yet (`hoist.structure_hit`), kept with weak references: arrays that
    come back among them, alive, get a signature of their own (models of other shapes in turn);
    arrays new on every call never do. One per structure, whichever signature's policy decides."""

    def __init__(self) -> None:
        self.recent: list[tuple[tuple[int, ...], list[weakref.ref]]] = []

    def came_back(self, ids: tuple[int, ...], slow: Any) -> bool:
        """Whether the arrays `ids` were those of one of the recent calls; this call is recorded."""
        if any(alive(d, ids) for d in self.recent):
            return True
        self.recent = [*self.recent[-(RECENT_SETS - 1) :], (ids, weak_refs(slow))]
        return False


def avals_of(leaves: Any) -> list[Any]:
    """The abstract values (shape, dtype, weak type) of jax arrays, else their signature keys:
    jax shares one aval between arrays of one kind, so comparing these lists is ~2 µs for 56
    leaves on this project's CPU (leaf_key: 18 µs)."""
    try:
        return [x.aval for x in leaves]
    except AttributeError:  # a NumPy array or Python scalar among them
        return list(map(leaf_key, leaves))


def values_bytes(values: list[Any]) -> int:
    """Bytes of a list of prologue values (arrays; anything else counts nothing)."""
    return sum(getattr(v, "nbytes", 0) for v in values)


def _invalidate(ref: weakref.ref) -> None:
    """A slow array died: its signature's values, if that cache still exists, are dropped."""
    cache = ref()
    if cache is not None:
        cache._invalidate()


def shared_prologue(kept: KeptValues, hoisted: Any, leaves: list) -> PrologueValues:
    """A value cache for `hoisted.prologue` on these slow leaves, in the group `kept` (an
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
            return PrologueValues(prologue, kept=kept)
        key = (keys, str(closed), tuple(map(id, constants)))
    except Exception:  # noqa: BLE001 - a cache of its own: only sharing is lost
        return PrologueValues(prologue, kept=kept)
    jitted, group = kept.groups.setdefault(key, (prologue, []))
    return PrologueValues(jitted, group, kept)


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

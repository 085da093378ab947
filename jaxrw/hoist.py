"""The hoisted call path (`optimize(hoist_argnums=...)`): the main program run on prologue values
cached by the identity of the slow arrays (`prologue.HoistedCall`), the quick path of cached
calls (`HotPath`), and, when the slow arrays change on every call, jax.jit's own program."""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax

from . import compat
from .hoist_layout import Layout, fast_signature, hoisted_as_passed, with_hoisted
from .identity import SCALARS, checker, snapshot, stand_in
from .logs import fn_name
from .options import named_once, param_names, signature_of
from .prologue import HANDOFF_AFTER, HoistedCall, UnbuiltCalls, picker
from .schedule.xla_modes import is_nested_options_error, without_frame
from .signature import leaf_key  # the signature key optimize uses

__all__ = ["HoistedCall", "HotPath", "NotHot", "MISS", "DIRECT", "HANDOFF_AFTER", "picker", "bind"]
__all__ += ["handoff_schedule", "slow_leaves", "install_hot", "first_call", "run_proven", "run_direct"]
__all__ += ["stepped_out"]

log = logging.getLogger("jaxrw")


class NotHot(Exception):  # noqa: N818 - a signal, caught by Optimized.__call__
    """Raised while a HotPath's jit traces arguments of another signature than its own."""


MISS = object()  # HotPath could not take the call: the full call path does
DIRECT = object()  # run_proven: jax.jit's program runs this call (run_direct)


class HotStructure:
    """The hoisted signatures called with one pytree structure and statics (`Optimized._hot`), by
    the keys of their fast (not hoisted) leaves, so that a call on cached arrays finds its own
    signature without the full key (`structure_hit`): batch sizes or cache lengths in turn,
    each with its parameter sets, and under one key the signatures of parameters of other shapes
    with the same data (models in turn). `last`: the signature called last, whose policy
    decides for calls at shapes no signature is built for yet."""

    __slots__ = ("fast", "pick", "signatures", "last", "unbuilt")

    def __init__(self, fast: tuple[int, ...], entry: Any):
        self.fast = fast  # positions of the fast leaves
        self.pick = picker(fast)
        self.signatures: dict[tuple, list[Any]] = {}
        self.last = entry
        self.unbuilt = UnbuiltCalls()  # calls at shapes no signature is built for yet


class _SpareChecks(NamedTuple):
    """The quick path's checks of the arrays in one of a signature's slots after the first
    (HoistedCall.spares)."""

    slot: Any  # that slot (a PrologueValues)
    token: tuple[int, ...]  # the slot's `ids` when checked: replaced when it is refilled or cleared
    same_hoisted: Callable[[Any], bool] | None  # as HotPath's, for these arrays
    same_lead: Callable[[Any], bool] | None
    passed: list[Callable[[], Any]]  # identity.stand_in

    def live(self) -> bool:
        """Whether the slot still holds the arrays these checks were made for (not refilled, nor
        cleared because an array died)."""
        return self.slot.ids is self.token and self.slot.values is not None


class HotPath:
    """The quickest call of a hoisted signature whose slow arrays are cached.

    Python checks only the identity (and pytree structure) of the hoisted arguments' leaves; the
    rest (flattening, the signatures of the other arguments, the output tree) is jax's C++
    dispatch of one jax.jit that takes the prologue values, the few hoisted leaves the main
    program reads, and the other arguments (`Layout`). Arguments of another signature reach that
    jit as a new trace, which raises NotHot; the caller then turns the path off for good, so
    alternating signatures never pay a trace per call. One per signature (`Entry.hot`),
    refreshed when the prologue reruns for new slow arrays."""

    def __init__(self, opt: Any, entry: Any, key: tuple, args: tuple, kwargs: dict):
        self.h = entry.call
        self.entry = entry
        self.donates = bool(opt.donors)  # its calls under a trace go to Optimized.__call__
        self.usable = False  # refreshed for concrete arrays in the layout's structure
        self.h_ids: tuple[int, ...] | None = None  # h.ids then: replaced if the prologue reruns
        self.layout = Layout(opt, entry, key, args, kwargs)
        # under an XLA mode, the jit with its options itself (no TopLevel frame per call) and, for
        # calls inside another jit's trace, its plain twin (`nested`)
        self.call, self.nested = without_frame(self.layout.main_jit(opt, entry, key, NotHot))
        # whether the hoisted arguments hold the objects the values belong to (`checker`), or None
        self.same_hoisted: Callable[[Any], bool] | None = None
        # the same for the first argument alone, when it is the only hoisted one (the usual layout,
        # checked without building the list of hoisted arguments: `call_class`)
        self.same_lead: Callable[[Any], bool] | None = None
        self.passed: list[Callable[[], Any]] = []  # the hoisted leaves the main program reads
        self.own = fast_signature(self.layout.fast(args, kwargs))  # the other arguments' kinds
        self.spares: list[_SpareChecks] = []  # the same for the arrays of the slots after the first
        self.displaced = False  # another signature's HotPath took the instance's quick path from it

    def refresh(self, args: tuple, kwargs: dict) -> None:
        """Now cached: the values the prologue computed for these arguments' hoisted leaves. The
        checks pair with those values only if nothing refilled the slot while they were made."""
        token = self.h.ids  # the callers' condition: these arguments' slow arrays
        self.usable, self.same_hoisted, self.same_lead, self.passed = self._checks(args, kwargs)
        self.h_ids = token
        if self.h.ids is not token:  # refilled meanwhile: no values are these arrays' now
            self.usable, self.h_ids = False, None

    def refresh_spare(self, args: tuple, kwargs: dict, slot: Any) -> None:
        """Now in `slot`, one after the first (HoistedCall.spares): the checks of these arguments'
        arrays, tried after the first slot's."""
        usable, same_hoisted, same_lead, passed = self._checks(args, kwargs)
        kept = [c for c in self.spares if c.slot is not slot]
        if usable:
            kept.append(_SpareChecks(slot, slot.ids, same_hoisted, same_lead, passed))
        self.spares = kept

    def checked_spare(self, slot: Any) -> bool:
        """Whether `slot`'s arrays, as they are now, have checks here."""
        return any(c.slot is slot and c.token is slot.ids for c in self.spares)

    def from_spare(self, arg: Any, lead: bool) -> tuple[list, tuple] | None:
        """The values of a slot after the first and the leaves the main program reads, where `arg`
        holds that slot's arrays (the first argument when `lead`, else the hoisted arguments);
        else None."""
        for c in self.spares:
            check = c.same_lead if lead else c.same_hoisted
            if check is not None and c.live() and check(arg):
                values = c.slot.values
                if values is None or c.slot.ids is not c.token:  # refilled while read (hot_call)
                    return None
                self.h.saw(c.token)
                return values, tuple(map(operator.call, c.passed))  # alive: `arg` holds them
        return None

    def _checks(self, args: tuple, kwargs: dict) -> tuple:
        """For the values of these arguments' hoisted leaves: whether the layout applies, the
        identity checks of the hoisted arguments and of the first one alone, and what stands in
        for the leaves the main program reads (`identity.stand_in`)."""
        hoisted = self.layout.hoisted_args(args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten(hoisted)
        # the values belong to these leaves only if none is a tracer (under a trace the prologue
        # reruns inside it and the values cached stay those of concrete arrays)
        usable = self.layout.ok and compat.same_treedef(tree, self.layout.tree)
        usable = usable and not any(map(compat.is_tracer, leaves))
        # weak references stand in for the arrays the main program reads only where each is a
        # slow leaf, whose death clears the cache (`h.ids`); one that was no jax array when the
        # signature was built is not, and a new array could take its id after it died: those
        # calls take the current leaves (the flatten branch). Python scalars are checked by value
        slow, read = set(self.layout.slow), self.layout.passed
        kept = usable and all(j in slow or type(leaves[j]) in SCALARS for j in read)
        passed = [stand_in(leaves[j]) for j in read] if kept else []
        snap = snapshot(hoisted) if kept and None not in passed else None  # None for other leaves
        same_hoisted = checker(snap) if snap is not None else None
        passed = passed if snap is not None else []
        one = snap is not None and self.layout.prefix == 1
        same_lead = checker(snapshot(hoisted[0])) if one else None  # not None: inside `snap`
        return usable, same_hoisted, same_lead, passed

    def __call__(self, opt: Any, args: tuple, kwargs: dict) -> Any:
        """The result, or MISS; NotHot when the jit meets another signature. The usual layout's
        cached calls never come here: `call_class` serves them."""
        h, lay = self.h, self.layout
        if not self.usable:  # never refreshed with a usable layout: the full call path
            return MISS
        hoisted = lay.hoisted_args(args, kwargs)
        cached = h.ids is self.h_ids and h.values is not None
        values = h.values
        if cached and self.same_hoisted is not None and self.same_hoisted(hoisted):
            # the same objects as at refresh: no flattening (a dict's flatten sorts its keys)
            passed = tuple(map(operator.call, self.passed))  # alive: `hoisted` holds them
            h.saw(self.h_ids)
        elif (got := self.from_spare(hoisted, lead=False)) is not None:
            values, passed = got
        else:
            leaves, tree = jax.tree_util.tree_flatten(hoisted)
            if not compat.same_treedef(tree, lay.tree):
                return MISS  # another structure: the full call path
            # the values belong to the slow leaves alone (jax arrays): any other hoisted leaf (a
            # Python float, new or not on each call) is passed to the main program as it is
            slow = lay.pick_slow(leaves)
            ids = tuple(map(id, slow))
            # a later slot's arrays, in other containers?
            slot = next((c for c in self.spares if c.live() and c.token == ids), None)
            in_spare = slot is not None
            if in_spare:
                values = slot.slot.values
            elif not (cached and ids == self.h_ids):
                # new slow arrays: this signature's policy decides where the other arguments are
                # its own, else the call's signature on the full path (`structure_hit`)
                own = self.own is not None and slow and not compat.traced(slow)
                own = own and fast_signature(lay.fast(args, kwargs)) == self.own and h.owns(slow)
                direct = own and h.wants_direct(ids, slow)
                return run_direct(opt, self.entry, args, kwargs) if direct else MISS
            passed = lay.pick_passed(leaves)
            h.saw(slot.token if in_spare else self.h_ids)
        fast, fast_kw = lay.fast(args, kwargs)
        return self._run(values, passed, fast, fast_kw)

    def _run(self, values: list, passed: tuple, fast: tuple, fast_kw: dict) -> Any:
        """The main program's jit on the cached values and the call's other arguments."""
        try:
            return self.call(values, passed, *fast, **fast_kw)
        except ValueError as e:  # inside another jit's trace: no compiler options there
            if self.nested is None or not is_nested_options_error(e):
                raise
            return self.nested(values, passed, *fast, **fast_kw)

    def call_class(self, base: type) -> type | None:
        """A subclass of `base` (Optimized) whose `__call__` checks the lone first hoisted argument
        (`same_lead`) and calls the main program's jit, in one Python frame, for `Optimized` to take
        as its class while this path serves it; any other call goes to `base.__call__`. None where
        that check does not apply (another layout: `__call__` above serves it).

        On the H200's host every Python frame shows: the direct hoisted call of nasrnn_args_hoist
        ran 103 µs against 73 µs bound (j2); with this frame the gap was 12 µs on a faster host
        (k6: 31 µs in e5). On this project's CPU its Python is 1.7 µs against 2.5 µs before,
        mostly the identity check of the 16 leaves (bench/hot_call_cpu.py)."""
        h, token, same_lead, call, nested = self.h, self.h_ids, self.same_lead, self.call, self.nested
        cache = h.cache  # its attributes directly: no property in the quickest call
        if same_lead is None or token is None:
            return None
        refs, get = tuple(self.passed), operator.call
        slow_call, donating, config, from_spare = base.__call__, self.donates, jax.config, self.from_spare

        def hot_call(opt: Any, /, *args: Any, **kwargs: Any) -> Any:
            # the slow arrays are still the cached ones (cache.ids is replaced or cleared otherwise) and
            # args[0] holds them: every leaf alive, so the values belong to it. Under disable_jit,
            # or a donating call under a trace, Optimized.__call__ decides (~0.1 µs to ask). No
            # lock (0.5 µs a call here): a refill, on another thread's full path, clears ids before
            # it writes values, so values read between two checks of the token are the token's
            if config.jax_disable_jit or (donating and compat.under_trace()):
                return slow_call(opt, *args, **kwargs)
            if args and cache.ids is token and same_lead(args[0]) and (values := cache.values) is not None:
                if cache.ids is not token:  # refilled while read
                    return slow_call(opt, *args, **kwargs)
                if h.seen is not token and h.seen != token:  # HoistedCall.saw, inline
                    h.before, h.seen, cache.stamp = h.seen, token, h.direct_runs
                h.streak = 0
                got = values, (tuple(map(get, refs)) if refs else ())
            elif not args or not h.spares or (got := from_spare(args[0], lead=True)) is None:
                return slow_call(opt, *args, **kwargs)  # not the arrays of any slot
            try:
                return call(*got, *args[1:], **kwargs)
            except ValueError as e:  # inside another jit's trace: no compiler options there
                if nested is None or not is_nested_options_error(e):
                    raise
                return nested(*got, *args[1:], **kwargs)
            except NotHot:  # other shapes: this path is off for good (as in Optimized.__call__)
                with opt._lock:
                    opt._set_hot_path(None, off=True)
            return slow_call(opt, *args, **kwargs)

        # `_checked_hot`: a call it passes on was not this path's (Optimized.__call__ goes on to the
        # structure lookup, which finds any signature's slot, and the policy for new arrays)
        return type(base.__name__, (base,), {"__call__": hot_call, "_call_class": True, "_checked_hot": True})


@contextlib.contextmanager
def stepped_out(lock: Any) -> Iterator[None]:
    """The block runs out of `lock` (an RLock, however many times this thread holds it), which is
    taken again after, as threading.Condition.wait does: a build traces the user's function,
    whose jax.jit calls may wait on a trace in another thread that waits on this lock."""
    if not lock._is_owned():
        yield
        return
    state = lock._release_save()
    try:
        yield
    finally:
        lock._acquire_restore(state)


def needs_python(entry: Any, fast_mode: str = "xla") -> bool:
    """Whether a signature's program runs through `entry.call` on the Python call path: a hoisted
    program (prologue cached by identity), a thunky schedule, or an XLA mode (compiler options)
    other than the one the fast path's jit is compiled under (`fast_mode`)."""
    if isinstance(entry.call, HoistedCall) and not entry.handed_off:
        return True
    return entry.schedule != fast_mode


def install_hot(opt: Any, entry: Any, key: tuple, args: tuple, kwargs: dict, leaves: list) -> None:
    """After a call of a hoisted signature that left its prologue values cached: the signature's
    structure is remembered (`Optimized._hot`, a HotStructure) and, where the values belong to this
    call's slow arrays, its HotPath is refreshed for them and made the instance's quick path."""
    h = entry.call
    slow = set(h.slow)
    fast = tuple(i for i in range(len(leaves)) if i not in slow)
    known = opt._hot.get((key[0], key[2]))
    if known is None or known.fast != fast:  # other leaves hoisted: a record of its own
        known = opt._hot[(key[0], key[2])] = HotStructure(fast, entry)
    known.last = entry
    alike = known.signatures.setdefault(tuple(key[1][i] for i in fast), [])
    if not any(e is entry for e in alike):
        alike.append(entry)
    # the cached values belong to this call's slow arrays (not so when one is a tracer)
    ids = tuple(map(id, h.pick_slow(leaves)))
    spare = h.spare_slot(ids)
    if spare is not None and entry.hot is not None:
        if not entry.hot.checked_spare(spare):
            entry.hot.refresh_spare(args, kwargs, spare)  # a later slot's arrays: checked after the first's
        return
    if h.ids is None or h.ids != ids:
        return
    current = opt._hot_path
    if current is not None and current is not entry.hot and not opt._hot_path_off:
        # another signature's quick path: taken over once (a new phase: prefill, then decode), not
        # taken back by a signature that lost it (signatures in turn rebuilt the instance's class
        # on every call, 13x jax.jit's time in a review): its calls take the full path
        if entry.hot is not None and entry.hot.displaced:
            if entry.hot.h_ids is not h.ids:
                entry.hot.refresh(args, kwargs)  # for run_proven: new values, once
            return
        current.displaced = True
    if not opt._hot_path_off:
        entry.hot = entry.hot or HotPath(opt, entry, key, args, kwargs)
        entry.hot.refresh(args, kwargs)
        opt._set_hot_path(entry.hot)
    elif entry.hot is not None and entry.hot.h_ids is not h.ids:
        entry.hot.refresh(args, kwargs)  # for run_proven: new values, once


def _concrete(slow: list[Any]) -> bool:
    """Slow leaves whose prologue values are cached by identity: jax arrays, no tracers."""
    return all(isinstance(x, jax.Array) for x in slow) and not compat.traced(slow)


def first_call(opt: Any, entry: Any, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
    """A hoisted signature's first call on concrete jax arrays, through its quick path (HotPath):
    its jit is then the only compilation of the main program that calls on cached parameters
    need (the plain call's jit, compiled as well before, took 0.8 s more for llama288 on this
    project's CPU at the second call). MISS where the quick path does not take the call (the
    prologue values, if computed, stay cached for the plain call)."""
    h = entry.call
    slow = list(h.pick_slow(leaves))
    if opt._hot_path_off or opt.verify or not _concrete(slow) or not h.can_keep(tuple(map(id, slow))):
        return MISS  # (values past max_hoist_bytes: the plain call runs the prologue, keeps nothing)
    h.values_for(slow)
    install_hot(opt, entry, key, args, kwargs, leaves)
    if opt._hot_path is not entry.hot or entry.hot is None:
        return MISS
    try:
        return entry.hot(opt, args, kwargs)
    except Exception:  # the caller falls back: nothing of this signature may serve a later call
        opt._set_hot_path(None)
        opt._hot.pop((key[0], key[2]), None)
        entry.hot = None
        raise


def run_proven(opt: Any, entry: Any, key: tuple, args: tuple, kwargs: dict, leaves: list) -> Any:
    """The flat outputs of a hoisted signature's later call on the full call path (new slow
    arrays, or another signature turned the quick path off: batch sizes alternating), or
    DIRECT where the signature's policy runs jax.jit's program for new arrays
    (`HoistedCall.wants_direct`). Through the signature's HotPath, refreshed for the values,
    whose jit its first call compiled (the plain run's jit would be a second compilation of the
    main program); else the plain run."""
    hot, h = entry.hot, entry.call
    slow = list(h.pick_slow(leaves))
    if not compat.traced(slow):  # new slow arrays, changing on every call (verify: past the bound)
        ids = tuple(map(id, slow))
        if (ids != h.ids or h.values is None) and (
            not h.can_keep(ids) if opt.verify else h.wants_direct(ids, slow)
        ):
            return DIRECT
    if hot is None or opt.verify or not _concrete(slow):
        return h(*leaves)
    h.values_for(slow)
    install_hot(opt, entry, key, args, kwargs, leaves)  # refreshes the HotPath for new values
    if hot.h_ids is h.ids and h.values is not None:
        try:
            out = hot(opt, args, kwargs)
        except NotHot:
            out = MISS
        if out is not MISS:
            return jax.tree_util.tree_leaves(out)
    return h(*leaves)


def structure_hit(
    opt: Any, known: HotStructure, leaves: list, key: Callable[[], tuple], args: tuple, kwargs: dict
) -> Any:
    """A call whose pytree structure and statics hoisted signatures were called with (`known`):
    its result where the shapes are one's and its slow arrays are cached in a slot of that one;
    jax.jit's program where the arrays are new and the policy of that signature (or of the last
    called, when no signature is built for the call's shapes yet, `key()`: new parameters with
    new shapes on every call then build nothing) sends the call there; else MISS, for the full
    call path."""
    alike = known.signatures.get(tuple(map(leaf_key, known.pick(leaves))), ())
    slow = known.last.call.pick_slow(leaves)  # (the same leaves in each: one structure)
    ids = tuple(map(id, slow))
    for entry in alike:  # a slot's arrays: through that signature's HotPath if any
        h = entry.call
        slot = h.cache if ids == h.ids else h.spare_slot(ids)
        if slot is not None and slot.values is not None:
            return _cached_run(opt, entry, leaves, slot, args, kwargs)
    # new arrays: the policy of the signature built for parameters of their shapes, if any
    entry = next((e for e in alike if e.call.owns(slow)), None)
    same = entry is not None
    entry = entry or known.last
    h = entry.call
    if ids == h.ids or compat.traced(slow) or not (same or key() not in opt._cache):
        return MISS  # cached arrays at other shapes, a trace, or another built signature's call
    back = not same and known.unbuilt.came_back(ids, slow)
    return run_direct(opt, entry, args, kwargs) if h.wants_direct(ids, slow, same, back) else MISS


def _cached_run(opt: Any, entry: Any, leaves: list, slot: Any, args: tuple, kwargs: dict) -> Any:
    """structure_hit's result for arrays cached in `slot`: the jit of the signature's HotPath,
    which its first call compiled (the plain run's would compile the main program again), where
    that path is in step with the slot's arrays now, without its identity check (the call's
    slow leaves are the slot's by id, and alive); through the plain run where the signature has
    no usable HotPath (its first call compiled that one); else MISS (the full call path
    refreshes the HotPath)."""
    h, hot = entry.call, entry.hot
    if hot is None or not hot.usable:
        h.saw(slot.ids)
        return jax.tree_util.tree_unflatten(entry.out_tree, h.run(leaves, slot.values))
    synced = hot.h_ids is h.ids if slot is h.cache else hot.checked_spare(slot)
    if not synced:
        return MISS
    # the call's slow leaves are the slot's arrays (by id, and alive: the call holds them) in the
    # signature's structure: its jit runs without the HotPath's identity check
    h.saw(slot.ids)
    fast, fast_kw = hot.layout.fast(args, kwargs)
    try:
        return hot._run(slot.values, hot.layout.pick_passed_full(leaves), fast, fast_kw)
    except NotHot:  # not expected at the signature's own shapes: the full call path decides
        return MISS


def run_direct(opt: Any, entry: Any, args: tuple, kwargs: dict) -> Any:
    """jax.jit's program, for a hoisted signature called with new slow arrays (HoistedCall.
    wants_direct); after HANDOFF_AFTER such calls in a row the signature is handed off: it runs
    jax.jit's program from now on, through the C++ fast path once no signature needs Python,
    so its calls cost what jax.jit's do. `clear_cache()` hoists again."""
    out = opt._jitted(*args, **kwargs)
    if entry.handed_off or not entry.call.handoff_due:
        return out
    entry.report.handed_off = HANDOFF_AFTER  # entry.handed_off reads it
    log.info("jaxrw %s: hoisted arguments new on every call; running jax.jit's program", fn_name(opt.fn))
    handoff_schedule(opt, entry, args, kwargs)
    opt._adopt_mode(entry)
    python = any(needs_python(e, opt._fast_mode) for e in opt._cache.values())
    if opt._fast_state == "off" and opt._fast_path() and not python:
        opt._fast_state = "on"
        opt._set_hot_path(None)
        opt._hot.clear()
    if opt._fast_state == "on" and opt._all_original():
        opt._enter_jit()  # no signature left whose program is not jax.jit's
    return out


def slow_leaves(opt: Any, owners: list[int | str], leaves: list) -> frozenset[int]:
    """Positions of the leaves of `opt`'s hoisted arguments (`owners`: each leaf's argument): jax
    arrays only (immutable, so identity is a sound cache key), never donated ones."""
    hoisted = opt.hoisted_owners  # each by position and by name, donated ones left out
    return frozenset(
        i
        for i, (o, x) in enumerate(zip(owners, leaves, strict=True))
        if o in hoisted and (isinstance(x, jax.Array) or compat.is_tracer(x))
    )


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
    pos, names = hoisted_as_passed(opt, args, kwargs)
    by_index = param_names(opt.fn)
    given = {*pos, *names, *(by_index[i] for i in pos if i in by_index)}
    missing = named_once(  # a donated one is not bound: each call passes it (its buffer is gone after one)
        opt.fn,
        (
            o
            for o in (*opt.hoist_argnums, *opt.hoist_argnames)
            if o in opt.hoisted_owners and o not in given and by_index.get(o) not in given
        ),
    )
    if missing:
        raise InvalidOptionError(f"bind: hoisted arguments {missing!r} not given; pass every argument once")
    sig = signature_of(opt.fn, follow_wrapped=False)
    if sig is not None:  # the others too: the user's function would raise its own TypeError in the trace
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidOptionError(f"bind: {e}; pass every argument once, as to a call") from None
    hoisted: dict[int | str, Any] = {i: args[i] for i in pos}
    hoisted.update((k, kwargs[k]) for k in names)
    entry, key, leaves = opt._entry_for(args, kwargs)  # built if new
    h = entry.call

    if not isinstance(h, HoistedCall) or entry.fallback is not None:  # nothing hoisted: a plain call

        def plain(*fast: Any, **fast_kw: Any) -> Any:
            merged = with_hoisted(fast, fast_kw, hoisted)
            if merged is None:
                taken = len(args) - len(pos)
                raise InvalidOptionError(
                    f"a bound function takes the {taken} arguments it was not bound to; got {len(fast)}"
                )
            return opt(*merged[0], **merged[1])

        return plain
    values = h.prologue(*h.pick_slow(leaves))
    layout = Layout(opt, entry, key, args, kwargs)

    def mismatch(what: str = "") -> Exception:
        return InvalidOptionError(
            "a bound function was called with arguments of another structure, shape or dtype "
            f"than it was bound with{f' ({what})' if what else ''}; bind again for them"
        )

    local = jax.tree_util.tree_leaves(layout.hoisted_args(args, kwargs))
    return functools.partial(layout.main_jit(opt, entry, key, mismatch), values, layout.pick_passed(local))


def handoff_schedule(opt: Any, entry: Any, args: tuple, kwargs: dict) -> None:
    """A hoisted signature handed off (parameters new on every call) runs jax.jit's program; under
    schedule="auto" on CUDA, with the XLA mode measured fastest for that program (the decode steps'
    host-bound launches gain from XLA's concurrent command buffers without any rewrite)."""
    from .schedule import choice
    from .schedule.timing import device_inputs

    dyn, _statics = opt._split(args, kwargs)
    leaves, in_tree = jax.tree_util.tree_flatten(dyn)
    flat = opt._flat_fn(args, kwargs, in_tree)
    entry.schedule, why = choice.for_plain_jit(
        opt.schedule, flat, lambda: device_inputs(leaves), leaves, opt.schedule_memory_slack, kept=True
    )
    entry.report.schedule = f"{entry.schedule}: {why} (handed off to jax.jit's program)"

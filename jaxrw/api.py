"""`optimize`: a jax.jit-like decorator that rewrites each traced signature before compiling it.

Per abstract signature (pytree structure, shapes, dtypes, weak types, static values) the function
is traced once, rewritten, guarded, decoded and jitted; later calls with that signature reuse the
compiled program. Any internal failure falls back to jax.jit with one warning naming the stage and
cause (`strict=True` raises instead). `JAXRW_DISABLE=1` (read at an optimized function's first call)
makes every optimize a plain jax.jit.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from . import compat, hoist, signature
from .errors import InvalidOptionError, JaxrwError, RewriteStageError, UnsupportedProgramError
from .fallback import FallBacks
from .hoist import MISS, HoistedCall, HotPath, NotHot, first_call, install_hot, slow_leaves
from .logs import fn_name, warn_user, warnings_held
from .options import (
    both_spellings,
    checked_options,
    disabled,
    hoisted_arguments,
    resolve_argnums,
    signature_of,
)
from .prologue import KeptValues
from .rewrite.cost import CostModel
from .rewrite.decode import check_decoded
from .rewrite.profiles import Profile, default_profile, get_profile
from .rewrite.run import DEFAULT_MAX_HOIST_BYTES, Limits, RewriteReport, rewrite_jaxpr
from .schedule.xla_modes import XLA_MODES, is_nested_options_error, tuned_jit, without_frame
from .signature import Entry, as_written, leaf_keys, leaf_owners, spec
from .stages import Stages
from .tolerance import check_outputs, relative_error, tolerance

__all__ = ["optimize", "Optimized", "tolerance", "relative_error"]

log = logging.getLogger("jaxrw")


class _BuildOutside(Exception):
    """Raised inside the fast path's trace for a signature that must be built, or run, outside it."""


def _state(default: Any) -> Any:
    return field(default=default, init=False, repr=False)


@dataclass(eq=False)  # hashable by identity, like a jitted function
class Optimized(Stages, FallBacks):
    """The callable `optimize` returns. Call it like the original function."""

    fn: Callable
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donate_argnums: tuple[int, ...] = ()
    donate_argnames: tuple[str, ...] = ()
    rules: Any = None
    cost_model: str | CostModel = "roofline"
    extractor: str = "greedy"
    profile: Profile | str | None = None
    verify: bool = False
    strict: bool = False
    limits: Limits = field(default_factory=Limits)
    numerics: str = "default"
    schedule: str = "auto"
    schedule_memory_slack: float = 0.0
    autotune: bool = False
    autotune_k: int = 4
    hoist_argnums: tuple[int, ...] = ()
    hoist_argnames: tuple[str, ...] = ()
    max_hoist_bytes: int = DEFAULT_MAX_HOIST_BYTES
    _cache: dict[Any, Entry] = field(default_factory=dict, repr=False)
    traces: int = 0  # how many signatures were traced (for tests and explain)
    _keep: bool = field(default=False, repr=False)  # keep each signature's RewriteResult (explain)
    # the call state (not copied by dataclasses.replace, as explain's clone is made)
    _jitted: Any = _state(None)  # jax.jit(fn): fallbacks, and jax.jit's program where needed
    _fast: Any = _state(None)  # jax.jit of `_inline` (see `_fast_path`)
    _fast_state: str = _state("unknown")  # "on", "jit", "off", "broken" or "disabled"
    _fast_mode: str = _state("xla")  # the XLA mode `_fast` is compiled under
    _fast_nested: Any = _state(None)  # `_fast` without that mode's options
    _fast_gen: Any = _state(None)  # which `_new_fast` made `_fast` (see there)
    _unbuilt: set = field(default_factory=set, init=False, repr=False)  # met in state "jit", not built
    # hoisting: (pytree structure, statics) -> the hoisted signatures called with them, by their
    # fast leaves' keys (hoist.HotStructure), so a call with cached slow arrays skips the full key
    _hot: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)
    _hot_path: HotPath | None = _state(None)  # of the last such signature called
    _hot_path_off: bool = _state(False)  # it met another signature: not used again
    _prologues: KeptValues = _state(None)  # every prologue value kept, bounded by max_hoist_bytes
    _undonated: Any = _state(None)  # this function without donation (`_without_donation`)
    # where a call's arrays were split along an inner axis (tensor parallel): every signature is
    # then kept as written (signature.split_inner_axis; read at the first call and at each build)
    _split_note: str = _state("")
    # one thread at a time on a hoisting instance's Python paths (its kept values and quick paths)
    _lock: Any = field(default_factory=threading.RLock, init=False, repr=False)

    def __post_init__(self):
        if type(self).__dict__.get("_call_class"):  # dataclasses.replace of one with a call of its own
            self.__class__ = Optimized
        compat.wraps_as(self, self.fn)
        self.fn = compat.weakly_referable(self.fn)
        # names completed from the indices as given (a negative one names by jax.jit's count)
        self.static_argnums, self.static_argnames = both_spellings(
            self.fn, self.static_argnums, self.static_argnames
        )
        self.donate_argnums, self.donate_argnames = both_spellings(
            self.fn, self.donate_argnums, self.donate_argnames
        )
        for k in ("static_argnums", "donate_argnums", "hoist_argnums"):  # negative ones, as jax.jit
            setattr(self, k, resolve_argnums(self.fn, getattr(self, k), k))
        self.donors = (*self.donate_argnums, *self.donate_argnames)  # leaf owners (index or name)
        statics = (*self.static_argnums, *self.static_argnames)
        hoisted = hoisted_arguments(self.fn, self.hoist_argnums, self.hoist_argnames, statics, self.donors)
        self.hoisted_owners, self.donated_hoisted = hoisted
        hoist = both_spellings(self.fn, self.hoist_argnums, self.hoist_argnames)
        self.hoist_argnums, self.hoist_argnames = hoist
        self._jitted = jax.jit(self.fn, **self._jit_options())
        self._fast = self._new_fast()
        self._prologues = KeptValues(self.max_hoist_bytes, fn_name(self.fn))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # a method: bound, as jax.jit's are
        return self if obj is None else types.MethodType(self, obj)  # its attributes reach through

    def _without_donation(self, /, *args: Any, **kwargs: Any) -> Any:
        """A call under grad/vmap/jit, where jax would donate grad's forward arrays: a residual the
        rewrite keeps in a donated buffer is then read deleted (jax.jit of that form fails alike)."""
        if self._undonated is None:
            self._undonated = dataclasses.replace(self, donate_argnums=(), donate_argnames=(), _cache={})
            self._undonated._split_note = self._split_note
        return self._undonated(*args, **kwargs)

    def _jit_options(self) -> dict[str, Any]:
        """jax.jit's options, both spellings resolved (given both, jax.jit infers neither); for a
        function whose signature cannot be read (`max`), no names as None, as jax.jit(max) has it
        (jax.jit asks a signature of any names given, even none)."""
        keys = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")
        opts = {k: getattr(self, k) for k in keys}
        if signature_of(self.fn) is None and not opts["static_argnames"] and not opts["donate_argnames"]:
            opts["static_argnames"] = opts["donate_argnames"] = None
        return opts

    def _new_fast(self) -> Any:
        """A jax.jit of `_inline`, through a function of its own (jax caches traces by function: a
        jit of the bound `_inline` would find an earlier one's). A new one after `_inline` raised
        _BuildOutside: jax's C++ dispatch sends every later call of a signature whose first trace
        raised through Python (~90 µs a call on a CPU). Under an XLA mode `_fast` is the jit with
        its options itself (no TopLevel frame); inside another jit `__call__` takes `_fast_nested`.
        A jit since replaced (held as a `__call__` taken in state "jit") traces `fn` as written."""
        self._fast_gen = generation = object()

        def inline(*args: Any, **kwargs: Any) -> Any:
            if generation is not self._fast_gen or jax.config.jax_disable_jit:
                return self.fn(*args, **kwargs)
            return self._inline(*args, **kwargs)

        # named as the user's function (jax's program names, errors and argument names read it
        # through __wrapped__); `inline` takes *args: jit cannot map donated keyword arguments
        # itself (donate_argnames)
        compat.named_as(inline, self.fn, signature=True)
        fast = tuned_jit(inline, self._fast_mode, **self._jit_options())
        fast, self._fast_nested = without_frame(fast)
        return fast

    # -- calling ----------------------------------------------------------------------------
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if self.hoisted_owners and not self._lock._is_owned():  # no frame more for other functions
            with self._lock:  # hoisting: a call checks, reads and refills values other calls keep
                return Optimized.__call__(self, *args, **kwargs)
        traced_donor = self.donors and self._fast_state not in ("broken", "disabled")
        if traced_donor and compat.under_trace():  # called under jit, grad or vmap (0.07 µs to ask)
            return self._without_donation(*args, **kwargs)
        if self._fast_state == "unknown":  # JAXRW_DISABLE is read once, at the first call
            self._fast_state = "disabled" if disabled() else "on" if self._fast_path() else "off"
            # the arrays' placement: inside the fast path's trace a tracer does not show it
            self._split_note = signature.split_inner_axis(jax.tree_util.tree_leaves((args, kwargs)))
        if self._fast_state in ("on", "jit"):  # first: it is the path of most calls (µs count here)
            try:
                return self._fast(*args, **kwargs)
            except _BuildOutside:  # built below (hoisting, or auto timing schedules on CUDA)
                self._fast = self._new_fast()
            except JaxrwError:
                raise
            except Exception as e:  # noqa: BLE001 - a fault of the user's arguments, or of jaxrw's?
                if self._fast_nested is not None and is_nested_options_error(e):  # in an outer jit
                    return self._fast_nested(*args, **kwargs)
                return self._fast_failed(e, args, kwargs)
        if self._fast_state in ("broken", "disabled"):
            return self._jitted(*args, **kwargs)
        if jax.config.jax_disable_jit:  # jax.disable_jit(): run eagerly, as jax.jit's function does
            return self.fn(*args, **kwargs)
        if self._hot_path is not None and not getattr(type(self), "_checked_hot", False):  # hoisting
            try:
                out = self._hot_path(self, args, kwargs)
            except NotHot:
                self._set_hot_path(None, off=True)
            else:
                if out is not MISS:
                    return out
        dyn, statics = self._split(args, kwargs)
        leaves, in_tree = jax.tree_util.tree_flatten(dyn)
        known = self._hot.get((in_tree, statics)) if self._hot else None
        if known is not None:  # hoisting, this structure seen before: are the slow arrays cached?
            keyed = lambda: (in_tree, leaf_keys(leaves, dyn, self.static_argnums), statics)  # noqa: E731
            out = hoist.structure_hit(self, known, leaves, keyed, args, kwargs)
            if out is not MISS:
                return out
        key = (in_tree, leaf_keys(leaves, dyn, self.static_argnums), statics)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(key, "first", args, kwargs, dyn, statics, leaves, in_tree)
        if self._fast_state == "on" and self._all_original():
            self._enter_jit()
            try:
                return self._fast(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - as the fast path's failures (leaves state "jit")
                return self._fast_failed(e, args, kwargs)
        python = self._fast_state == "on" and hoist.needs_python(entry, self._fast_mode)
        if python and not self._adopt_mode(entry):
            self._fast_state = "off"  # its program runs through entry.call, not inlined
        if entry.fallback is not None or entry.handed_off:
            return self._jitted(*args, **kwargs)
        if entry.schedule != "xla" and entry.fn is not None and compat.traced(leaves):
            # under an outer jit/grad/vmap the program is traced into the caller's; a schedule
            # applies to top-level calls only (XLA's concurrent mode cannot be nested in a jit)
            return jax.tree_util.tree_unflatten(entry.out_tree, entry.fn(*leaves))
        hoisted = isinstance(entry.call, HoistedCall)
        if entry.proven:
            out = hoist.run_proven(self, entry, key, args, kwargs, leaves) if hoisted else entry.call(*leaves)
            if out is hoist.DIRECT:
                return hoist.run_direct(self, entry, args, kwargs)
        else:  # the first call compiles the built program: a failure there falls back too
            try:
                first = first_call(self, entry, key, args, kwargs, leaves) if hoisted else MISS
                out = entry.call(*leaves) if first is MISS else None
            except Exception as e:  # noqa: BLE001 - never break the user's program
                return self._first_call_failed(entry, e, args, kwargs)
            entry.proven = True
            if first is not MISS:  # through the quick path, which is set up
                return first
        if hoisted and not self.verify and entry.call.values is not None:
            install_hot(self, entry, key, args, kwargs, leaves)
        result = jax.tree_util.tree_unflatten(entry.out_tree, out)
        if self.verify and not compat.traced(leaves):
            want = entry.expected(self._jitted, args, kwargs, leaves)
            how = (self._jitted, (self.static_argnums, self.static_argnames), args, kwargs, key[0], leaves)
            with hoist.stepped_out(self._lock):  # the scales' first use compiles a program
                check_outputs(result, want, fn_name(self.fn), self.numerics, lambda: entry.error_scales(*how))
        return result

    def python_path_only(self) -> Optimized:
        """Send every call through the Python call path (the one hoisting, verify and scheduled
        programs take) instead of jax's C++ dispatch: for measuring what that path costs."""
        self._leave_jit()
        self._fast_state = "off"
        return self

    def _fast_path(self) -> bool:
        """Whether signatures' programs can be plain functions inlined into one jax.jit
        (`_inline`): then calls take jax's C++ dispatch with no Python of jaxrw's on the way.
        Verification needs Python on every call; autotune measures when a signature is built,
        which cannot happen inside a trace. With hoisting or schedule="auto", the fast path holds
        until a signature's program turns out to need the Python path (`hoist.needs_python`)."""
        return not (self.verify or self.autotune or self._keep) and self.schedule != "streams"

    def _build_outside(self) -> bool:
        """Whether new signatures are built outside jax.jit's trace of `_inline`: a hoisted
        program runs its prologue on the call path, and schedule="auto" on a CUDA device times
        candidate schedules when a signature is built."""
        from .schedule import cuda_available

        hoisting = self.hoist_argnums or self.hoist_argnames
        return bool(hoisting) or (self.schedule == "auto" and cuda_available())

    def _inline(self, /, *args: Any, **kwargs: Any) -> Any:
        """Traced by `self._fast` (a jax.jit): this signature's program inlined into jit's trace."""
        dyn, statics = self._split(args, kwargs)
        leaves, in_tree = jax.tree_util.tree_flatten(dyn)
        key = (in_tree, leaf_keys(leaves, dyn, self.static_argnums), statics)
        entry = self._cache.get(key)
        if self._fast_state == "jit":  # this jit is the class's __call__: the user's function here
            if entry is None and not self._build_outside():
                entry = self._build(key, "set", args, kwargs, dyn, statics, leaves, in_tree)
            if entry is None:
                self._unbuilt.add(key)  # no state "jit" again before it is built (`_all_original`)
            if entry is None or not as_written(entry):
                self._leave_jit()  # its program runs from its next call, through __call__
            return self.fn(*args, **kwargs)
        python = entry is not None and hoist.needs_python(entry, self._fast_mode)
        if python or (entry is None and self._build_outside()):
            raise _BuildOutside()  # __call__ takes its own path (and builds there)
        if entry is None:
            entry = self._build(key, "set", args, kwargs, dyn, statics, leaves, in_tree)
        if self._all_original():  # state "jit" (`_enter_jit`), entered in __call__
            raise _BuildOutside()
        if entry.fallback is not None or entry.fn is None or entry.handed_off:
            return self.fn(*args, **kwargs)
        return jax.tree_util.tree_unflatten(entry.out_tree, entry.fn(*leaves))

    def _all_original(self) -> bool:
        """Whether every signature met runs the user's function unchanged (`as_written`): all those
        built, and none met in state "jit" left to build at its next call (else two signatures
        called in turn would leave and enter that state, a compilation each, on every call)."""
        self._unbuilt.difference_update(self._cache)
        return bool(self._cache) and not self._unbuilt and all(map(as_written, self._cache.values()))

    def _enter_jit(self) -> None:
        """State "jit": every signature runs the user's function as written, so the instance's class
        (its own) takes a new `_fast` as `__call__`: jax's C++ dispatch, no Python frame of jaxrw's
        (1-7 µs a call on the H200 host). `_inline` sends unknown signatures back (`_leave_jit`)."""
        self._fast_mode, self._fast_state = "xla", "jit"
        self._fast = self._new_fast()
        slot = {"__call__": staticmethod(self._fast), "_call_class": True}
        self.__class__ = type("Optimized", (Optimized,), slot)

    def _leave_jit(self) -> None:
        """Back from state "jit" to `Optimized.__call__` (state "on"), with a new `_fast`: the one
        that served as `__call__` traced the user's function for a signature not yet built."""
        if self._fast_state == "jit":
            self.__class__ = Optimized
            self._fast_state = "on"
            self._fast = self._new_fast()

    def _set_hot_path(self, hot: HotPath | None, off: bool | None = None) -> None:
        """The hoisted signature's quick path from now on (None: none), and the instance's class: one
        whose `__call__` is that path's check where it has one (`HotPath.call_class`), else ours."""
        self._hot_path = hot
        if off is not None:
            self._hot_path_off = off
        if self._fast_state != "jit":  # that state's class is its own (`_enter_jit`)
            cls = hot.call_class(Optimized) if hot is not None and self._fast_state == "off" else None
            self.__class__ = cls or Optimized

    def _adopt_mode(self, entry: Entry) -> bool:
        """Whether the fast path's jit now runs `entry`'s program under its XLA mode (recompiled
        for it): only when it is the only signature and needs no Python of its own."""
        ok = len(self._cache) == 1 and entry.schedule in ("xla", *XLA_MODES)
        if not ok or hoist.needs_python(entry, entry.schedule):
            return False
        if entry.schedule != self._fast_mode:
            self._fast_mode = entry.schedule
            self._fast = self._new_fast()
        return True

    def _is_disabled(self) -> bool:
        """Whether JAXRW_DISABLE makes this a plain jax.jit: as read at the first call, or now if none yet."""
        return disabled() if self._fast_state == "unknown" else self._fast_state == "disabled"

    def report(self, /, *args: Any, **kwargs: Any) -> RewriteReport:
        """The rewrite report of the signature these arguments have (traced if new); after a
        fallback, `report.fallback` says why jax.jit runs it. Arguments may be
        jax.ShapeDtypeStructs, as for `lower`: nothing is allocated or run."""
        entry = self._entry_for_shapes(args, kwargs) if signature.abstract(args, kwargs) else None
        leaves = None
        if entry is None:
            entry, _, leaves = self._entry_for(args, kwargs)
        if self._fast_state == "broken":  # built since: its calls run jax.jit as well
            entry.fall_back("an earlier call's rewritten program failed: jax.jit runs every call")
        report = entry.report
        if leaves is not None and isinstance(entry.call, HoistedCall) and not entry.handed_off:
            with self._lock:  # the kept values of every signature are read
                not_kept = entry.call.refused_for(leaves)
            report = dataclasses.replace(report, not_kept=not_kept) if not_kept else report
        if self._is_disabled():
            return dataclasses.replace(
                report, schedule="jax.jit: JAXRW_DISABLE is set (this is what jaxrw would run)"
            )
        return report

    def _entry_for(self, args: tuple, kwargs: dict, keep: bool = True) -> tuple[Entry, tuple, list]:
        """(this signature's entry, built if new and kept unless `keep` is False; its cache key;
        the flat argument leaves)."""
        dyn, statics = self._split(args, kwargs)
        leaves, in_tree = jax.tree_util.tree_flatten(dyn)
        key = (in_tree, leaf_keys(leaves, dyn, self.static_argnums), statics)
        with self._lock:
            if key in self._cache:
                return self._cache[key], key, leaves
            entry = self._build(key, "first" if keep else None, args, kwargs, dyn, statics, leaves, in_tree)
        return entry, key, leaves

    def clear_cache(self) -> None:
        """Forget every signature's program and hoisted values (as jax.jit's clear_cache): the next
        call traces, rewrites and compiles again."""
        with self._lock:
            self._cache.clear()
            self._undonated = None
            self._unbuilt.clear()
            self._hot.clear()
            self._prologues.clear()  # merged weights go now, not when the arrays die
            self._set_hot_path(None, off=False)
            self._fast_mode = "xla"  # a rebuilt signature picks its schedule again
            if self._fast_state == "jit":
                self._leave_jit()  # every signature is built again, through the fast path (a new `_fast`)
            else:
                self._fast = self._new_fast()

    # -- internals --------------------------------------------------------------------------
    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
        """(dynamic args and kwargs, hashable static values and the config that changes a trace)."""
        return signature.split_statics(args, kwargs, self.static_argnums, self.static_argnames)

    def _flat_fn(self, args: tuple, kwargs: dict, in_tree: Any) -> Callable:
        statics = (self.static_argnums, self.static_argnames)
        flat = signature.flat_function(self.fn, *statics, args, kwargs, in_tree)
        return compat.traced_as(flat, self.fn, args, kwargs, statics, in_tree.num_leaves)

    def _build(self, key: tuple, keep: str | None, *how: Any) -> Entry:
        """This signature's entry, kept in the cache (`keep` "set"; "first": another thread's where
        one was kept meanwhile; None: not kept). jaxrw's warnings come after (logs.warnings_held)."""
        with warnings_held():
            with hoist.stepped_out(self._lock):  # a trace of the user's code may wait on another thread's
                entry = self._traced_and_rewritten(*how)
            if keep == "first":
                entry = self._cache.setdefault(key, entry)
            elif keep == "set":
                self._cache[key] = entry
        return entry

    def _traced_and_rewritten(self, args, kwargs, dyn, statics, leaves, in_tree) -> Entry:
        self.traces += 1
        flat = self._flat_fn(args, kwargs, in_tree)
        wide = signature.wider_than_config(leaves)  # a ShapeDtypeStruct of them is narrowed: float32
        specs = leaves if wide else [spec(x) for x in leaves]
        t0 = time.perf_counter()
        closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*specs)
        took_ms = (time.perf_counter() - t0) * 1e3
        log.debug("trace %s #%d: %d inputs in %.1f ms", fn_name(self.fn), self.traces, len(specs), took_ms)
        out_tree = jax.tree_util.tree_structure(out_shape)
        if wide:
            err = UnsupportedProgramError(f"{wide} arrays while jax_enable_x64 is off")
            why = self._fall_back(err, err)
            return Entry(self._jitted, out_tree, RewriteReport.failed(closed, why), fallback=why)
        try:
            profile = self.profile if isinstance(self.profile, Profile) else None
            if profile is None:
                profile = get_profile(self.profile) if self.profile else default_profile(compat.device_kind())
            owners = leaf_owners(in_tree, kwargs, self.static_argnums, self.static_argnames)
            slow = slow_leaves(self, owners, leaves)
            tune = self.autotune and not compat.traced(leaves) and not closed.effects  # it would run them
            self._split_note = self._split_note or signature.split_inner_axis(leaves)
            result = rewrite_jaxpr(
                closed,
                rules=self.rules,
                cost_model=self.cost_model,
                profile=profile,
                extractor=self.extractor,
                limits=self.limits,
                numerics=self.numerics,
                force=tune,  # autotune measures instead of trusting the guard's prediction
                slow=slow,
                max_hoist_bytes=self.max_hoist_bytes,
                sharded=self._split_note,
            )
            if result.report.hoist_note and slow and not self._keep:
                warn_user(f"jaxrw: {fn_name(self.fn)}: {result.report.hoist_note}")
            if tune and result.program is not None:  # not encoded (size limit): nothing to tune
                from .rewrite.autotune import apply_autotune, options_key
                from .schedule.timing import device_inputs  # not zeros (DESIGN.md)

                key = options_key(self, sorted(slow), profile)
                inputs = device_inputs(leaves)
                apply_autotune(result, closed, flat, inputs, self.autotune_k, key, self.max_hoist_bytes)
            if result.fn is not None:
                check_decoded(result.fn, specs, closed)
                signature.name_programs(result, self.fn)
        except Exception as e:  # noqa: BLE001 - never break the user's program
            why = self._fall_back(e if isinstance(e, JaxrwError) else RewriteStageError("optimize", e), e)
            kept = (closed, None, None) if self._keep else None
            return Entry(self._jitted, out_tree, RewriteReport.failed(closed, why), fallback=why, trace=kept)
        report = result.report
        log.debug("jaxrw %s: %r", fn_name(self.fn), report)
        kept = (closed, result, profile) if self._keep else None
        # under verify, the reference run after the program is the one that donates
        donated = tuple(i for i, o in enumerate(owners) if o in self.donors)
        donate = () if self.verify else donated
        hoisted = getattr(result.fn, "hoisted", None)
        from .schedule import ScheduleUnavailableError, choice

        t_schedule = time.perf_counter()  # auto's timing of candidate schedules: a phase of its own
        mode = "xla" if closed.effects and self.schedule == "auto" else self.schedule  # timing would call
        if hoisted is not None:  # the main program stays a plain jit behind the identity check
            report.hoisted_sets = hoisted.fit(self.max_hoist_bytes)  # autotune's winner decoded again
            mode, why = choice.for_hoisted(self.schedule, hoisted, leaves, self.schedule_memory_slack)
            call = HoistedCall(hoisted, donate, mode, self._prologues, leaves)
            report.schedule = f"{mode}: {why}"
            report.phase_s["schedule"] = time.perf_counter() - t_schedule
        else:
            original = compat.named_as(lambda *xs: jax.tree_util.tree_leaves(flat(*xs)), self.fn)
            fn = result.fn if result.fn is not None else original
            try:
                if report.rewritten and not tune:  # autotune measured already
                    fn = choice.confirm_rewrite(mode, fn, original, leaves, report, fn_name(self.fn))
                as_written = not report.rewritten  # kept: a schedule must beat timing.kept_terms
                chosen, why = choice.for_program(
                    mode, fn, specs, leaves, donate, profile, self.schedule_memory_slack, as_written
                )
                why = why if mode == self.schedule else "it makes jax.debug calls (auto times none such)"
            except ScheduleUnavailableError:
                raise  # schedule="streams" asked for where it cannot run: an invalid option here
            except Exception as e:  # noqa: BLE001 - never break the user's program
                err = e if isinstance(e, RewriteStageError) else RewriteStageError("schedule", e)
                return Entry(self._jitted, out_tree, report).fall_back(self._fall_back(err, e))
            report.schedule = f"{chosen.choice}: {why or chosen.reason}"
            report.phase_s["schedule"] = time.perf_counter() - t_schedule
            reference = result.reference and jax.jit(result.reference, donate_argnums=donated)
            kw = dict(trace=kept, fn=fn, schedule=chosen.choice, reference=reference)
            return Entry(chosen.fn, out_tree, report, **kw)
        return Entry(call, out_tree, report, trace=kept)


def optimize(
    fn: Callable | None = None,
    *,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    rules: str | Sequence[str] | None = None,
    cost_model: str | CostModel = "roofline",
    extractor: str = "greedy",
    profile: Profile | str | None = None,
    verify: bool = False,
    strict: bool = False,
    limits: Limits | dict | None = None,
    numerics: str = "default",
    schedule: str = "auto",
    schedule_memory_slack: float = 0.0,
    autotune: bool = False,
    autotune_k: int = 4,
    hoist_argnums: int | Sequence[int] | None = None,
    hoist_argnames: str | Sequence[str] | None = None,
    max_hoist_bytes: int = DEFAULT_MAX_HOIST_BYTES,
    **unknown: Any,  # refused, naming the options there are (jax.jit's others among them)
) -> Any:
    """Rewrite `fn` into a faster equivalent program and compile it, like `jax.jit`.

    Usable as `@optimize` or `@optimize(...)`. `rules` names rules or families (default: all).
    `numerics` (docs/numerics.md): "strict" uses only rules exact in floating point (results
    bit-identical to jax.jit, up to how XLA compiles the rebuilt program around what changed: the
    order it sums a dot in, a repeated divisor computed once); "default"
    also reassociates and factors: each result stays within n*u/(1 - n*u) * |f|(|x|) of the exact
    value, the bound of evaluating the same sums and products in any order (n the roundings on a
    path, u the dtype's unit roundoff), and a result is finite where jax.jit's is (inexact rules
    leave values that reach a saturating function, tanh, exp, max or a comparison, as written;
    a NaN may become an Inf); "fast" adds identities
    that hold for finite values only (A@0 -> 0, I@A -> A, log(exp(a)) -> a). Limits cap the
    e-graph (iterations, nodes, time) and the program size (`equations`). `verify=True` checks
    every concrete call against jax.jit (docs/numerics.md: the tolerance); `strict=True` raises a
    JaxrwError instead of falling back; `autotune=True` times the original and the model's
    `autotune_k` best programs on this device at the first call of each signature and keeps the
    fastest (cached on disk). `profile`: the
    device rates the cost model prices with: a `Profile`, "h200", "cpu" or a saved profile's .json
    path (`jaxrw calibrate --output`); by default the one `jaxrw calibrate` saved for this device
    kind, else the built-in one. `static_argnums`, `static_argnames`, `donate_argnums` and
    `donate_argnames` are jax.jit's, as are `.lower()`, `.trace()` and `.eval_shape()`. While every
    signature keeps the original program, calls go straight to a jax.jit of `fn` (no Python).
    `hoist_argnums`/`hoist_argnames` name slowly-changing arguments (parameters): work that
    depends only on them (concatenated or transposed weights, products of weights) runs once per
    new set of arrays and is reused while the caller passes the same arrays, up to `max_hoist_bytes`
    of values kept at once (all signatures); arrays new on every call run jax.jit's program, and
    after 16 such calls in a row the signature stays with it (`clear_cache()` hoists again).
    `schedule`: "xla" (XLA's own), "streams" (thunky streams; CUDA, jax >= 0.12) or "auto": on a
    CUDA device, times thunky and XLA's command-buffer modes against XLA's default when a signature
    is built and keeps one measured faster, with a peak memory at most `schedule_memory_slack` (a
    fraction, default 0) plus 1 MiB above XLA's.
    """
    opts = checked_options(**{k: v for k, v in locals().items() if k != "fn"})  # every option above
    return (lambda f: _built(f, opts)) if fn is None else _built(fn, opts)


def _built(fn: Any, opts: dict[str, Any]) -> Optimized:
    """`optimize`'s instance; a hoisted argument also donated is said here (explain copies it)."""
    if not callable(fn):
        raise InvalidOptionError(f"optimize expects a callable; got {type(fn).__name__}")
    opt = Optimized(fn, **opts)
    if opt.donated_hoisted:  # a donated buffer is consumed by the call: nothing to cache
        warn_user(f"jaxrw: {fn_name(fn)}: {list(opt.donated_hoisted)!r} are donated, so not hoisted")
    return opt

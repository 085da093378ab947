"""The methods an optimized function has besides its call: jax.jit's stages (`lower`, `trace`,
`eval_shape`) of the program jaxrw runs, and jaxrw's own views of it (`bind`, `explain`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from . import signature
from .errors import JaxrwError


class Stages:
    """Mixed into `Optimized`: each stage is jax.jit's, taken of the optimized function itself, so
    a lowering holds jaxrw's rewritten program (inlined, as under an outer jit) with the options
    jax.jit would be given (static and donated arguments)."""

    def _staged(self) -> Any:
        """A fresh jax.jit around this function: jax caches traces per function object, so a new
        one after `clear_cache()` stages the program built again, not an earlier one."""
        opt: Any = self

        @functools.wraps(opt.fn)  # the signature, for static and donated argument names
        def staged(*args: Any, **kwargs: Any) -> Any:
            return opt._program_in_trace(args, kwargs)

        return jax.jit(staged, **opt._jit_options())

    def _program_in_trace(self, args: tuple, kwargs: dict) -> Any:
        """What a call of this signature runs, traced into the caller's program: its rewritten
        program, built here if new (and kept for later calls, unless auto times schedules on the
        device or arguments are hoisted: those builds need arrays). Not a call: in state "jit" a
        call traces the function as written for a signature met there, and runs the rewrite
        only from its next call."""
        opt: Any = self
        if opt._is_disabled() or opt._fast_state == "broken":
            return opt.fn(*args, **kwargs)
        # a signature auto would time on the device, or hoist, is built again at its first call
        entry, _key, leaves = opt._entry_for(args, kwargs, keep=not opt._build_outside())
        if entry.fallback is not None or entry.handed_off:
            return opt.fn(*args, **kwargs)
        program = entry.fn if entry.fn is not None else entry.call  # a hoisted call traces through
        try:
            return jax.tree_util.tree_unflatten(entry.out_tree, program(*leaves))
        except JaxrwError:
            raise
        except Exception as e:  # noqa: BLE001 - never break the user's program: jax.jit's, or strict
            return opt._first_call_failed(entry, e, args, kwargs)

    def _entry_for_shapes(self, args: tuple, kwargs: dict) -> Any:
        """The entry of a signature given as jax.ShapeDtypeStructs, built under a trace (as a
        `lower` builds it: kept for later calls, unless a call would build it with arrays, to
        hoist, time schedules or autotune). A tracer does not show a split placement: the
        structs' own shardings are read first (`signature.split_inner_axis`)."""
        opt: Any = self
        built: list[Any] = []
        keep = opt._keep or not (opt._build_outside() or opt.autotune)
        opt._split_note = opt._split_note or signature.split_inner_axis(
            jax.tree_util.tree_leaves((args, kwargs))
        )

        def probe(*values: Any, **kw: Any) -> None:
            built.append(opt._entry_for(values, kw, keep=keep)[0])

        signature.with_shapes_traced(probe, args, kwargs)
        return built[0]

    def lower(self, /, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(fn).lower(...)` of the program jaxrw runs for these arguments (a thunky
        schedule runs outside XLA, so its signatures lower to the rewritten program alone)."""
        return self._staged().lower(*args, **kwargs)

    def trace(self, /, *args: Any, **kwargs: Any) -> Any:
        """`jax.jit(fn).trace(...)`: the traced program jaxrw runs (`.jaxpr`, `.lower()`)."""
        return self._staged().trace(*args, **kwargs)

    def eval_shape(self, /, *args: Any, **kwargs: Any) -> Any:
        """The output shapes and dtypes, as `jax.jit(fn).eval_shape(...)`, without running it."""
        return self._staged().eval_shape(*args, **kwargs)

    def bind(self, /, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Fix the hoisted arguments to these arrays: returns a function of the other arguments
        whose calls go through jax's C++ dispatch with the hoisted work done once (jaxrw.hoist).
        Pass every argument once, as for a call (`bind(params, x)`): the others give the signature
        the returned function is built for."""
        from .hoist import bind

        with self._lock:  # type: ignore[attr-defined]  # Optimized's: it runs the prologue once
            return bind(self, args, kwargs)

    def explain(self, /, *args: Any, **kwargs: Any) -> Any:
        """`jaxrw.explain` of this function for these arguments (`measure=True` also times it)."""
        from .explain import explain

        return explain(self, *args, **kwargs)

    def __copy__(self) -> Any:
        """A new optimized function of the same function and options, with no signatures yet (as
        `copy.copy` of a jax.jit gives a new jitted function): the copy builds its own programs and
        keeps its own hoisted values, instead of sharing a lock and caches with this one."""
        return dataclasses.replace(self, traces=0, _cache={})  # type: ignore[type-var]

    def _options(self) -> dict[str, Any]:
        """The function and options it was made with, with no signatures: a copy's."""
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}  # type: ignore[arg-type]
        return {**options, "traces": 0, "_cache": {}}

    def __deepcopy__(self, memo: dict) -> Any:
        """As `__copy__`, of a deep copy of the function (a bound method's object, a module's
        attributes), where `copy.deepcopy` failed on the thread lock (a new user's try). The copy
        is in `memo` before the function is copied, so an object that holds this function holds
        the copy in the copied object."""
        options = self._options()
        dup = object.__new__(type(self))
        memo[id(self)] = dup
        type(self).__init__(dup, **{**options, "fn": copy.deepcopy(self.fn, memo)})  # type: ignore[attr-defined]
        return dup

    def __reduce__(self) -> tuple:
        """Pickled as its function and options, as a jax.jit is (cloudpickle for Ray, dask or
        loky workers failed on the thread lock and the e-graphs): the unpickled one builds its own
        programs."""
        return _unpickled, (self._options(),)


def _unpickled(options: dict[str, Any]) -> Any:
    """An optimized function from `Stages.__reduce__`'s options."""
    from .api import Optimized

    return Optimized(**options)

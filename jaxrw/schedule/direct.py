"""Call a thunky program's executable without jax's per-call Python dispatch.

A `thunky.jit` program lowers to a custom call with a side effect, and jax sends every call of an
executable with effects down its Python path (`jax._src.pjit`: no C++ fast path for effects). That
path costs host time per argument: measured on the H200 host, 11-12 µs per argument of the outer
jit (192 inputs: 2.37 ms against 0.16 ms for the same work on one packed input;
bench/results/h200-2026-12-04f6-thunky-cost.json), and 12 µs here for any executable with an
unordered effect. Running the compiled executable directly costs ~0.3 µs per argument.

This uses jax internals (`Compiled._executable.unsafe_call`, `execute_sharded`), checked when the
executor is built: where they differ, or for arguments it cannot pass as they are (not jax arrays of
the compiled shape, dtype and device), the caller's jitted function runs instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import compat

log = logging.getLogger("jaxrw")

__all__ = ["DirectExecutor", "ThunkyProgram", "direct_executor"]


class DirectExecutor:
    """The compiled executable of a jitted function for one argument signature, called directly.

    `__call__` returns the function's outputs (its output pytree), or `None` when the arguments
    are not live jax arrays matching the compiled ones, for the caller to use the jitted function.
    The last `trusted` arguments are not checked: the caller's own (ThunkyProgram's bound
    constants, experts_equal has 64), checked once when the executor was built."""

    def __init__(
        self, compiled: Any, run: Any, avals: Sequence[Any], sharding: Any, array_type: type, trusted: int = 0
    ):
        self._array_type = array_type  # jax's concrete array class: tracers and numpy are not it
        self._execute = run.xla_executable.execute_sharded
        self._with_tokens = bool(run.has_unordered_effects or run.has_host_callbacks)
        self._handlers = run.out_handler.handlers
        # jax >= 0.12.1 passes a function's closed-over arrays as hidden leading arguments; they are
        # put on the device once here, as jax's own Compiled does (kept_var_idx counts them first)
        consts = compiled._params.const_args
        self._consts = list(compiled._executable.shard_const_args(consts)) if consts else []
        hidden = len(self._consts)
        self._kept = [i - hidden for i in sorted(run.kept_var_idx) if i >= hidden]
        self._all_kept = self._kept == list(range(len(avals)))
        self._signature = tuple((a.shape, a.dtype) for a in avals)
        self._checked = self._signature[: len(avals) - trusted]
        self._sharding = sharding
        self._out_tree = compiled.out_tree

    def __call__(self, *args: Any) -> Any | None:
        if len(args) != len(self._signature):
            return None
        array_type = self._array_type
        for a, (shape, dtype) in zip(args, self._checked, strict=False):  # the trusted tail is left out
            if (
                type(a) is not array_type
                or a.shape != shape
                or a.dtype != dtype
                or a.sharding != self._sharding
                or a.is_deleted()  # jax.jit says so in its own words
            ):
                return None
        bufs = list(args) if self._all_kept else [args[i] for i in self._kept]
        if self._consts:
            bufs[:0] = self._consts
        if self._with_tokens:
            results = self._execute(bufs, with_tokens=True)
            results.consume_token()  # nothing waits on it: outputs are waited for themselves
        else:
            results = self._execute(bufs)
        outs = results.consume_with_handlers(self._handlers)
        return jax.tree_util.tree_unflatten(self._out_tree, outs)


def direct_executor(
    jitted: Callable, args: Sequence[Any], trusted: int = 0
) -> tuple[DirectExecutor | None, str | None]:
    """(a DirectExecutor for `jitted` at the signature of `args`, None), or (None, why not) where
    the executable is not one it can call: several devices, ordered effects, state passed in or
    out, arguments that are not jax arrays on the executable's
    device, jax's NaN/Inf checks on, or jax internals other than those of jax 0.12. `trusted`: as
    in DirectExecutor. Its runs are not among those `jax.effects_barrier()` waits for; their
    outputs are waited for as any array's."""
    try:
        from jax._src.array import ArrayImpl
        from jax._src.interpreters import pxla

        if jax.config.jax_debug_nans or jax.config.jax_debug_infs:  # jax checks outputs then
            return None, "jax's NaN/Inf checks are on"
        leaves = jax.tree_util.tree_leaves(args)
        if len(leaves) != len(args) or not all(type(a) is ArrayImpl for a in leaves):
            return None, "arguments other than jax arrays"
        compiled = jitted.lower(*args).compile()  # type: ignore[attr-defined]
        run = compiled._executable.unsafe_call
        refused = [
            (not isinstance(run, pxla.ExecuteReplicated), f"an executable of {type(run).__name__}"),
            (bool(getattr(run, "ordered_effects", None)), "ordered effects"),
            (getattr(run, "mut", None) is not None, "state passed in or out"),
            (len(run._local_devices) != 1, f"{len(run._local_devices)} devices"),
        ]
        why = [text for bad, text in refused if bad]
        if why:
            return None, why[0]
        sharding = compat.single_device_sharding(run._local_devices[0])
        if any(a.sharding != sharding for a in args):  # the trusted ones are never checked again
            return None, "arguments on another device than the executable's"
        executor = DirectExecutor(compiled, run, [jax.typeof(a) for a in args], sharding, ArrayImpl, trusted)
        return executor, None
    except Exception as e:  # noqa: BLE001 - internals differ: the jitted function serves
        return None, f"{type(e).__name__}: {e}"


def _concrete(a: Any) -> bool:
    return isinstance(a, jax.Array) and not compat.is_tracer(a)


class ThunkyProgram:
    """An emitted plan: its jitted function, called through a DirectExecutor (direct.py) for the
    signature of its first concrete call. jax would send every call down its Python dispatch path
    (a thunky program has effects), ~12 µs of host time per argument on the H200 host. Traced
    calls, other signatures and arguments the executor cannot take go to the jitted function.
    `bound`: arrays appended to every call's arguments (the program's large constants, emit.py).
    `otherwise`: what runs a concrete call the executor cannot take, in place of the jitted function
    (auto sets XLA's program: it chose thunky as timed through the executor, and through jax's
    dispatch a thunky program ran 0.81x of jax.jit on the H200, bench/HISTORY.md fifteenth lease)."""

    def __init__(
        self,
        jitted: Callable[..., Any],
        bound: Sequence[Any] = (),
        otherwise: Callable[..., Any] | None = None,
    ):
        self.jitted = jitted
        self.bound = tuple(bound)
        self.otherwise = otherwise
        # memory_analysis() counts them as arguments; timing.memory_parts leaves them out, as it
        # leaves out a jax.jit's own constants (embedded, or hidden arguments in jax >= 0.12.1)
        self.bound_bytes = sum(int(b.nbytes) for b in self.bound)
        self.__name__ = getattr(jitted, "__name__", "jaxrw_scheduled")
        self._direct: DirectExecutor | None = None
        self._tried = False
        self.why_not_direct: str | None = None  # why its first concrete call built no executor

    def lower(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.jitted.lower(*args, *self.bound, **kwargs)  # type: ignore[attr-defined]

    def __call__(self, *user: Any) -> Any:
        args = (*user, *self.bound) if self.bound else user
        direct = self._direct
        if direct is None and not self._tried and all(_concrete(a) for a in user):  # first call only
            self._tried = True
            direct, why = direct_executor(self.jitted, args, trusted=len(self.bound))
            self._direct = direct
            if why is not None:  # each call pays jax's Python dispatch, ~12 µs per argument
                self.why_not_direct = why
                instead = "XLA's program runs instead" if self.otherwise else "it runs through jax's dispatch"
                log.info("jaxrw: %s has no direct call (%s); %s", self.__name__, why, instead)
        if direct is not None:
            out = direct(*args)
            if out is not None:
                return out
        if self.otherwise is not None and not any(map(compat.is_tracer, user)):
            return self.otherwise(*user)
        return self.jitted(*args)

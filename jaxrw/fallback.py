"""How an optimized function falls back to jax.jit: where jaxrw's program fails, or the user's
arguments are at fault (jax.jit's own error then), with one warning or, under strict, an error.
A mixin of `api.Optimized`, whose state (`_fast_state`, `_cache`, `_jitted`) it sets."""

from __future__ import annotations

from typing import Any

import jax

from .errors import JaxrwError, RewriteStageError, raised_in_a_callback
from .logs import fn_name, is_jaxrw_warning, warn_user, warnings_held
from .signature import Entry, leaf_keys

__all__ = ["FallBacks"]


class FallBacks:
    """`Optimized`'s failure paths."""

    def _fast_failed(self, e: Exception, args: tuple, kwargs: dict) -> Any:
        """The inlined program failed to trace, compile or run. If jax.jit of the function fails on
        the same arguments, they are at fault: its error propagates. Otherwise jaxrw is: fall back
        to jax.jit from now on with one warning (or raise under strict)."""
        _raise_as_is(e, any(x.reference is not None for x in self._cache.values()))
        self._leave_jit()
        self._check_arguments(args, kwargs)
        want = self._jit_call(args, kwargs)
        with warnings_held():  # said once the state is kept (logs.warnings_held)
            why = self._fall_back(RewriteStageError("compile", e), e)
            self._fast_state = "broken"
            for entry in self._cache.values():  # every signature runs jax.jit now: each report says so
                entry.fall_back(why)
        return want

    def _jit_call(self, args: tuple, kwargs: dict) -> Any:
        """jax.jit's result for a call jaxrw's program failed on; where jax.jit fails too, its error
        alone (the arguments are at fault), not chained to jaxrw's, which printed it twice."""
        try:
            return self._jitted(*args, **kwargs)
        except Exception as user_error:
            raise user_error from None

    def _fall_back(self, err: JaxrwError, cause: BaseException) -> str:
        """This signature runs jax.jit because of `err` (from `cause`): raised under strict, else
        one warning. Returns the reason, for `Entry.fall_back`."""
        if self.strict:
            raise err if err is cause else err from cause
        if not self._keep:  # explain's copy: the explanation says so itself (its calls warned once)
            warn_user(f"jaxrw: falling back to jax.jit for {fn_name(self.fn)}: {err}")
        return str(err)

    def _check_arguments(self, args: tuple, kwargs: dict) -> None:
        """Raise jaxrw's clear error for a bad static value or a leaf that is not an array."""
        dyn, _statics = self._split(args, kwargs)
        leaf_keys(jax.tree_util.tree_leaves(dyn), dyn, self.static_argnums)

    def _first_call_failed(self, entry: Entry, e: Exception, args: tuple, kwargs: dict) -> Any:
        """The built program failed on its first call. jax.jit runs the same arguments first: if it
        fails too, the arguments are at fault and its error propagates; else the fault is jaxrw's:
        fall back with one warning (compile stage), or raise under strict."""
        _raise_as_is(e, entry.reference is not None)
        want = self._jit_call(args, kwargs)
        with warnings_held():
            entry.fall_back(self._fall_back(RewriteStageError("compile", e), e))
        return want


def _raise_as_is(e: Exception, calls_split: bool) -> None:
    """Raise `e` itself, before any change of state, where it is not jaxrw's fault: a user's
    jax.debug call raised (`calls_split`: a program with its calls taken apart, rewrite/effects.py),
    or one of jaxrw's warnings was made an error by the user's filters (said after its state was
    kept: logs.warnings_held)."""
    if (calls_split and raised_in_a_callback(e)) or is_jaxrw_warning(e):
        raise e

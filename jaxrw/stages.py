"""The methods an optimized function has besides its call: jax.jit's stages (`lower`, `trace`,
`eval_shape`) of the program jaxrw runs, and jaxrw's own views of it (`bind`, `explain`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax


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
            return opt(*args, **kwargs)

        return jax.jit(staged, **opt._jit_options())

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

        return bind(self, args, kwargs)

    def explain(self, /, *args: Any, **kwargs: Any) -> Any:
        """`jaxrw.explain` of this function for these arguments (`measure=True` also times it)."""
        from .explain import explain

        return explain(self, *args, **kwargs)

"""The exceptions jaxrw raises (every one is a `JaxrwError`, so `except JaxrwError` catches all),
and the option checks whose messages name the value and what is allowed."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "JaxrwError",
    "UnsupportedProgramError",
    "RewriteStageError",
    "VerificationError",
    "InvalidOptionError",
    "InvalidArgumentError",
    "Interrupt",
]


class JaxrwError(Exception):
    """Base class of everything jaxrw raises on purpose."""


class UnsupportedProgramError(JaxrwError):
    """The program uses something jaxrw does not rewrite (effects, unknown values)."""


class RewriteStageError(JaxrwError):
    """An internal stage (encode, rewrite, extract, decode, schedule, compile) failed."""

    def __init__(self, stage: str, cause: BaseException):
        self.stage = stage
        self.cause = cause
        super().__init__(f"jaxrw {stage} stage failed: {type(cause).__name__}: {cause}")


class VerificationError(JaxrwError):
    """verify=True found the optimized result differs from jax.jit beyond the tolerance."""


class Interrupt(BaseException):  # noqa: N818 - like KeyboardInterrupt
    """A deliberate interruption (a deadline's alarm) that jaxrw's stages pass on instead of
    treating it as a failure to fall back from. Not a JaxrwError: jaxrw never raises it itself."""


class InvalidOptionError(JaxrwError, ValueError):
    """An option has a value outside its valid set; the message names both."""


class InvalidArgumentError(InvalidOptionError, TypeError):
    """A call's argument is not one jax.jit takes (a leaf that is no array): a TypeError, as
    jax.jit's is, and an InvalidOptionError; the message names where it is."""


def check_choice(option: str, value: object, valid: list | tuple | dict) -> None:
    """Raise InvalidOptionError naming `value` and the valid set when `value` is not in it."""
    try:
        known = value in valid
    except TypeError:  # unhashable (a list given for a name)
        known = False
    if not known:
        raise InvalidOptionError(f"unknown {option} {value!r}; valid: {sorted(valid)!r}")


def check_bool(option: str, v: Any) -> bool:
    """True or False (NumPy's too): a string such as "false" is truthy and would turn it on."""
    if not isinstance(v, bool | np.bool_):
        raise InvalidOptionError(f"{option} must be True or False; got {v!r}")
    return bool(v)


def check_names(option: str, v: Any) -> tuple[str, ...]:
    """A parameter name or an iterable of them as a tuple (None: empty)."""
    try:  # any iterable of names, as jax.jit takes (a set, a generator)
        names = () if v is None else (v,) if isinstance(v, str) else tuple(v)
    except TypeError:
        names = (v,)
    if not all(isinstance(n, str) for n in names):
        raise InvalidOptionError(f"{option} must be a parameter name or an iterable of names; got {v!r}")
    return names


def check_argnums(v: int | Sequence[int] | None, what: str) -> tuple[int, ...]:
    """An int or sequence of ints (NumPy's too; negative ones count from the last positional
    parameter, as jax.jit's do: `options.resolve_argnums`) as a tuple of ints (None: empty)."""
    if v is None:
        return ()
    seq = isinstance(v, Sequence) and not isinstance(v, str)
    items = tuple(v) if seq else (v,)
    try:
        if any(isinstance(i, bool) for i in items):
            raise TypeError
        return tuple(operator.index(i) for i in items)
    except TypeError:
        raise InvalidOptionError(f"{what} must be an int or a sequence of ints; got {v!r}") from None


def check_nonneg_int(option: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidOptionError(f"{option} must be a non-negative int; got {v!r}")
    return v


def check_fraction(option: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
        raise InvalidOptionError(f"{option} must be a number in [0, 1]; got {v!r}")
    return float(v)


def raised_in_a_callback(e: BaseException) -> bool:
    """Whether `e` is a host callback's own error (in a program that makes jax.debug calls: one
    that raised, as an assertion does). The program compiled and ran up to it, so the error is
    the user's, as jax.jit raises it; running jax.jit to place the fault would make every call a
    second time."""
    return type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and "Callback error" in str(e)

"""The exceptions jaxrw raises (every one is a `JaxrwError`, so `except JaxrwError` catches all),
and the option checks whose messages name the value and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
    if value not in valid:
        raise InvalidOptionError(f"unknown {option} {value!r}; valid: {sorted(valid)!r}")


def check_argnums(v: int | Sequence[int] | None, what: str) -> tuple[int, ...]:
    """A non-negative int or sequence of them as a tuple (None: empty)."""
    if v is None:
        return ()
    seq = isinstance(v, Sequence) and not isinstance(v, str)
    out = (v,) if isinstance(v, int) else tuple(v) if seq else None
    if out is None or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in out):
        raise InvalidOptionError(f"{what} must be a non-negative int or a sequence of them; got {v!r}")
    return out


def check_nonneg_int(option: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidOptionError(f"{option} must be a non-negative int; got {v!r}")
    return v


def check_fraction(option: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
        raise InvalidOptionError(f"{option} must be a number in [0, 1]; got {v!r}")
    return float(v)

"""The exceptions jaxrw raises. Every one is a `JaxrwError`, so `except JaxrwError` catches all."""

from __future__ import annotations

__all__ = [
    "JaxrwError",
    "UnsupportedProgramError",
    "RewriteStageError",
    "VerificationError",
    "InvalidOptionError",
]


class JaxrwError(Exception):
    """Base class of everything jaxrw raises on purpose."""


class UnsupportedProgramError(JaxrwError):
    """The program uses something jaxrw does not rewrite (effects, unknown values)."""


class RewriteStageError(JaxrwError):
    """An internal stage (encode, rewrite, extract, decode, schedule) failed."""

    def __init__(self, stage: str, cause: BaseException):
        self.stage = stage
        self.cause = cause
        super().__init__(f"jaxrw {stage} stage failed: {type(cause).__name__}: {cause}")


class VerificationError(JaxrwError):
    """verify=True found the optimized result differs from jax.jit beyond the tolerance."""


class InvalidOptionError(JaxrwError, ValueError):
    """An option has a value outside its valid set; the message names both."""


def check_choice(option: str, value: object, valid: list | tuple | dict) -> None:
    """Raise InvalidOptionError naming `value` and the valid set when `value` is not in it."""
    if value not in valid:
        raise InvalidOptionError(f"unknown {option} {value!r}; valid: {sorted(valid)!r}")

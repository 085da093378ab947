"""Counting the XLA compilations a piece of test code causes (jax logs each one)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import jax


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def compiled_during(fn: Callable[[], object]) -> list[str]:
    """The XLA compilations jax logs while `fn()` runs."""
    seen = _Messages()
    logger = logging.getLogger("jax")
    logger.addHandler(seen)
    try:
        with jax.log_compiles():
            fn()
    finally:
        logger.removeHandler(seen)
    return [m for m in seen.messages if m.startswith("Finished XLA compilation")]


def compiled_names(fn: Callable[[], object]) -> set[str]:
    """The names of the programs XLA compiles while `fn()` runs (`jit(f)`)."""
    return {m.split()[4] for m in compiled_during(fn)}

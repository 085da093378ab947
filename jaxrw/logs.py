"""Logging: everything jaxrw logs goes to the standard `logging` logger named "jaxrw".

Set `JAXRW_LOG=debug|info|warning` to get a stderr handler on that logger at import (phases of
each rewrite at debug level); leave it unset to configure logging yourself as usual.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any

__all__ = ["configure_logging", "LEVELS", "warn_user", "warnings_held", "is_jaxrw_warning"]

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_HANDLER_NAME = "jaxrw-env"


def configure_logging(level: str | None = None) -> logging.Logger:
    """Attach one stderr handler to the "jaxrw" logger at `level` (default: $JAXRW_LOG).
    Does nothing when neither is set; an unknown level is reported, not raised (this runs at
    import)."""
    logger = logging.getLogger("jaxrw")
    text = (level if level is not None else os.environ.get("JAXRW_LOG", "")).strip().lower()
    if not text:
        return logger
    if text not in LEVELS:
        logger.warning("JAXRW_LOG=%r is not a level; valid: %s", text, sorted(LEVELS))
        return logger
    logger.setLevel(LEVELS[text])
    if not any(h.get_name() == _HANDLER_NAME for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    return logger


def fn_name(fn: object) -> str:
    """A function's name for messages (a partial or callable object has none: its repr)."""
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))


def warn_user(message: str) -> None:
    """A UserWarning attributed to the caller's line: frames inside jaxrw and jax are skipped, so
    the warning points at the user's call whichever path (fast path, report, explain) raised it.
    Inside `warnings_held`, given when that block ends."""
    held = getattr(_held, "messages", None)
    if held is not None:
        held.append(message)
        return
    import jax

    skip = (os.path.dirname(__file__), os.path.dirname(jax.__file__))
    warnings.warn(message, UserWarning, skip_file_prefixes=skip)


_held = threading.local()


class warnings_held:  # noqa: N801 - used as a function: `with warnings_held():`
    """jaxrw's warnings (warn_user) in this thread wait until the block ends: a build and the
    state it leaves (a fallback entry cached) come first. Where the user's filters make warnings
    errors (`-W error`), a notice then cannot fail the build, and the first warning is raised
    once (any others of the block are dropped): the next call finds that state and runs quietly.
    After an exception, they are given only where they stay warnings (the exception is what the
    caller sees). A class, not a generator:
    a warning given from a generator's exit is attributed to contextlib, not the user's line."""

    def __enter__(self) -> None:
        self.nested = getattr(_held, "messages", None) is not None  # the outermost block gives them
        if not self.nested:
            _held.messages = []

    def __exit__(self, kind: Any, *_: Any) -> None:
        if self.nested:
            return
        messages, _held.messages = _held.messages, None
        for message in messages:
            try:
                warn_user(message)
            except Warning:
                if kind is None:
                    raise


def is_jaxrw_warning(e: BaseException) -> bool:
    """Whether `e` is one of jaxrw's warnings raised as an error by the user's filters."""
    return isinstance(e, UserWarning) and str(e).startswith("jaxrw:")

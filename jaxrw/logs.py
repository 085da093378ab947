"""Logging: everything jaxrw logs goes to the standard `logging` logger named "jaxrw".

Set `JAXRW_LOG=debug|info|warning` to get a stderr handler on that logger at import (phases of
each rewrite at debug level); leave it unset to configure logging yourself as usual.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["configure_logging", "LEVELS", "warn_user"]

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
    the warning points at the user's call whichever path (fast path, report, explain) raised it."""
    import jax

    skip = (os.path.dirname(__file__), os.path.dirname(jax.__file__))
    warnings.warn(message, UserWarning, skip_file_prefixes=skip)

"""E-graphs lent to rewrites from templates that already hold what every program needs.

A fresh e-graph per signature re-declared the term language, the non-finite facts and the shape
analysis (~140 ms on this 2-core host, about half of a small program's first call): egglog
translates and compiles each rule per e-graph. A template holds them once per process; a rewrite
works on it inside egglog's `push`, and `pop` takes the program away again when it is done.

Rewrites nest (a control-flow body is rewritten while its loop's program is being encoded; a
rerun with exact rules only starts before the first run has returned), and one e-graph can
only be pushed for one program at a time, so each depth of nesting has its own template.
Rewrites run one at a time (run.py's lock), so the depth is the process's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from egglog import EGraph

from . import nonfinite
from .primitives import BINARY, UNARY
from .terms import analysis, new_egraph

log = logging.getLogger("jaxrw")

_templates: list[EGraph | None] = []  # by depth of nesting
_lent: list[EGraph] = []  # the e-graphs pushed now, innermost last


def program_egraph() -> EGraph:
    """A fresh e-graph for one program: the term language, the non-finite facts, and the shape
    analysis declared (run once on nothing, so its rules are compiled here)."""
    eg = new_egraph()
    eg.register(*nonfinite.facts(UNARY, BINARY))
    eg.run(analysis.saturate())
    return eg


@contextlib.contextmanager
def lent() -> Iterator[None]:
    """Within: `current()` is an e-graph holding only a template's contents, for one program;
    whatever was added to it is gone afterwards. A template that fails to restore is dropped
    (the next rewrite at its depth makes a new one)."""
    depth = len(_lent)
    if depth == len(_templates):
        _templates.append(None)
    eg = _templates[depth]
    if eg is None:
        eg = _templates[depth] = program_egraph()
    eg.push()
    _lent.append(eg)
    try:
        yield
    finally:
        _lent.pop()
        try:
            eg.pop()
        except Exception as e:  # noqa: BLE001 - a template is only a cache: make another
            log.debug("jaxrw: e-graph template at depth %d dropped: %s", depth, e)
            _templates[depth] = None


def current() -> EGraph | None:
    """The e-graph lent to the innermost rewrite in progress, if any."""
    return _lent[-1] if _lent else None

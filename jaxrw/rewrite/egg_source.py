"""egglog source text for the terms of terms.py, parsed and run by egglog in one batch.

Building each term through egglog-python's expression layer costs about 1 ms per equation (type
inference, declaration bookkeeping, conversion to Rust commands), which made encoding the largest
part of optimizing a long program. The encoder instead writes the same terms as egglog commands
and hands the whole program to egglog's own parser. The constructor names come from egglog-python
(`callable_ref_to_egg`, which also declares them in the e-graph), so rules registered later through
the Python API see the same functions. Only numbers and names of a checked alphabet are
written: nothing from the program is spliced in unchecked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from egglog import EGraph
from egglog.egraph import resolve_callable

from ..errors import UnsupportedProgramError

__all__ = ["EggSource", "Sym", "Str", "Vec", "atom", "ivec", "ref_of"]

# names written as egglog string literals (dtype and primitive names, e.g. "key<fry>"): printable
# ASCII without the quote and the backslash, so nothing needs escaping
_SAFE_STRING = re.compile(r"[ !#-\[\]-~]*")


class Sym(str):
    """Text already in egglog syntax (a term, a let name); written as it is."""


class EggSource:
    """Commands for one e-graph, collected in order and run in one batch by `flush`."""

    def __init__(self, egraph: EGraph):
        self.egraph = egraph
        self.lines: list[str] = []
        self._names: dict[int, tuple[str, Any]] = {}
        self.refs: set[Any] = set()  # egglog references of the callables written (see reach.py)

    def name(self, fn: Callable[..., Any]) -> str:
        """The egglog name of a constructor or function of terms.py, declared in this e-graph."""
        cached = self._names.get(id(fn))  # by id: egglog callables hash slowly (~1 µs)
        if cached is None:
            ref, decls = resolve_callable(fn)
            self.refs.add(ref)
            self.egraph._add_decls(decls)
            name, reversed_args = self.egraph._state.callable_ref_to_egg(ref)
            if reversed_args:  # pragma: no cover - only egglog's builtin operators reverse
                raise UnsupportedProgramError(f"egglog callable {name!r} takes reversed arguments")
            cached = self._names[id(fn)] = (name, fn)  # fn kept alive: its id stays its own
        return cached[0]

    def call(self, fn: Callable[..., Any], *args: Any) -> Sym:
        """The term `fn(*args)` as text."""
        return Sym(f"({self.name(fn)} {' '.join(atom(a) for a in args)})" if args else f"({self.name(fn)})")

    def let(self, name: str, term: Sym) -> Sym:
        """Bind `term` to a global name; return the name (terms built on it stay small)."""
        self.lines.append(f"(let {name} {term})")
        return Sym(name)

    def set(self, fn: Callable[..., Any], *args: Any, to: Any) -> None:
        """`(set (fn args) to)`: the value of a function of terms."""
        self.lines.append(f"(set {self.call(fn, *args)} {atom(to)})")

    def add(self, term: Sym) -> None:
        """Add a term, or a fact of a relation, to the e-graph."""
        self.lines.append(term)

    def flush(self) -> None:
        """Parse and run everything collected so far."""
        if self.lines:
            text, self.lines = "\n".join(self.lines), []
            self.egraph._state.egraph.parse_and_run_program(text)


class Vec(tuple):
    """A `Vec` literal: `(vec-of ...)` of its items."""


class Str(str):
    """An egglog `String` literal."""


def atom(x: Any) -> str:
    """One argument in egglog syntax: terms as they are, ints, finite floats, strings, vectors."""
    if isinstance(x, Sym):
        return x
    if isinstance(x, Str):
        if not _SAFE_STRING.fullmatch(x):
            raise UnsupportedProgramError(
                f"name {str(x)!r} is not printable ASCII without quotes or backslashes"
            )
        return f'"{x}"'
    if isinstance(x, bool):
        raise TypeError(f"booleans have no egglog form here: {x!r}")
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"non-finite float {x!r} has no egglog literal")
        return repr(x)  # always has '.' or 'e', which egglog reads as f64
    if isinstance(x, Vec):
        return "(vec-of" + "".join(" " + atom(v) for v in x) + ")"
    raise TypeError(f"no egglog form for {type(x).__name__}: {x!r}")


def ref_of(fn: Callable[..., Any]) -> Any:
    """egglog's reference to a constructor or function (what reach.py reasons about)."""
    return resolve_callable(fn)[0]


def ivec(xs: Iterable[Any]) -> Vec:
    """A Vec[i64] of Python ints."""
    return Vec(int(x) for x in xs)

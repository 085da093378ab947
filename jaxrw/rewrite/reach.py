"""Which rewrites can ever fire on a program: a static over-approximation by function symbols.

A rewrite's left side (a rule's query) matches only rows that exist. Rows of a term-language
function exist when the encoder wrote one, or when some rule that can itself fire writes one. The
fixpoint over that gives the symbols a program can ever hold; a rewrite whose query needs another
symbol can never match and is not registered. Registering a rule costs egglog about half a
millisecond (its query is compiled) and every registered rule is searched each iteration, so on a
transformer layer stack this removes a good part of the rewrite phase's fixed cost. Sound because
it only drops rules that cannot match: the e-graph after saturation is the same.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from egglog import declarations as decl

__all__ = ["symbols", "can_fire", "analysis_rules"]

_REF_TYPES = typing.get_args(decl.CallableRef)
_OURS = "jaxrw."  # only the term language's functions have tables that may be empty
_CACHE: dict[int, tuple[frozenset, frozenset]] = {}  # id(rule decl) -> (needs, makes)
_KEEP: list[Any] = []  # the decls whose ids key _CACHE, kept alive


_LEAVES = (str, int, float, bool, type(None), decl.JustTypeRef, decl.Ident, decl.UnboundVarDecl, decl.LitDecl)
_FIELDS: dict[type, tuple[str, ...]] = {}


def symbols(obj: Any) -> set:
    """The term-language callables named anywhere inside an egglog declaration."""
    out: set = set()
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, _LEAVES):
            continue
        if isinstance(x, decl.CallDecl):  # where callables are named: skip straight to the args
            stack.append(x.callable)
            stack.extend(x.args)
        elif isinstance(x, _REF_TYPES):
            ident = getattr(x, "ident", None)
            if ident is not None and (getattr(ident, "module", "") or "").startswith(_OURS):
                out.add(x)
        elif isinstance(x, tuple | list | frozenset | set):
            stack.extend(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            names = _FIELDS.get(type(x))
            if names is None:
                names = _FIELDS[type(x)] = tuple(f.name for f in dataclasses.fields(x))
            stack.extend(getattr(x, n) for n in names)
    return out


def _needs_makes(d: Any) -> tuple[frozenset, frozenset]:
    """(symbols a rewrite's match needs, symbols it may write) of one rewrite or rule decl."""
    got = _CACHE.get(id(d))
    if got is None:
        if isinstance(d, decl.RewriteDecl):
            needs = symbols((d.lhs, d.conditions))
            makes = symbols(d.rhs)
        elif isinstance(d, decl.RuleDecl):
            needs, makes = symbols(d.body), symbols(d.head)
        else:  # pragma: no cover - an unknown kind of rule: assume it needs nothing, makes all
            needs, makes = set(), {None}
        got = _CACHE[id(d)] = (frozenset(needs), frozenset(makes))
        _KEEP.append(d)
    return got


def _decls(rewrites: Iterable[Any]) -> list[Any]:
    return [rw.decl for rw in rewrites]


def analysis_rules() -> list[Any]:
    """The decls of the shape/dtype analysis rules (always registered, so their writes count)."""
    from .terms import analysis

    return [r for rs in analysis.__egg_decls__._rulesets.values() for r in rs.rules]


def can_fire(rewrites: Sequence[Any], present: Iterable[Any], always: Sequence[Any] = ()) -> list[bool]:
    """For each rewrite: whether its match can ever succeed, given the callables the encoder
    wrote (`present`) and rules that are registered anyway (`always`, e.g. the analysis)."""
    have = set(present)
    rules = [_needs_makes(d) for d in (*_decls(rewrites), *always)]
    changed = True
    while changed:
        changed = False
        for needs, makes in rules:
            if needs <= have and not makes <= have:
                if None in makes:  # an unknown kind of rule: everything may appear
                    return [True] * len(rewrites)
                have |= makes
                changed = True
    return [needs <= have for needs, _ in rules[: len(rewrites)]]

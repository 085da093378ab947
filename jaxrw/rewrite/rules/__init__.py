"""The rule registry. Each family module registers its rules here on import.

A `Rule` has a stable name, its identity in one line, its side conditions, an exactness tag
(exact in floating point, or exact only in real arithmetic) and an `example`: a small program
where it applies, which the tests use to check it numerically against a float64 reference. Its
egglog rewrites come from `build`; a rule over a whole group of equations may instead `seed` the
e-graph once, before saturation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import InvalidOptionError

__all__ = ["Rule", "RULES", "register_rule", "select_rules", "families", "finding", "is_finding", "left_out"]

# egglog rules named so (`finding`) record a fact that the rule's other rewrites match: they
# rewrite nothing themselves, and are not counted as fired (rules/reduce.py diag_dot)
_FINDING = "finding: "


def finding(name: str) -> str:
    """An egglog rule name for a rule of `name`'s that only records a fact."""
    return _FINDING + name


def is_finding(decl: Any) -> bool:
    """Whether an egglog rule's declaration is one named by `finding`."""
    return (getattr(decl, "name", None) or "").startswith(_FINDING)


@dataclass(frozen=True)
class Rule:
    """A rewrite rule: `name` ("<family>.<rule>"), its `family`, its `identity` in one line, whether
    it is `exact` in floating point, `build()` returning its egglog rules, its side `conditions`
    in words, and an `example(rng, dtype) -> (fn, args)` where it fires, which the tests check
    against float64 in `dtypes`. The other fields say which numerics levels use it and when it
    runs (see each one's comment)."""

    name: str
    family: str
    identity: str
    exact: bool  # True: exact in floating point; False: exact in real arithmetic only
    build: Callable[[], list[Any]] = field(repr=False, compare=False)
    conditions: str = ""
    # example(rng, dtype) -> (fn, args): a program in which this rule fires
    example: Callable[[Any, str], tuple[Callable, tuple]] | None = field(
        default=None, repr=False, compare=False
    )
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # dtypes the example is checked in
    # True: holds only for finite operands (A@0 -> 0 is NaN, not 0, where A holds an inf): such a
    # rule could turn a NaN or Inf result finite, so only numerics="fast" uses it
    finite_only: bool = False
    # True (inexact rules only): keeps every NaN and Inf where it was (_util.NONFINITE_SAFE), so
    # numerics="default" does not keep it away from saturating functions (nonfinite.py)
    nonfinite_safe: bool = False
    # True: runs once after the main saturation (run.py), so what it adds is never matched by the
    # other rules; for rules whose results would otherwise feed the merges without end
    late: bool = False
    # seed(program) -> how many terms it joined: facts written once before saturation, for an
    # identity over a whole group of equations that rules would reach one member per iteration
    seed: Callable[[Any], int] | None = field(default=None, repr=False, compare=False)

    def rewrites(self, guarded: bool = False) -> list[Any]:
        """The egglog rewrites. `guarded`: an inexact rule fires only on values that reach no
        saturating op (numerics="default"; nonfinite.py); exact rules are the same either way."""
        guarded = guarded and not (self.exact or self.nonfinite_safe)
        cached = _BUILT.get((self.name, guarded))
        if cached is None:
            if guarded:
                from ..nonfinite import guard

                cached = [guard(rw, self.name) for rw in self.rewrites()]
            else:
                cached = list(self.build())
            _BUILT[(self.name, guarded)] = cached
        return cached


RULES: dict[str, Rule] = {}
_BUILT: dict[tuple[str, bool], list[Any]] = {}


_LOADING: list[bool] = []  # set while the built-in families register themselves


def register_rule(rule: Rule) -> Rule:
    """Make `rule` available by its name and its family's (`optimize(..., rules=...)`). The name is
    "<family>.<rule>" and may not be one already registered (the built-ins are loaded first, so a
    clash is refused here, not at the first optimize)."""
    from ._util import FAST_ONLY, NONFINITE_SAFE  # the families' lists

    if not _LOADING:
        _load_families()
        if not isinstance(rule, Rule):
            raise InvalidOptionError(f"register_rule takes a jaxrw.Rule; got {rule!r}")
        if not callable(rule.build):
            raise InvalidOptionError(f"rule {rule.name!r}: build must be callable, returning egglog rules")
        if not (isinstance(rule.name, str) and rule.name.startswith(f"{rule.family}.")):
            raise InvalidOptionError(
                f"rule name {rule.name!r} must be its family's name, a dot and its own "
                f"({rule.family!r}.<name>)"
            )
    if rule.name in FAST_ONLY and not rule.finite_only:
        rule = replace(rule, finite_only=True)
    if rule.name in NONFINITE_SAFE and not rule.nonfinite_safe:
        rule = replace(rule, nonfinite_safe=True)
    if rule.name in RULES and RULES[rule.name] != rule:
        raise InvalidOptionError(f"rule name {rule.name!r} is already registered; choose another name")
    RULES[rule.name] = rule
    return rule


def families() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in RULES.values():
        out.setdefault(r.family, []).append(r.name)
    return out


def select_rules(spec: str | Sequence[str] | None, numerics: str = "default") -> list[Rule]:
    """Rules named by `spec` (rule names or family names; None or "all" = every rule), keeping
    only floating-point-exact rules when numerics == "strict" and finite-only rules only when
    numerics == "fast" (docs/numerics.md)."""
    _load_families()
    if spec is None or spec == "all":
        chosen = list(RULES.values())
    else:
        names = [spec] if isinstance(spec, str) else list(spec)
        fams = families()
        chosen = []
        for name in names:
            if name in RULES:
                chosen.append(RULES[name])
            elif name in fams:
                chosen.extend(RULES[n] for n in fams[name])
            else:  # the families by name; the rules, too many to list, by where to find them
                raise InvalidOptionError(
                    f"unknown rule or family {name!r}; valid: a family ({', '.join(sorted(fams))}), "
                    f"'all', or one of the {len(RULES)} rule names '<family>.<rule>' "
                    "(jaxrw.rewrite.rules.RULES; `families()` lists them by family)"
                )
    if numerics == "strict":
        chosen = [r for r in chosen if r.exact]
    if numerics != "fast":
        chosen = [r for r in chosen if not r.finite_only]
    seen: set[str] = set()
    return [r for r in chosen if not (r.name in seen or seen.add(r.name))]


def left_out(spec: str | Sequence[str] | None, numerics: str, chosen: Iterable[Rule]) -> str:
    """The rules `spec` names itself (not by family or "all") that `numerics` left out of `chosen`
    (select_rules' answer), and why ("" if none): asked for by name, a rule left out said nothing
    (stop: no rules)."""
    if spec is None or spec == "all":
        return ""
    names = [spec] if isinstance(spec, str) else list(spec)
    kept = {r.name for r in chosen}
    out = []
    for name in names:
        if name in RULES and name not in kept:
            rule = RULES[name]
            need = "numerics='fast'" if rule.finite_only else "numerics='default' or 'fast' (inexact)"
            out.append(f"{name} needs {need}")
    return f"left out under numerics={numerics!r}: {'; '.join(out)}" if out else ""


def _load_families() -> None:
    _LOADING.append(True)
    try:
        from . import batch, dot, elementwise, ghost, merge, outer, reduce, structured  # noqa: F401  (register on import)
    finally:
        _LOADING.pop()


def rules_of(items: Iterable[Rule]) -> list[Any]:
    return [rw for r in items for rw in r.rewrites()]

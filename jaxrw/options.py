"""The checks of `optimize`'s options: a bad value gets an error naming it and what is allowed."""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from . import compat
from .errors import (
    InvalidOptionError,
    check_argnums,
    check_bool,
    check_choice,
    check_fraction,
    check_names,
    check_nonneg_int,
)
from .logs import fn_name
from .rewrite.cost import COST_MODELS, CostModel
from .rewrite.extract import EXTRACTORS
from .rewrite.profiles import Profile, get_profile, profile_problem
from .rewrite.run import NUMERICS, Limits

SCHEDULES = ("auto", "xla", "streams")
# jax.jit's options that optimize does not take (its static and donated arguments it does)
JIT_ONLY = (
    "in_shardings",
    "out_shardings",
    "keep_unused",
    "device",
    "backend",
    "inline",
    "abstracted_axes",
    "compiler_options",
)


def checked_options(
    *,
    static_argnums: Any,
    static_argnames: Any,
    donate_argnums: Any,
    donate_argnames: Any,
    rules: Any,
    cost_model: Any,
    extractor: Any,
    profile: Any,
    verify: Any,
    strict: Any,
    limits: Any,
    numerics: Any,
    schedule: Any,
    schedule_memory_slack: Any,
    autotune: Any,
    autotune_k: Any,
    hoist_argnums: Any,
    hoist_argnames: Any,
    max_hoist_bytes: Any,
    unknown: dict[str, Any],
) -> dict[str, Any]:
    """`optimize`'s keyword options, checked and normalized into `Optimized`'s fields; `unknown`:
    any other keyword given, refused with the options there are."""
    if unknown:
        jit_only = sorted(set(unknown) & set(JIT_ONLY))
        why = (
            f"jax.jit's {', '.join(jit_only)} {'is' if len(jit_only) == 1 else 'are'} not supported (jaxrw "
            "compiles its own programs, with jax.jit's defaults for those; wrap it for them: "
            "jax.jit(optimize(fn), in_shardings=...)); "
            if jit_only
            else ""
        )
        options = [k for k in inspect.signature(checked_options).parameters if k != "unknown"]
        raise InvalidOptionError(
            f"optimize got {', '.join(f'{k}={v!r}' for k, v in unknown.items())}: {why}"
            f"its options are {', '.join(options)}"
        )
    check_choice("numerics", numerics, NUMERICS)
    check_choice("schedule", schedule, SCHEDULES)
    if isinstance(cost_model, str):
        check_choice("cost model", cost_model, COST_MODELS)
    elif not isinstance(cost_model, CostModel):
        raise InvalidOptionError(
            f"cost_model must be a registered name or have name and node_cost(); got {cost_model!r}; "
            f"valid names: {sorted(COST_MODELS)!r}"
        )
    check_choice("extractor", extractor, EXTRACTORS)
    names_ok = isinstance(rules, Sequence) and all(isinstance(r, str) for r in rules)
    if not (rules is None or isinstance(rules, str) or names_ok):
        raise InvalidOptionError(
            f"rules must be None, a rule or family name, or a sequence of names; got {rules!r}"
        )
    if isinstance(profile, str):
        get_profile(profile)  # raises naming the valid profiles
    elif profile is not None and not isinstance(profile, Profile):
        raise InvalidOptionError(
            f"profile must be a jaxrw.Profile, a profile name or the path of a .json profile; got {profile!r}"
        )
    elif profile is not None and (problem := profile_problem(profile)):
        raise InvalidOptionError(f"profile {profile.name!r}: {problem}")
    if not isinstance(autotune_k, int) or isinstance(autotune_k, bool) or autotune_k < 1:
        raise InvalidOptionError(f"autotune_k must be a positive int; got {autotune_k!r}")
    if isinstance(limits, dict):
        fields = sorted(Limits.__dataclass_fields__)
        for k in limits:
            check_choice("limits field", k, fields)
        limits = Limits(**limits)
    elif limits is not None and not isinstance(limits, Limits):
        raise InvalidOptionError(f"limits must be a jaxrw.Limits or dict; got {limits!r}")
    return dict(
        static_argnums=check_argnums(static_argnums, "static_argnums"),
        static_argnames=check_names("static_argnames", static_argnames),
        donate_argnums=check_argnums(donate_argnums, "donate_argnums"),
        donate_argnames=check_names("donate_argnames", donate_argnames),
        rules=rules,
        cost_model=cost_model,
        extractor=extractor,
        profile=profile,
        verify=check_bool("verify", verify),
        strict=check_bool("strict", strict),
        limits=limits or Limits(),
        numerics=numerics,
        schedule=schedule,
        schedule_memory_slack=check_fraction("schedule_memory_slack", schedule_memory_slack),
        autotune=check_bool("autotune", autotune),
        autotune_k=int(autotune_k),
        hoist_argnums=check_argnums(hoist_argnums, "hoist_argnums"),
        hoist_argnames=check_names("hoist_argnames", hoist_argnames),
        max_hoist_bytes=check_nonneg_int("max_hoist_bytes", max_hoist_bytes),
    )


POSITIONAL_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def signature_of(fn: Callable, follow_wrapped: bool = True) -> inspect.Signature | None:
    """`fn`'s signature, or None where it cannot be read (a builtin, some C callables).
    `follow_wrapped=False`: the signature of `fn` itself, not of what `functools.wraps` says it
    wraps (a decorator that supplies or adds an argument takes other ones)."""
    try:
        return inspect.signature(fn, follow_wrapped=follow_wrapped)
    except (TypeError, ValueError):
        return None


def _parameters(fn: Callable) -> list[inspect.Parameter] | None:
    """`fn`'s parameters, or None where its signature cannot be read."""
    sig = signature_of(fn)
    return None if sig is None else list(sig.parameters.values())


def resolve_argnums(fn: Callable, nums: tuple[int, ...], what: str) -> tuple[int, ...]:
    """`nums` with negative indices counted from the end of `fn`'s positional parameters, as
    jax.jit counts them; a clear error where that count is unknown (*args, or no signature)."""
    if all(i >= 0 for i in nums):
        return nums
    params = _parameters(fn)
    if params is None:
        params = [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
    n = sum(p.kind in POSITIONAL_KINDS for p in params)
    out = tuple(i + n if i < 0 else i for i in nums)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params) or min(out) < 0:
        raise InvalidOptionError(
            f"{what} {nums!r}: a negative index needs a function with that many positional parameters "
            f"and no *args ({n} here); valid: indices 0..{max(n - 1, 0)} or -{n}..-1"
        )
    return tuple(sorted(set(out)))


def check_hoisted(fn: Callable, nums: tuple[int, ...], names: tuple[str, ...]) -> None:
    """`hoist_argnums`/`hoist_argnames` that `fn` can take, as jax.jit checks its static and donated
    ones: an index past its positional parameters (no *args) or a name that is none of its
    parameters (no **kwargs) would hoist nothing and say nothing (a typo's silent cost)."""
    params = _parameters(fn)
    if params is None:
        return
    kind = inspect.Parameter
    kinds = {p.kind for p in params}
    n = sum(p.kind in POSITIONAL_KINDS for p in params)
    far = tuple(i for i in nums if i >= n)
    if far and kind.VAR_POSITIONAL not in kinds:
        valid = f"indices 0..{n - 1} or -{n}..-1" if n else "none (it has no positional parameters)"
        raise InvalidOptionError(
            f"hoist_argnums {far!r}: {fn_name(fn)} takes {n} positional parameter(s); valid: {valid}"
        )
    by_name = [p.name for p in params if p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)]
    unknown = tuple(k for k in names if k not in by_name)
    if unknown and kind.VAR_KEYWORD not in kinds:
        raise InvalidOptionError(
            f"hoist_argnames {unknown!r}: {fn_name(fn)} has no such parameter; valid: {by_name!r}"
        )


def hoisted_arguments(
    fn: Callable, nums: tuple[int, ...], names: tuple[str, ...], static: tuple, donated: tuple
) -> tuple[frozenset, tuple]:
    """(the hoisted arguments, each by position and by name, donated ones left out: a new array can
    take a deleted one's id; the donated ones named for hoisting, for a warning). An argument both
    hoisted and static is refused: a static one is part of the signature, no array to cache."""
    check_hoisted(fn, nums, names)
    hoisted = set().union(*both_spellings(fn, nums, names))
    both = hoisted & set(static)
    if both:
        raise InvalidOptionError(
            f"hoist_argnums/hoist_argnames {sorted(both, key=str)!r} are static as well: a static "
            "argument is part of the signature (hashed), not an array to hoist; name it in one of the two"
        )
    return frozenset(hoisted - set(donated)), tuple(sorted(named_once(fn, hoisted & set(donated)), key=str))


def named_once(fn: Callable, owners: Iterable[int | str]) -> list[int | str]:
    """Arguments given by position and name, each once and by name where it has one (an argument
    hoisted by both spellings read [0, 'params'] in messages)."""
    named = param_names(fn)
    return list(dict.fromkeys(named.get(o, o) for o in owners))


def param_names(fn: Callable) -> dict[int, str]:
    """Index -> name of `fn`'s parameters that can be passed either way (positional-or-keyword);
    empty where the signature cannot be read."""
    params = _parameters(fn) or []
    return {i: p.name for i, p in enumerate(params) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}


def both_spellings(
    fn: Callable, nums: tuple[int, ...], names: tuple[str, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Arguments by position and by name, the missing spelling completed from the given one
    through `fn`'s signature, as jax.jit completes static and donated arguments: an argument that
    can be passed either way is then taken however the call passes it. Where both are given, each
    is taken as given (jax.jit's rule too); unchanged where the signature cannot be read."""
    sig = None if nums and names else signature_of(fn)
    if sig is None:
        return nums, names
    # jax's own completion, so a negative index names what this jax.jit names (jax 0.12 counts it
    # from the end of all parameters: -1 of f(x, y, *, z) names none; jax 0.11 names none for any)
    return compat.infer_argnums_and_argnames(sig, nums or None, names or None)


def output_problem(path: str, option: str, suffixes: tuple[str, ...] = ()) -> str | None:
    """Why `path` could not be written when the run ends (checked before it starts, so a long
    run's results are not lost to a typo), or None."""
    p = Path(path)
    if p.is_dir():
        return f"{option} {path!r} is a directory; give a file path"
    if suffixes and p.suffix.lower() not in suffixes:
        return f"{option} {path!r}: a file ending in {', '.join(suffixes)}"
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return f"{option} {path!r}: {parent} is not a writable directory"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{option} {path!r} exists and is not writable"
    return None


_OFF, _ON = ("", "0", "false", "no", "off"), ("1", "true", "yes", "on")


def disabled() -> bool:
    """Whether $JAXRW_DISABLE turns every optimize into a plain jax.jit (read at each one's first
    call): 1/true/yes/on do, empty/0/false/no/off do not ("false" did); anything else does, with
    a warning naming it."""
    value = os.environ.get("JAXRW_DISABLE", "").strip().lower()
    if value not in _OFF and value not in _ON:
        warnings.warn(
            f"JAXRW_DISABLE={value!r} is taken as set; valid: {', '.join(_ON)} (set) or "
            f"{', '.join(repr(v) for v in _OFF)} (not set)",
            stacklevel=2,
        )
    return value not in _OFF

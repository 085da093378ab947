"""Measured top-k: compile the k cheapest programs under the model plus the original, time them on
this device, keep the fastest, and remember the choice on disk.

The cache is JSON (`autotune.json` in the jaxrw cache directory) keyed by a hash of the program,
the device kind and the jax version; each entry names the winning program by its fingerprint.
A corrupted or foreign file is ignored with a warning and rewritten, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from ..logs import warn_user
from .decode import decode
from .extract import alternatives, fingerprint
from .measure import Timing, paired_ratio, time_interleaved
from .profiles import cache_dir
from .run import RewriteResult, original_classes

__all__ = [
    "AutotuneChoice",
    "autotune",
    "measured_winner",
    "apply_autotune",
    "program_key",
    "cache_path",
    "options_key",
]

ORIGINAL = "original"


@dataclass
class AutotuneChoice:
    fn: Callable[..., list[Any]] | None  # None: the original program won
    winner: str  # fingerprint hash, or "original"
    times: dict[str, float] = field(default_factory=dict)  # median seconds per candidate
    from_cache: bool = False


def cache_path() -> Path:
    return cache_dir() / "autotune.json"


def program_key(closed: Any, extra: str = "") -> str:
    dev = jax.devices()[0]
    avals = [v.aval for v in closed.jaxpr.invars]
    text = f"{closed}|{avals}|{dev.platform}:{dev.device_kind}|jax {jax.__version__}"
    return hashlib.sha256((text + "|" + extra).encode()).hexdigest()


def options_key(opt: Any, slow: list[int], profile: Any) -> str:
    """What besides the program decides the candidates and what they run: optimize's options
    (`opt`), the hoisted leaves and the profile."""
    fields = (
        opt.rules,
        opt.numerics,
        opt.cost_model,
        opt.extractor,
        opt.autotune_k,
        slow,
        profile,
        opt.limits,
        opt.max_hoist_bytes,  # which rewrites are candidates (`_hoist_fits`)
    )
    return "|".join(map(str, fields))


def _fp_hash(fp: tuple) -> str:
    return hashlib.sha256(repr(fp).encode()).hexdigest()[:16]


def _load(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and _entry_ok(v) for k, v in data.items()
        ):
            raise ValueError("unexpected structure")
        return data
    except (OSError, ValueError) as e:
        warn_user(f"jaxrw: ignoring corrupted autotune cache {path}: {e}")
        return {}


def _entry_ok(entry: Any) -> bool:
    """An entry as _save writes it: a winner's name and median seconds per candidate."""
    if not isinstance(entry, dict) or not isinstance(entry.get("winner"), str):
        return False
    times = entry.get("times", {})
    return isinstance(times, dict) and all(
        isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) for t in times.values()
    )


def _save(path: Path, data: dict[str, dict]) -> None:
    """Write the cache; a failure (a read-only directory, a full disk) only warns: the choice
    measured stands for this process."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # one per process: two writers never share it
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        warn_user(f"jaxrw: could not save the autotune choice to {path}: {e}")


def autotune(
    result: RewriteResult,
    closed: Any,
    original: Callable[..., Any],
    args: Sequence[Any],
    *,
    k: int = 4,
    key_extra: str = "",
    samples: int = 5,
    max_hoist_bytes: int | None = None,
) -> AutotuneChoice:
    """Pick the fastest of the original program and the model's k best rewrites, on `args`;
    rewrites that hoist more than `max_hoist_bytes` are no candidates (rewrite_jaxpr refuses the
    model's choice alike)."""
    view, costs = result.view, result.costs
    assert view is not None and costs is not None and result.extraction is not None
    before = result.before
    keep = original_classes(before, view) if before is not None else set()
    choices = alternatives(view, costs, result.extraction.choice, k)
    named = {_fp_hash(fingerprint(view, ch)): ch for ch in choices}
    key = program_key(closed, key_extra)
    path = cache_path()
    cache = _load(path)
    hit = cache.get(key)
    if hit is not None and (hit["winner"] == ORIGINAL or hit["winner"] in named):
        w = hit["winner"]
        fn = None if w == ORIGINAL else decode(result.program, view, named[w], frozenset(keep))
        if _hoist_fits(fn, max_hoist_bytes):  # else measured again, without it
            return AutotuneChoice(fn, w, dict(hit.get("times", {})), from_cache=True)
    fns: dict[str, Callable] = {ORIGINAL: original}
    decoded: dict[str, Callable] = {}
    for name, ch in named.items():
        fn = decode(result.program, view, ch, frozenset(keep))
        if _hoist_fits(fn, max_hoist_bytes):
            decoded[name] = fn
            fns[name] = jax.jit(fn)
    timings = time_interleaved(fns, list(args), samples=samples)
    times = {name: t.median for name, t in timings.items()}
    winner = measured_winner(timings)
    cache[key] = {"winner": winner, "times": times}
    _save(path, cache)
    return AutotuneChoice(decoded.get(winner), winner, times)


def _hoist_fits(fn: Callable | None, max_hoist_bytes: int | None) -> bool:
    """Whether a decoded program's hoisted values (none where it hoists nothing) fit the bound."""
    hoisted = getattr(fn, "hoisted", None)
    return hoisted is None or max_hoist_bytes is None or hoisted.nbytes <= max_hoist_bytes


def measured_winner(timings: dict[str, Timing]) -> str:
    """The candidate with the lowest median, if it also beat the original round by round (the
    median of its per-round ratios to the original under 1); else the original. Medians alone
    can crown a rewrite that lost most rounds when the host slowed down for a few of them."""
    best = min(timings, key=lambda name: timings[name].median)
    if best == ORIGINAL:
        return ORIGINAL
    ratio = paired_ratio(timings[best].samples, timings[ORIGINAL].samples)
    return best if ratio < 1.0 else ORIGINAL


def apply_autotune(
    result: RewriteResult,
    closed: Any,
    flat: Callable[..., Any],
    leaves: Sequence[Any],
    k: int,
    key_extra: str = "",
    max_hoist_bytes: int | None = None,
) -> None:
    """optimize(autotune=True): replace the model's choice in `result` by the measured-fastest of
    it, its runners-up and the original program (`flat`, a function of the flat leaves)."""
    original = jax.jit(lambda *xs: jax.tree_util.tree_leaves(flat(*xs)))
    bound = max_hoist_bytes
    choice = autotune(result, closed, original, leaves, k=k, key_extra=key_extra, max_hoist_bytes=bound)
    result.fn = choice.fn
    result.report.rewritten = choice.fn is not None
    result.report.autotune = {"winner": choice.winner, "times": choice.times, "cached": choice.from_cache}
    if choice.fn is None:
        result.report.guard_note = "the original measured fastest"

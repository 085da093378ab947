"""Timing compiled functions on the current device, the way DESIGN.md says (one implementation
for autotune, calibration, the cost check and the benchmarks).

Each variant is called once to compile and a few times to warm up; the number of calls per sample
is chosen per variant from a short trial so one sample lasts about `sample_s`; then `repeats`
rounds each take one sample of every variant in a rotating order (so drift in clock speed or
temperature hits all variants alike), each sample after one untimed call (what switching from
another variant's executable and data costs is not charged to this one: in a sample of ~20
calls, one call twice as slow as the rest would move the mean by 5%). A sample dispatches its
calls and blocks on the last result (`block_until_ready`): the time per call is the sample's time
divided by its calls. The summary is the median; every sample is kept. Two variants are compared
by `paired_ratio`, the median over rounds of their ratio within a round: samples of one round are
taken milliseconds apart, so a change of clock or host load between rounds (on the H200 host, a
case whose every variant ran 2x slower for its first five rounds) moves both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

__all__ = [
    "Timing",
    "measure",
    "more_rounds",
    "median_interval",
    "verdict",
    "settle",
    "paired_ratio",
    "round_ratios",
    "block",
    "compile_and_warm",
    "time_interleaved",
    "time_one",
    "time_calls",
]


@dataclass
class Timing:
    samples: list[float] = field(default_factory=list)  # seconds per call, one per sample
    calls: int = 0  # calls per sample
    compile_s: float = 0.0  # first call (trace, compile, run)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> float:
        """(max - min) / median of the samples: a quick noise gauge."""
        if len(self.samples) < 2 or not self.median > 0:
            return 0.0
        return (max(self.samples) - min(self.samples)) / self.median

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "min_s": min(self.samples, default=float("nan")),
            "max_s": max(self.samples, default=float("nan")),
            "spread": self.spread,
            "calls_per_sample": self.calls,
            "compile_s": self.compile_s,
            "samples_s": list(self.samples),
        }


def round_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """num[i] / den[i] per round (samples of two variants in round order)."""
    return [a / b for a, b in zip(num, den, strict=False) if b > 0]


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[i] / den[i]: how many times slower `num` ran than `den` in the
    same round. NaN when no round has both."""
    ratios = round_ratios(num, den)
    return statistics.median(ratios) if ratios else float("nan")


def block(x: Any) -> Any:
    """Wait for every array in the pytree `x`."""
    return jax.block_until_ready(x)


def compile_and_warm(fn: Callable, args: tuple, warmup: int = 2) -> tuple[float, float]:
    """Call once (compiling), then `warmup` more times; return (first-call seconds, last-call seconds)."""
    t = time.perf_counter()
    block(fn(*args))
    first = time.perf_counter() - t
    last = first
    for _ in range(warmup):
        t = time.perf_counter()
        block(fn(*args))
        last = time.perf_counter() - t
    return first, last


def time_calls(fn: Callable, args: Sequence[Any], calls: int) -> float:
    """Seconds per call of one sample: `calls` calls dispatched, then a block on the last result."""
    out = None
    t = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    block(out)
    return (time.perf_counter() - t) / calls


def measure(
    variants: dict[str, tuple[Callable, tuple]],
    repeats: int = 5,
    sample_s: float = 0.02,
    max_calls: int = 10_000,
    warmup: int = 2,
) -> dict[str, Timing]:
    """Time each `name -> (fn, args)` as described in the module docstring."""
    out: dict[str, Timing] = {}
    for name, (fn, args) in variants.items():
        first, last = compile_and_warm(fn, args, warmup)
        # calibrate with a short trial sample rather than one (possibly cold) call
        trial_calls = max(1, min(max_calls, int(0.2 * sample_s / max(last, 1e-7))))
        per_call = time_calls(fn, args, trial_calls)
        calls = max(1, min(max_calls, round(sample_s / max(per_call, 1e-9))))
        out[name] = Timing(calls=calls, compile_s=first)
    more_rounds(variants, out, repeats)
    return out


def more_rounds(variants: dict[str, tuple[Callable, tuple]], timings: dict[str, Timing], rounds: int) -> None:
    """Append `rounds` rounds of samples to `timings` (from `measure`, same calls per sample) for
    the variants named in `variants`: one sample of each per round, in an order rotating by
    round. Variants left out get no sample in these rounds; `paired_ratio` pairs rounds by
    position, so only variants sampled in the same rounds should be compared on their tails."""
    names = list(variants)
    for _ in range(rounds):
        k = len(timings[names[0]].samples) % len(names)
        for name in names[k:] + names[:k]:
            fn, args = variants[name]
            block(fn(*args))  # untimed: the switch from the previous variant is not charged
            timings[name].samples.append(time_calls(fn, args, timings[name].calls))


# the fewest values for which `median_interval` gives a 95% interval (P(B(5, 1/2) = 0) = 1/32 >
# 0.025; P(B(6, 1/2) = 0) = 1/64 is not): the bench's rounds at the small size
MIN_INTERVAL_ROUNDS = 6


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of `values`: the order statistics
    x(k) and x(n+1-k) with k the largest index whose binomial tail P(B(n, 1/2) < k) is at most
    (1 - level) / 2, so the interval holds the true median with probability >= `level` whatever
    the noise's distribution. None when there are too few values for that level
    (MIN_INTERVAL_ROUNDS at 95%)."""
    from scipy.stats import binom

    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None
    k = int(binom.ppf((1 - level) / 2, n, 0.5))  # P(B <= k - 1) < (1 - level) / 2 <= P(B <= k)
    if k < 1:
        return None
    return xs[k - 1], xs[n - k]


def verdict(interval: tuple[float, float] | None, at: float) -> str:
    """'at least' when the whole interval is >= `at`, 'below' when all of it is under, else
    'unresolved' (the rounds taken cannot tell; also with no interval)."""
    if interval is None:
        return "unresolved"
    lo, hi = interval
    return "at least" if lo >= at else "below" if hi < at else "unresolved"


def settle(
    variants: dict[str, tuple[Callable, tuple]],
    timings: dict[str, Timing],
    pairs: Sequence[tuple[str, str, tuple[str, ...]]],
    at: float,
    max_rounds: int,
    max_s: float,
    batch: int = 4,
) -> int:
    """Take more rounds (`more_rounds`, `batch` at a time) while the 95% interval of a pair's
    per-round speedup (base over name) straddles `at`: for each (name, base, companions) in
    `pairs` still unsettled, name, base and the companions (controls worth the same rounds) are
    sampled. A pair whose variant has `max_rounds` samples is left as it is; the loop stops when
    no pair is left open or `max_s` seconds have passed, and returns the rounds added. A program
    as fast as its base needs many rounds on a noisy host to show it is not 2% slower; one 10%
    slower is settled in a few."""
    start, added = time.perf_counter(), 0

    def open_pair(name: str, base: str) -> bool:  # timed, unsettled and below the round limit
        if name not in timings or base not in timings or len(timings[name].samples) >= max_rounds:
            return False
        ratios = round_ratios(timings[base].samples, timings[name].samples)
        return verdict(median_interval(ratios), at) == "unresolved"

    while time.perf_counter() - start < max_s:
        names: list[str] = []
        for name, base, companions in pairs:
            if open_pair(name, base):
                names += [n for n in (name, base, *companions) if n in timings and n not in names]
        room = max_rounds - max((len(timings[n].samples) for n in names), default=max_rounds)
        if room <= 0:
            break
        step = min(batch, room)
        more_rounds({n: variants[n] for n in names}, timings, step)
        added += step
    return added


def time_interleaved(
    fns: dict[str, Callable],
    args: Sequence[Any],
    *,
    samples: int = 7,
    min_sample_s: float = 0.01,
    warmup: int = 2,
    max_calls: int = 10_000,
) -> dict[str, Timing]:
    """`measure` of several functions on the same arguments."""
    a = tuple(args)
    variants = {name: (fn, a) for name, fn in fns.items()}
    return measure(variants, repeats=samples, sample_s=min_sample_s, max_calls=max_calls, warmup=warmup)


def time_one(fn: Callable, args: Sequence[Any], **kw: Any) -> Timing:
    return time_interleaved({"fn": fn}, args, **kw)["fn"]

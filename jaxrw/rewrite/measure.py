"""Timing compiled functions on the current device, the way DESIGN.md says: compile and warm up
first, many calls per sample with block_until_ready, median of several samples, variants
interleaved so drift hits them alike. Used by autotune, calibration and the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

__all__ = ["Timing", "time_interleaved", "time_one"]


@dataclass
class Timing:
    samples: list[float]  # seconds per call, one per sample

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median of the samples: how noisy the measurement was."""
        return (max(self.samples) - min(self.samples)) / self.median if self.median > 0 else 0.0


def _calls_per_sample(fn: Callable, args: Sequence[Any], min_sample_s: float, max_calls: int) -> int:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - t0, 1e-7)
    return int(min(max_calls, max(1, min_sample_s / once)))


def time_interleaved(
    fns: dict[str, Callable],
    args: Sequence[Any],
    *,
    samples: int = 7,
    min_sample_s: float = 0.01,
    warmup: int = 2,
    max_calls: int = 10_000,
) -> dict[str, Timing]:
    """Median-of-samples time per call of each function on the same arguments, interleaved."""
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    reps = {name: _calls_per_sample(fn, args, min_sample_s, max_calls) for name, fn in fns.items()}
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            n = reps[name]
            t0 = time.perf_counter()
            for _ in range(n):
                r = fn(*args)
            jax.block_until_ready(r)
            out[name].append((time.perf_counter() - t0) / n)
    return {name: Timing(s) for name, s in out.items()}


def time_one(fn: Callable, args: Sequence[Any], **kw: Any) -> Timing:
    return time_interleaved({"fn": fn}, args, **kw)["fn"]

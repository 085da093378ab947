"""Timing candidate programs on the device for schedule="auto": random inputs, interleaved samples
of a few milliseconds each, XLA's peak-memory estimate, and the pick with its margin."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .plan import ScheduleError

__all__ = [
    "pick_fastest",
    "random_inputs",
    "time_call",
    "peak_bytes",
    "MEASURED_MARGIN",
    "SAMPLE_S",
    "PEAK_ALLOWANCE_BYTES",
]

log = logging.getLogger("jaxrw")
MEASURED_MARGIN = 0.03  # auto keeps a candidate only when it measured at least this much faster
SAMPLE_S = 0.003  # seconds per timed sample when auto compares candidate schedules
# peak memory a candidate may add beyond the relative slack: XLA's concurrent command buffers keep a
# few KiB of bookkeeping (llama288's decode step: 7 KiB over 102 MiB, for 1.3x on the H200)
PEAK_ALLOWANCE_BYTES = 1 << 20


def random_inputs(flat_specs: Sequence[Any], seed: int = 0) -> list[Any]:
    """Fresh non-zero inputs matching `flat_specs` (floats normal, ints in [0, 8), bools random),
    drawn on the default device: an 8192x8192 operand drawn by numpy on the host took seconds."""
    keys = jax.random.split(jax.random.PRNGKey(seed), max(1, len(flat_specs)))
    out = []
    for key, s in zip(keys, flat_specs, strict=False):
        dt = np.dtype(s.dtype)
        if dt.kind == "b":
            x = jax.random.bernoulli(key, 0.5, s.shape)
        elif dt.kind in "iu":
            x = jax.random.randint(key, s.shape, 0, 8, dtype=dt)
        else:
            x = jax.random.normal(key, s.shape, jnp.float32).astype(dt)
        out.append(x)
    return out


def time_call(fn: Callable, args: Sequence[Any], calls: int = 20) -> float:
    """Seconds per call: `calls` calls then one block_until_ready."""
    t = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / calls


def peak_bytes(jitted: Any, args: Sequence[Any]) -> int | None:
    """Peak device memory of a jitted function from XLA's memory_analysis() (None if unknown)."""
    try:
        m = jitted.lower(*args).compile().memory_analysis()
        used = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        return int(used - m.alias_size_in_bytes)
    except Exception:  # noqa: BLE001 - memory analysis is optional on some backends
        return None


def pick_fastest(
    base: Callable,
    trial: dict[str, Callable],
    flat_specs: Sequence[Any],
    name: str,
    rounds: int = 7,
    memory_slack: float = 0.0,
    call_overhead: Callable[[], float] | None = None,
    charged: Sequence[str] | None = None,
    notes: list[str] | None = None,
    launch_s: float | None = None,
    launch_bound: Sequence[str] = (),
) -> tuple[str, float] | None:
    """The candidate measurably faster than `base` (by MEASURED_MARGIN, with a peak memory at most
    `memory_slack` plus PEAK_ALLOWANCE_BYTES above base's) and its speedup, or None. Timed
    interleaved on random inputs after warm-up; each candidate also pays `call_overhead()` seconds
    per call: the host time of the call path it needs and `base` does not (a 3% faster program is
    no gain when each call costs ~10 µs more to issue); `charged` names the candidates that pay it
    (default: all). `notes` collects what each candidate measured ("xla-graphs 0.99x", or why it
    was refused: "xla-concurrent +12.0% peak memory"). Candidates in `launch_bound` can only save
    kernel-launch time, at most `launch_s` a call: they are not compiled when that is under the
    margin of base's measured time."""
    notes = [] if notes is None else notes
    args = random_inputs(flat_specs)
    want = jax.tree_util.tree_leaves(base(*args))
    base_s = time_call(base, args, 3)
    if launch_s is not None and launch_bound and launch_s < MEASURED_MARGIN * base_s:
        notes.append(f"kernel launches ≤ {launch_s / base_s:.1%} of a call")
        trial = {k: f for k, f in trial.items() if k not in launch_bound}
    if not trial:
        return None
    base_peak = peak_bytes(base, args)  # after the gate: it compiles base once more
    ok: dict[str, Callable] = {}
    for label, f in trial.items():
        try:
            got = jax.tree_util.tree_leaves(f(*args))
            if [g.shape for g in got] != [w.shape for w in want]:
                raise ScheduleError("outputs differ in shape from jax.jit's")
            peak = peak_bytes(f, args)
            limit = None if base_peak is None else base_peak * (1 + memory_slack) + PEAK_ALLOWANCE_BYTES
            if limit is not None and peak is not None and peak > limit:
                log.info(
                    "jaxrw: %s: %s needs %d bytes, XLA %d (slack %g); not used",
                    name,
                    label,
                    peak,
                    base_peak,
                    memory_slack,
                )
                notes.append(f"{label} {peak / base_peak - 1:+.1%} peak memory")
                continue
            time_call(f, args, 3)
            ok[label] = f
        except Exception as e:  # noqa: BLE001 - auto never breaks the program; it keeps XLA's schedule
            log.warning(
                "jaxrw: %s schedule of %s failed (%s: %s); not used", label, name, type(e).__name__, e
            )
            notes.append(f"{label} failed")
    if not ok:
        return None
    # samples of at least ~3 ms each: 20 calls of a 40 µs program are too short a sample on a
    # shared host (a noisy pick put a kept program 16% behind jax.jit in one H200 run)
    calls = max(2, min(2000, int(SAMPLE_S / max(base_s, 1e-7))))
    times: dict[str, list[float]] = {k: [] for k in ["xla", *ok]}
    for _ in range(rounds):
        times["xla"].append(time_call(base, args, calls))
        for label, f in ok.items():
            times[label].append(time_call(f, args, calls))
    med = {k: float(np.median(v)) for k, v in times.items()}
    extra = call_overhead() if call_overhead is not None else 0.0
    med.update({k: med[k] + extra for k in ok if charged is None or k in charged})
    best = min(ok, key=med.__getitem__)
    log.info(
        "jaxrw: %s measured (µs, candidates with %.1f µs of call path): %s",
        name,
        extra * 1e6,
        ", ".join(f"{k} {v * 1e6:.1f}" for k, v in med.items()),
    )
    notes.extend(f"{k} {med['xla'] / med[k]:.2f}x" for k in ok)
    if med[best] > med["xla"] * (1 - MEASURED_MARGIN):
        return None
    return best, med["xla"] / med[best]

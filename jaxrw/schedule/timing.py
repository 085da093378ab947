"""Timing candidate programs on the device for schedule="auto": on the call's own arrays (or random
ones), interleaved samples of a few milliseconds each, XLA's peak-memory estimate, and the pick with
its margin."""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import compat
from ..rewrite.measure import measure, round_ratios, time_interleaved
from ..rewrite.measure import time_calls as time_call  # a name of its own: tests stand in for it
from ..tolerance import relative_error, tolerance
from .plan import ScheduleError

__all__ = [
    "pick_fastest",
    "compile_side_by_side",
    "random_inputs",
    "device_inputs",
    "time_call",
    "peak_bytes",
    "MEASURED_MARGIN",
    "KEPT_MARGIN",
    "kept_terms",
    "python_path_overhead_s",
    "fast_path_frame_s",
    "SAMPLE_S",
    "COMPILE_LIMIT_S",
    "PEAK_ALLOWANCE_BYTES",
]

log = logging.getLogger("jaxrw")
# auto keeps a candidate only when it measured at least this much faster: on the H200 host a second
# jax.jit of the same function measured 0.97-1.09x of the first (37 cases, runs of 2026-12-03q-t)
MEASURED_MARGIN = 0.05
# the margin where the program is kept as written: not picking runs it as written under XLA's
# own schedule (Optimized's state "jit"), a pick runs another compilation, and XLA's autotuning
# alone made separate compilations of one program 0.94-1.07x of each other (H200, run w). In the
# eighth lease, kept programs' picks measured 1.05-1.09x when built ran 0.93-1.09x in the bench
# (mean 1.02x), those measured 1.15-1.27x ran 1.04-1.53x (bench/HISTORY.md)
KEPT_MARGIN = 0.10


def _tiny(x: Any) -> Any:
    return x + 1.0


def _extra_host_s(variants: dict[str, Callable], x: Any) -> float:
    """Seconds per call "path" takes over "base" (jax's C++ dispatch), timed interleaved."""
    t = time_interleaved(variants, [x], samples=5, min_sample_s=0.005)
    return max(0.0, t["path"].median - t["base"].median)


@functools.cache
def python_path_overhead_s() -> float:
    """Extra host seconds per call of a signature on optimize's Python call path over jax's C++
    dispatch (which the fast path and jax.jit use), measured once per process on a tiny program.
    schedule="auto" charges it to candidates that need that path (thunky)."""
    from ..api import optimize

    x = jnp.zeros((8,), jnp.float32)
    python_path = optimize(_tiny, schedule="xla").python_path_only()
    return _extra_host_s({"base": jax.jit(_tiny), "path": python_path}, x)


@functools.cache
def fast_path_frame_s() -> float:
    """Extra host seconds per call of `Optimized.__call__` (the fast path's Python frame) over the
    call with no Python of jaxrw's (state "jit": the class's `__call__` is the jit), measured once
    per process on a tiny program. A program kept as written runs with no Python unless auto picks
    an XLA mode for it, so auto charges this to those modes (on the H200 host: 1.67 µs; picks for
    kept programs measured 1.12-1.49x when built ran 0.97-1.07x: bench/HISTORY.md, eleventh lease)."""
    from ..api import Optimized, optimize

    x = jnp.zeros((8,), jnp.float32)
    kept = optimize(_tiny, schedule="xla")
    kept(x)  # nothing to rewrite: state "jit"
    if kept._fast_state != "jit":
        return python_path_overhead_s()
    return _extra_host_s({"base": kept, "path": functools.partial(Optimized.__call__, kept)}, x)


def kept_terms(kept: bool) -> dict[str, Any]:
    """What a schedule must beat to be taken, as keyword arguments of schedule_selection and
    select_xla_mode: for a program kept as written KEPT_MARGIN, and modes pay the Python frame
    they add to its calls (XLA's schedule runs it with no Python of jaxrw's); else MEASURED_MARGIN."""
    return {
        "margin": KEPT_MARGIN if kept else MEASURED_MARGIN,
        "mode_overhead": fast_path_frame_s if kept else None,
    }


# XLA's modes are not compiled for a program whose own first call (compilation) took longer than
# this: each mode is another whole compilation. On the H200 (bf16 run s) the programs past it were
# gated_mlp_const, experts_equal, llama288_const (2.5-3.4 s: 7-8 s of timing modes, none kept or
# faster in the bench) and the GPT training step (past the bench's 20 s limit with the modes)
COMPILE_LIMIT_S = 2.0
# a function's first-call seconds under jax.jit, by the function: a second jax.jit of it shares the
# first's executable, so its own first call is no measure of the compilation. When the rewrite was
# confirmed (choice.confirm_rewrite) the program auto schedules next had been compiled there: the
# gate above let gpt_train_step's modes compile in the nineteenth lease (schedule phase 19-26 s)
_FIRST_CALL_S: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
SAMPLE_S = 0.005  # seconds per timed sample when auto compares candidate schedules
# an undecided pick (the margin by its median round, a gain in fewer than three rounds of four) is
# timed again over this many times the rounds, against base alone, and judged on that timing
UNDECIDED_ROUNDS_FACTOR = 3
# peak memory a candidate may add beyond the relative slack: XLA's concurrent command buffers keep a
# few KiB of bookkeeping (llama288's decode step: 7 KiB over 102 MiB, for 1.3x on the H200)
PEAK_ALLOWANCE_BYTES = 1 << 20
# a candidate whose predicted peak (a thunky plan's buffers) is over this many times the bound is
# refused without compiling it. Plan peak over jax.jit's (XLA's analysis on a CPU) against what
# thunky measured on the H200: experts_equal f32 6.3x / 4.9x and bf16 6.2x / 3.1x (a 15-20 s
# compilation), diag_scale f32 2.56x / 2.55x, diag_product 1.33x / 1.32x, qkv_args_prefill
# 1.0x / 1.09x, experts_packed 0.96x / 1.51x (bench/HISTORY.md, eighteenth lease). Only
# over-predictions matter here; the largest seen is 2.0x, so 3 leaves room
PREDICTED_PEAK_FACTOR = 3.0


def _agree(got: Any, want: Any) -> bool:
    """A candidate's output against base's: within the dtype's tolerance; PRNG keys by their bits."""
    if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
        return bool(np.array_equal(jax.random.key_data(got), jax.random.key_data(want)))
    return relative_error(got, want) <= tolerance(want.dtype)


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


def device_inputs(leaves: Sequence[Any]) -> list[Any]:
    """The call's own arguments as device arrays, to time candidates on: nothing to generate or
    compile (drawing random inputs compiled one small program per distinct shape, 1-2 s for a
    model's parameters, more than the candidates themselves). Non-jax leaves (numpy arrays, Python
    scalars) are put on the device once, so no timed call pays a host transfer. A floating leaf
    that is all zeros (a zero-initialized weight) or holds a NaN or Inf is replaced by random
    values of its shape: GEMMs on zeros run faster than on data, and non-finite values take
    other paths (DESIGN.md: never time on zeros)."""
    out = [x if isinstance(x, jax.Array) else jax.device_put(x) for x in leaves]
    floats = [i for i, x in enumerate(out) if jnp.issubdtype(x.dtype, jnp.inexact) and x.size]
    if not floats:
        return out
    flags = _degenerate([out[i] for i in floats])  # one program for all leaves: no compile per shape
    bad = [i for i, flag in zip(floats, np.asarray(flags), strict=True) if flag]
    fresh = random_inputs([jax.ShapeDtypeStruct(out[i].shape, out[i].dtype) for i in bad]) if bad else []
    for i, x in zip(bad, fresh, strict=True):
        out[i] = x
    return out


@jax.jit
def _degenerate(xs: list[Any]) -> Any:
    """Per leaf: all zeros, or some value not finite."""
    return jnp.stack([jnp.all(x == 0) | ~jnp.all(jnp.isfinite(x)) for x in xs])


def memory_parts(jitted: Any, args: Sequence[Any]) -> dict[str, int]:
    """XLA's memory_analysis() of a jitted function at `args`, in bytes: argument, output, temp,
    alias, `bound` (constants a thunky program takes as arguments, direct.py, or that jax >= 0.12.1
    passes jax.jit as hidden arguments: the weights, not the call's own memory, so left out) and
    the peak they make. Raises where it is unknown."""
    lowered = jitted.lower(*args)
    m = lowered.compile().memory_analysis()
    if m is None:
        raise ScheduleError("memory_analysis() returned None")
    parts = {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp", "alias")}
    parts["bound"] = int(getattr(jitted, "bound_bytes", 0)) + compat.hidden_constant_bytes(lowered)
    parts["peak"] = parts["argument"] + parts["output"] + parts["temp"] - parts["alias"] - parts["bound"]
    return parts


def peak_bytes(jitted: Any, args: Sequence[Any]) -> int | None:
    """Peak device memory of a jitted function from XLA's memory_analysis() (None if unknown)."""
    try:
        return memory_parts(jitted, args)["peak"]
    except Exception:  # noqa: BLE001 - memory analysis is optional on some backends
        return None


def compile_side_by_side(fns: Iterable[Callable], args: Sequence[Any]) -> None:
    """Compile the jitted `fns` for `args` at once, one thread each, so that their first calls find
    them compiled: XLA releases the GIL while it compiles, and each of auto's candidates is a
    whole compilation of the program (one to three seconds each for the transformer models on the
    H200 host). Tracing and lowering stay on this thread. Only with 4 or more CPU cores; a failure
    here is left for the candidate's first call to meet."""
    fns = list(fns)
    if len(fns) < 2 or (os.cpu_count() or 1) < 4:
        return
    lowered = []
    for f in fns:
        try:
            lowered.append(f.lower(*args))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not a jit, or it fails: its first call says so
            continue
    if len(lowered) < 2:  # one compiles as fast on its first call; none: nothing to do
        return
    with ThreadPoolExecutor(max_workers=len(lowered)) as pool:
        for _ in pool.map(_compile_quietly, lowered):
            pass


def _compile_quietly(lowered: Any) -> None:
    try:
        lowered.compile()
    except Exception:  # noqa: BLE001 - met again by the first call, which reports it
        pass


def pick_fastest(
    base: Callable,
    trial: dict[str, Callable],
    flat_specs: Sequence[Any],
    name: str,
    rounds: int = 9,
    memory_slack: float | None = 0.0,
    overhead: Mapping[str, Callable[[], float]] | None = None,
    notes: list[str] | None = None,
    launch_s: float | None = None,
    launch_bound: Sequence[str] = (),
    inputs: Sequence[Any] | None = None,
    margin: float = MEASURED_MARGIN,
    predicted_peak: Mapping[str, int] | None = None,
) -> tuple[str, float] | None:
    """The candidate measurably faster than `base` (by `margin`, with a peak memory at most
    `memory_slack` plus PEAK_ALLOWANCE_BYTES above base's; None: no bound, and no memory
    analysis asked for) and its speedup, or None.

    Timed interleaved as the benchmarks time (rewrite.measure) and judged round by round: the
    median round must show the margin, and three rounds of four a gain, in each of two separate
    timings (the second of base and the pick alone; the lower gain is returned). A first timing
    with the margin but not the steadiness is replaced by one of base and that candidate over
    UNDECIDED_ROUNDS_FACTOR times the rounds, and the second timing is as long. A candidate named
    in `overhead` also pays `overhead[name]()` seconds per call: the host time of the call path it
    needs and `base` does not (a 3% faster program is no gain when each call costs ~10 µs more to
    issue). `notes` collects what each candidate
    measured ("xla-graphs 0.99x"), or why it was refused ("xla-concurrent +12.0% peak memory").
    Candidates in `launch_bound` can only save kernel-launch time, at most `launch_s` a call: they
    are not compiled when that is under the margin of base's measured time, nor when base's first
    call (its compilation) took longer than COMPILE_LIMIT_S. `inputs`: concrete arguments to time
    on (the call's own, see `device_inputs`); default random ones of `flat_specs`.
    `predicted_peak`: bytes per candidate (a thunky plan's); one over PREDICTED_PEAK_FACTOR times
    the bound is refused before it is compiled. One whose results differ from base's by more than
    `tolerance` is refused when it first runs. A pick's peak against base's ends `notes`
    ("peak memory +0.1%") where both are known."""
    notes = [] if notes is None else notes
    args = list(inputs) if inputs is not None else random_inputs(flat_specs)
    t = time.perf_counter()
    want = jax.tree_util.tree_leaves(jax.block_until_ready(base(*args)))
    compile_s = first_call_s(base, time.perf_counter() - t)  # mostly compilation
    base_s = time_call(base, args, 3)
    if launch_s is not None and launch_bound and launch_s < margin * base_s:
        notes.append(f"kernel launches ≤ {launch_s / base_s:.1%} of a call")
        trial = {k: f for k, f in trial.items() if k not in launch_bound}
    elif compile_s > COMPILE_LIMIT_S and any(k in trial for k in launch_bound):
        notes.append(f"compiling took {compile_s:.1f} s")
        trial = {k: f for k, f in trial.items() if k not in launch_bound}
    if not trial:
        return None
    # after the gate; the analysis reuses the executable base's first call compiled
    base_peak = None if memory_slack is None else peak_bytes(base, args)
    compile_side_by_side([f for k, f in trial.items() if k in launch_bound], args)  # XLA's modes
    limit = None if base_peak is None else base_peak * (1 + memory_slack) + PEAK_ALLOWANCE_BYTES
    ok: dict[str, Callable] = {}
    peaks: dict[str, int] = {}  # of the candidates whose peak is known
    for label, f in trial.items():
        guess = (predicted_peak or {}).get(label)
        if limit is not None and base_peak and guess is not None and guess > PREDICTED_PEAK_FACTOR * limit:
            notes.append(f"{label} predicted {guess / base_peak - 1:+.0%} peak memory")
            continue
        try:
            t = time.perf_counter()
            got = jax.tree_util.tree_leaves(jax.block_until_ready(f(*args)))
            first_call_s(f, time.perf_counter() - t)
            if [g.shape for g in got] != [w.shape for w in want]:
                raise ScheduleError("outputs differ in shape from jax.jit's")
            wrong = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not _agree(g, w)]
            if wrong:  # a miscompiled or racing schedule: kept out, whatever its speed
                raise ScheduleError(f"outputs {wrong} differ in value from jax.jit's")
            peak = None if memory_slack is None else peak_bytes(f, args)
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
            ok[label] = f
            if peak is not None:
                peaks[label] = peak
        except Exception as e:  # noqa: BLE001 - auto never breaks the program; it keeps XLA's schedule
            log.warning(
                "jaxrw: %s schedule of %s failed (%s: %s); not used", label, name, type(e).__name__, e
            )
            notes.append(f"{label} failed")
    if not ok:
        return None
    # the benchmarks' timing (rewrite.measure): samples of ~SAMPLE_S each, in an order rotated per
    # round, each after one untimed call. A fixed order with short samples picked modes measured
    # 1.03-1.04x that ran 0.96x in the H200 bench (run r)
    variants = {"xla": (base, tuple(args)), **{k: (f, tuple(args)) for k, f in ok.items()}}
    timing = functools.partial(measure, repeats=rounds, sample_s=SAMPLE_S, max_calls=2000, warmup=1)
    timed = timing(variants)
    overhead = overhead or {}
    paid = {k: overhead[k]() if k in overhead else 0.0 for k in ok}
    judged = {k: _judge(timed, k, paid[k]) for k in ok}
    best = max(ok, key=lambda k: judged[k][0])
    log.info(
        "jaxrw: %s measured (µs, candidates with their call path's): xla %.1f, %s",
        name,
        timed["xla"].median * 1e6,
        ", ".join(f"{k} {(timed[k].median + paid[k]) * 1e6:.1f}" for k in ok),
    )
    notes.extend(f"{k} {judged[k][0]:.2f}x" for k in ok)
    need = 1 / (1 - margin)
    gain, steady = judged[best]
    pair, pair_rounds = {"xla": variants["xla"], best: variants[best]}, rounds  # timed alone from here
    if gain >= need and not steady:
        # undecided: faster by the median round, but not in three rounds of four. Nine rounds of
        # ~10 calls each do not settle that for a host-bound program: on the H200 the hoisted decode
        # step's xla-concurrent measured 1.10-1.15x unsteady in two leases, while the same mode, taken
        # for the step without hoisting, ran 1.28x in the bench. A longer timing of the two decides
        pair_rounds = UNDECIDED_ROUNDS_FACTOR * rounds  # and the second timing as long
        gain, steady = _judge(timing(pair, repeats=pair_rounds), best, paid[best])
        notes.append(f"{best} over {pair_rounds} rounds {gain:.2f}x")
    if gain < need or not steady:
        return None
    # a second, separate timing must agree: on the H200 host picks measured 1.12-1.49x when built
    # ran 0.97-1.07x (bench/HISTORY.md, eleventh lease), so one timing is not taken on its own word
    again = timing(pair, repeats=pair_rounds)
    gain2, steady2 = _judge(again, best, paid[best])
    notes.append(f"{best} again {gain2:.2f}x")
    if gain2 < need or not steady2:
        return None
    if best in peaks and base_peak:  # what the pick costs in memory (issue 6 asks for none)
        notes.append(f"peak memory {peaks[best] / base_peak - 1:+.1%}")
    return best, min(gain, gain2)


def first_call_s(jitted: Any, seconds: float) -> float:
    """The longest first call seen of the function `jitted` is a jax.jit of, `seconds` included
    (recorded for later jits of it, which share its executable); `seconds` where it is no jit."""
    fn = getattr(jitted, "__wrapped__", None)
    if fn is None:
        return seconds
    try:
        seconds = max(seconds, _FIRST_CALL_S.get(fn, 0.0))
        _FIRST_CALL_S[fn] = seconds
    except TypeError:  # not weakly referenceable: nothing recorded
        pass
    return seconds


def _judge(timed: Mapping[str, Any], name: str, paid: float) -> tuple[float, bool]:
    """(median over rounds of base's time over candidate `name`'s, call path `paid` included;
    whether it was faster at all in three rounds of four). Round by round: a change of clock or
    load between rounds moves both alike (rewrite.measure.paired_ratio). A pick measured
    1.09-1.13x by medians, and not steady, ran 0.91-0.93x in the H200 bench (run s/t)."""
    ratios = round_ratios(timed["xla"].samples, [c + paid for c in timed[name].samples])
    if not ratios:
        return 0.0, False
    return statistics.median(ratios), sorted(ratios)[len(ratios) // 4] > 1.0

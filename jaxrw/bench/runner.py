"""Run benchmark cases side by side (jax.jit, jaxrw, hand-optimized) and collect JSON-ready results.

Per case: build the instance, optimize with jaxrw (timed, with a deadline), time the variants
interleaved (`timing.measure`), then check each variant on fresh inputs against a float64
reference. A failing case is recorded with its error and the run goes on; nothing is dropped.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import importlib.metadata
import inspect
import math
import os
import platform
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import compat
from ..api import optimize, relative_error, tolerance
from ..errors import Interrupt
from ..hoist import HANDOFF_AFTER
from ..options import disabled
from ..rewrite.measure import MIN_INTERVAL_ROUNDS
from ..rewrite.measure import settle as settle_pairs
from ..rewrite.run import StopReason
from .case import Case, Instance
from .report import AT_LEAST, MATCHED, matched_speedup, paired_speedup, speedup_interval
from .timing import measure

__all__ = [
    "Options",
    "run_case",
    "run",
    "environment",
    "git_commit",
    "reference",
    "OptTimeout",
    "optimize_supports",
    "skipped",
]


@dataclass
class Options:
    """How to run: size and dtype, samples, deadlines. `None` fields take size-dependent defaults."""

    size: str = "small"
    dtype: str = "float32"
    repeats: int = 5
    sample_s: float | None = None  # None: 10 ms on CPU, 20 ms on accelerators
    autotune: bool = False
    # per-case optimization deadline; None: 20 s small, 300 s large; 0: none
    opt_timeout_s: float | None = None
    warmup: int = 2
    include_heavy: bool = False  # run cases marked heavy at the small size too
    jaxrw: bool = True  # False: jax.jit, hand and the float64 check only (tests of costly cases)
    in_jit: bool = True  # also time jaxrw called inside an outer jax.jit
    budget_s: float | None = None  # start no new case after this many seconds; None: 150 s small, none large
    # rounds in all while jaxrw's speedup interval straddles AT_LEAST (`settle`); None: `repeats` at
    # the small size, raised to MIN_INTERVAL_ROUNDS (`make bench` has 3 minutes), 6x `repeats` at the
    # large one
    max_rounds: int | None = None
    settle_s: float = 30.0  # and at most this many seconds of such rounds per case
    iterations: int | None = None  # jaxrw's saturation iterations (Limits.iterations); None: its default

    def budget(self) -> float:
        """The run's time budget (0: none). `make bench` must finish in 3 minutes on a 2-core CPU."""
        if self.budget_s is not None:
            return self.budget_s
        return 150.0 if self.size == "small" else 0.0

    def opt_deadline(self) -> float:
        if self.opt_timeout_s is not None:
            return self.opt_timeout_s
        return 20.0 if self.size == "small" else 300.0

    def round_limit(self) -> int:
        """Rounds in all while a speedup's interval straddles 0.98x: at the small size enough for
        the interval to exist (MIN_INTERVAL_ROUNDS; with the default 5 repeats every case read
        "unresolved ... too few rounds", a 15x one too), at the large size 6x the repeats."""
        if self.max_rounds is not None:
            return max(self.max_rounds, self.repeats)
        return max(self.repeats, MIN_INTERVAL_ROUNDS) if self.size == "small" else 6 * self.repeats

    def sample_seconds(self) -> float:
        if self.sample_s is not None:
            return self.sample_s
        return 0.01 if jax.default_backend() == "cpu" else 0.02


class OptTimeout(Interrupt):  # an Interrupt, so optimize()'s fallback does not swallow it
    """The optimization of one case ran past its deadline."""


class _Skip(Exception):  # noqa: N818
    """The case cannot run as specified here; it is listed as skipped with the reason."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise OptTimeout in the main thread after `seconds` (no-op where SIGALRM is unavailable).

    A raise inside a finalizer or gc callback is swallowed by Python, so after each raise the
    alarm is re-armed 50 ms later until the block is left."""
    usable = seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return
    armed = [True]

    def fire(signum: int, frame: Any) -> None:
        if not armed[0]:
            return
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        raise OptTimeout(f"optimization exceeded {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _x64() -> contextlib.AbstractContextManager:
    """A context with 64-bit types on. jax >= 0.8 (incl. 0.11, 0.12) has jax.enable_x64(bool);
    older releases had jax.experimental.enable_x64()."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is not None:
        return ctx(True)
    from jax.experimental import enable_x64  # pragma: no cover - jax < 0.8

    return enable_x64()


def reference(fn: Callable, args: tuple) -> list[np.ndarray]:
    """The outputs of `fn` computed in float64 (every floating input upcast), as NumPy arrays.
    64-bit mode is on only inside this call."""
    with _x64():
        up = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if _floating(a) else a, args)
        out = jax.jit(fn)(*up)
        return [
            np.asarray(x, dtype=np.float64) if _floating(x) else np.asarray(x) for x in jax.tree.leaves(out)
        ]


def _floating(a: Any) -> bool:
    return hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)


def max_relative_error(got: Any, want: list[np.ndarray]) -> float:
    """The largest norm-wise relative error over the output leaves."""
    leaves = jax.tree.leaves(got)
    if len(leaves) != len(want):
        return float("inf")
    # relative_error widens both sides itself (complex to complex128, the rest to float64)
    return max((relative_error(g, w) for g, w in zip(leaves, want, strict=True)), default=0.0)


def optimize_supports(option: str) -> bool:
    """Whether this jaxrw's optimize() takes the keyword `option`."""
    return option in inspect.signature(optimize).parameters


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:500]


def run_case(case: Case, opts: Options) -> dict[str, Any]:
    """Run one case at opts.size/opts.dtype; return its JSON-ready record (status 'ok' or 'error')."""
    rec: dict[str, Any] = {
        "suite": case.suite,
        "case": case.name,
        "doc": case.doc,
        "size": opts.size,
        "dtype": opts.dtype,
        "status": "ok",
        "error": None,
        "notes": [],
        "variants": {},
        "tolerance": tolerance(opts.dtype),
    }
    t_case = time.perf_counter()
    try:
        inst = case.instance(opts.size, opts.dtype)
        rec["shape"], rec["hand_label"] = inst.shape, inst.hand_label if inst.hand else None
        _run(inst, opts, rec)
    except _Skip as e:
        rec["status"] = "skipped"
        rec["notes"].append(str(e))
    except OptTimeout as e:  # raised outside optimization: treat as an error of the case
        rec["status"], rec["error"] = "error", _describe(e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - one broken case must not hide the others; egglog's
        # Rust panics arrive as pyo3 PanicException, a BaseException
        rec["status"], rec["error"] = "error", _describe(e)
        rec["traceback"] = traceback.format_exc(limit=8)
    rec["case_s"] = time.perf_counter() - t_case
    gc.collect()
    if opts.size == "large":  # free executables (and constants baked into them) between big cases
        jax.clear_caches()
    return rec


def _run(inst: Instance, opts: Options, rec: dict[str, Any]) -> None:
    args, check = inst.args(1), inst.args(2)
    kwargs = dict(inst.opt_kwargs)
    missing = [k for k in kwargs if not optimize_supports(k)]
    if missing and opts.jaxrw:  # without the option the case is its base case again: no time on a copy
        raise _Skip(f"optimize() has no {', '.join(map(repr, missing))} option yet")
    if opts.autotune:
        kwargs["autotune"] = True
    if opts.iterations is not None:
        kwargs["limits"] = {**kwargs.get("limits", {}), "iterations": opts.iterations}
    options = {k: v for k, v in kwargs.items() if k not in missing}
    rw = optimize(inst.fn, **options)
    report, rec["opt_timeout"], rec["opt_s"], rec["fallback"] = None, False, None, None
    if opts.jaxrw:
        report = _optimize(rw, args, opts, rec)
    else:
        rec["notes"].append("jaxrw not run (reference check only)")
    # None where the build failed (the record's `fallback` says why), as the tables read it
    built = report is not None and report.stop_reason is not StopReason.FAILED
    rec["report"] = report.to_dict() if built else None

    variants: dict[str, tuple[Callable, tuple]] = {"jax.jit": (jax.jit(inst.fn), args)}
    if opts.jaxrw and not rec["opt_timeout"]:
        variants["jaxrw"] = (rw, args)
    # where jaxrw runs the original program (fallback, or the guard kept it) the in-jit variant
    # would compile to jax.jit's own program: not timed (saves a compile per case on the GPU)
    same = report is None or not report.rewritten
    if "jaxrw" in variants and opts.in_jit and same:
        # jaxrw runs the original program, compiled as its own jit: a second jax.jit of the same
        # function, compiled apart from the first, shows how far two compiles of one program
        # differ on this device (the floor under a kept case's speedup)
        variants["jax.jit#2"] = (jax.jit(lambda *a: inst.fn(*a)), args)
    if "jaxrw" in variants and opts.in_jit and not same:
        # the same program called from inside an outer jax.jit, as in a jitted training loop: jax's
        # C++ dispatch instead of optimize()'s Python wrapper (what remains is the rewrite's effect)
        variants["jaxrw@jit"] = (jax.jit(rw), args)
    if "jaxrw" in variants and {"hoist_argnums", "hoist_argnames"} & set(kwargs):
        # hoisted work is cached per argument identity; the worst case is new weights on every call,
        # a training loop: its own instance (so what it does cannot change what the other variants
        # time), first called on the step-0 weights (hoisted), then on argument sets none of which
        # is cached, each differing from the call before, timed in its steady state, after
        # HANDOFF_AFTER such calls have handed the signature to jax.jit's program (compared with
        # jax.jit called the same way: new arrays cost jax.jit something too)
        new_sets = [inst.args(seed) for seed in NEW_ARG_SEEDS]
        fresh = optimize(inst.fn, **options)
        jax.block_until_ready(fresh(*inst.args(STEP0_SEED)))
        variants["jaxrw:new-args"] = (_rotating(fresh, new_sets), ())
        for _ in range(HANDOFF_AFTER + len(new_sets)):
            variants["jaxrw:new-args"][0]()
        variants["jax.jit:new-args"] = (_rotating(variants["jax.jit"][0], new_sets), ())
        if hasattr(rw, "bind") and not kwargs.get("hoist_argnames"):
            # the hoisted arguments fixed once (Optimized.bind): one jax.jit dispatch per call
            fixed = set(kwargs.get("hoist_argnums", ()))
            variants["jaxrw:bind"] = (rw.bind(*args), tuple(a for i, a in enumerate(args) if i not in fixed))
    hand = None
    if inst.hand is not None:
        hand = jax.jit(inst.hand)
        variants["hand"] = (hand, inst.hand_prep(args) if inst.hand_prep else args)
    timings = measure(variants, repeats=opts.repeats, sample_s=opts.sample_seconds(), warmup=opts.warmup)
    settle(variants, timings, opts, rec)
    for name, tm in timings.items():
        rec["variants"][name] = tm.to_dict()

    # numerics on fresh inputs, against float64
    want = reference(inst.fn, check)
    checks: dict[str, tuple[Callable, tuple]] = {"jax.jit": (variants["jax.jit"][0], check)}
    for name in ("jaxrw", "jaxrw@jit"):
        if name in variants:
            checks[name] = (variants[name][0], check)
    if hand is not None:
        checks["hand"] = (hand, inst.hand_prep(check) if inst.hand_prep else check)
    outs = {name: fn(*a) for name, (fn, a) in checks.items()}
    jit_out = [np.asarray(x) for x in jax.tree.leaves(outs["jax.jit"])]
    for name, out in outs.items():
        rec["variants"][name]["rel_err"] = max_relative_error(out, want)
        if name.startswith("jaxrw"):  # where jax.jit itself overflows, the comparison that counts
            rec["variants"][name]["rel_err_vs_jit"] = max_relative_error(out, jit_out)
    if "jaxrw:bind" in variants:  # bound to the timing arguments: compared with jaxrw's call on them
        bound, fast = variants["jaxrw:bind"]
        ref = [np.asarray(x) for x in jax.tree.leaves(rw(*args))]
        rec["variants"]["jaxrw:bind"]["rel_err_vs_jaxrw"] = max_relative_error(bound(*fast), ref)

    v = rec["variants"]
    base = v["jax.jit"]["median_s"]
    rec["speedup"] = base / v["jaxrw"]["median_s"] if "jaxrw" in v else None
    rec["speedup_paired"] = paired_speedup(rec)  # the same, as the median of per-round ratios
    rec["speedup_interval"] = speedup_interval(rec)  # its 95% interval (`settle`)
    for key, name in MATCHED.items():  # hand, in-jit, bound, a second jax.jit: over their own rounds
        if name in v or key in ("speedup_in_jit", "hand_speedup"):
            rec[key] = matched_speedup(rec, name)
    if "jaxrw:new-args" in v:
        rec["speedup_new_args"] = v["jax.jit:new-args"]["median_s"] / v["jaxrw:new-args"]["median_s"]
        rec["speedup_new_args_paired"] = paired_speedup(rec, "jaxrw:new-args", "jax.jit:new-args")
        rec["speedup_new_args_interval"] = speedup_interval(rec, "jaxrw:new-args", "jax.jit:new-args")
    rec["numerics_ok"] = numerics_ok(v, rec["tolerance"])
    if "hand" in v:  # the hand-written version is the suite's, not jaxrw's: reported apart
        rec["hand_numerics_ok"] = numerics_ok(v, rec["tolerance"], ("hand",))


def numerics_ok(v: dict, tol: float, names: tuple[str, ...] = ("jaxrw", "jaxrw@jit")) -> bool:
    """Whether the variants `names` (those present) are within max(tol, 2 x jax.jit's error) of
    float64's result. Where jax.jit's own result is not finite and float64's is, that bound is
    infinite and passed anything: a variant must then be within `tol` of float64's result or of
    jax.jit's (`rel_err_vs_jit`)."""
    e_jit = v["jax.jit"]["rel_err"]
    present = [n for n in names if n in v]
    if math.isfinite(e_jit):
        return all(v[n]["rel_err"] <= max(tol, 2 * e_jit) for n in present)
    return all(min(v[n]["rel_err"], v[n].get("rel_err_vs_jit", math.inf)) <= tol for n in present)


# (jaxrw's variant, its base, controls sampled alongside): the pairs `settle` resolves
SETTLED_PAIRS = (("jaxrw", "jax.jit", ("jax.jit#2",)), ("jaxrw:new-args", "jax.jit:new-args", ()))


def settle(variants: dict[str, tuple[Callable, tuple]], timings: dict, opts: Options, rec: dict) -> None:
    """Sample on while a speedup's 95% interval straddles AT_LEAST (issue 4's "never below 0.98x"):
    `measure.settle` of jaxrw against jax.jit (with the second jax.jit, the control of a kept
    program) and of the new-weights pair, up to `opts.round_limit()` rounds or `opts.settle_s`."""
    added = settle_pairs(variants, timings, SETTLED_PAIRS, AT_LEAST, opts.round_limit(), opts.settle_s)
    if added:
        rec["notes"].append(
            f"{added} more round{'' if added == 1 else 's'} to settle the {AT_LEAST}x interval"
        )


def skipped(case: Case, opts: Options, why: str) -> dict[str, Any]:
    """The record of a case that was not run, saying why."""
    return {
        "suite": case.suite,
        "case": case.name,
        "doc": case.doc,
        "size": opts.size,
        "dtype": opts.dtype,
        "status": "skipped",
        "error": None,
        "notes": [why],
        "variants": {},
        "tolerance": tolerance(opts.dtype),
    }


NEW_ARG_SEEDS = (3, 4, 5)
STEP0_SEED = 6  # the weights a new-arguments variant first sees (then never again)


def _rotating(fn: Callable, sets: list[tuple]) -> Callable:
    """A no-argument callable that calls fn on each argument set in turn."""
    i = [0]

    def call() -> Any:
        i[0] = (i[0] + 1) % len(sets)
        return fn(*sets[i[0]])

    return call


def _optimize(rw: Any, args: tuple, opts: Options, rec: dict[str, Any]) -> Any:
    """Trace, rewrite, extract and decode (compilation is timed with the first call), within the
    deadline; fill opt_s, opt_timeout and fallback (the cause); return the RewriteReport, None
    past the deadline."""
    report = None
    with warnings.catch_warnings(record=True):  # a fallback's warning: the record says why
        warnings.simplefilter("always")
        t = time.perf_counter()
        try:
            with deadline(opts.opt_deadline()):
                report = rw.report(*args)
        except OptTimeout as e:
            rec["opt_timeout"] = True
            rec["notes"].append(str(e) + "; jaxrw not timed")
        rec["opt_s"] = time.perf_counter() - t
    rec["fallback"] = report.fallback if report is not None and report.fallback else None
    return report


def environment(opts: Options) -> dict[str, Any]:
    """Where and with what the numbers were taken."""

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    dev = jax.devices()[0]
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": jax.default_backend(),
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "egglog": version("egglog"),
        "jaxrw": version("jaxrw"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv,
        "size": opts.size,
        "dtype": opts.dtype,
        "repeats": opts.repeats,
        "jaxrw_disabled": disabled(),  # JAXRW_DISABLE: "jaxrw" timed jax.jit's program
        "max_rounds": opts.round_limit(),
        "settle_s": opts.settle_s,
        "sample_s": opts.sample_seconds(),
        "autotune": opts.autotune,
        "iterations": opts.iterations,
        "opt_timeout_s": opts.opt_deadline(),
        "budget_s": opts.budget(),
        "commit": git_commit(),
        "profile": _profile_in_use(),
    }


def _profile_in_use() -> dict[str, Any]:
    """The cost-model profile jaxrw takes by default here (built-in, or a saved one) and its
    switches: what an A/B of a profile setting (bench/gpu_session.sh transpose, chains) compared."""
    from ..rewrite.profiles import default_profile

    p = default_profile(compat.device_kind())
    return {
        "name": p.name,
        "source": p.source,
        "transpose_folded": p.transpose_folded,
        "lhs_transposed_copied": p.lhs_transposed_copied,
        "concat_chains": p.concat_chains,
    }


def git_commit() -> str | None:
    """The checkout's commit (and '+dirty' with local changes), when run from a git checkout, or
    JAXRW_COMMIT when set: a copy of the tree on another machine can carry a stale `.git`."""
    import re
    import subprocess

    given = os.environ.get("JAXRW_COMMIT", "")
    if re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", given):
        return given

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run(cases: list[Case], opts: Options, on_case: Callable[[Case, dict | None], None] | None = None) -> dict:
    """Run `cases` in order; `on_case(case, None)` before and `on_case(case, record)` after each."""
    t0 = time.perf_counter()
    meta = environment(opts)
    records: list[dict] = []
    interrupted = False
    for case in cases:
        if opts.dtype not in case.dtypes:
            continue
        if on_case:
            on_case(case, None)
        spent = time.perf_counter() - t0
        if interrupted:
            rec = skipped(case, opts, "the run was interrupted (Ctrl-C)")
        elif opts.budget() and spent > opts.budget():
            why = f"the run's time budget of {opts.budget():g} s was spent; run it with --case {case.name}"
            rec = skipped(case, opts, why)
        elif case.heavy and opts.size == "small" and not opts.include_heavy:
            rec = skipped(
                case,
                opts,
                "heavy at the small size: skipped by default to keep `make bench` short; "
                f"run it with --case {case.name}",
            )
        else:
            try:
                rec = run_case(case, opts)
            except KeyboardInterrupt:  # the cases done are kept: the rest are listed as skipped
                interrupted = meta["interrupted"] = True
                rec = skipped(case, opts, "the run was interrupted (Ctrl-C) during this case")
        records.append(rec)
        if on_case:
            on_case(case, rec)
    meta["total_s"] = time.perf_counter() - t0
    from .report import summarize_suites

    return {"schema": 1, "meta": meta, "cases": records, "summary": summarize_suites(records)}

"""Differential fuzzing of `optimize` against jax.jit: `python -m jaxrw.bench.fuzz --examples N`.

Each example is a random program spec (`fuzzgen.programs`): it runs under jax.jit and under
`optimize(strict=True)` with the spec's options, and the results are compared:

- shapes, dtypes and weak types must be equal; integer and boolean results bit-identical;
- with `numerics="strict"` every result must be bit-identical to jax.jit, except where a rule that
  merges, batches or transposes a dot fired, or any rule in a program with a dot (XLA fuses a dot
  with its operands' producers and sums it by that fusion): XLA may then sum that dot in another order
  (docs/numerics.md), and the float results are held to the default bounds below; the same where
  hoisting split the program into a prologue and a main program (XLA on CPU vectorizes `tanh`
  over a [1, 2, 4] array and over its [8] reshape differently: a few ULP);
- otherwise float results must be finite exactly where jax.jit's are, and their norm-wise error
  against a float64 reference (the same program run with every float widened to float64, and
  rounded where the program converts) may be at most max(BASE[dtype], 10 x jax.jit's own error),
  dtype the least precise float type the program computes in;
- that holds too where the spec puts a NaN or Inf into an input (`options["poison"]`): a NaN may
  become ±Inf, but inexact rules leave values that reach a saturating function alone
  (docs/numerics.md); only "fast" may differ there (finite-only rules).

One example in `STAGES_EVERY` (by its seed) also checks the optimized function's jax.jit stages:
`eval_shape` gives jax.jit's shapes, dtypes and weak types, and `lower(...).compile()` gives
results held to the same bounds.

An exception from `optimize` or from the program it built is a *crash*; a result outside those
bounds a *mismatch*. The command runs hypothesis, shrinks each failure to a minimal spec, saves
it to a regressions file (JSON, replayed by tests/fuzz/test_regressions.py) and prints counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..api import optimize
from ..errors import VerificationError
from ..rewrite.run import Limits
from .fuzzgen import programs
from .fuzzprog import build, make_inputs

__all__ = ["Outcome", "check", "BASE", "main"]

# Norm-wise relative error always allowed per output dtype (on CPU: no TF32).
BASE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
JIT_FACTOR = 10.0
STAGES_EVERY = 4  # one example in this many also checks optimize's eval_shape and lower().compile()
# exact rules after which XLA may sum a dot in another order (merged, batched, transposed dots)
REORDERING = ("merge.", "batch.", "dot.transpose_in", "dot.transpose_out")


@dataclass
class Outcome:
    status: str  # "ok", "mismatch", "crash" or "invalid" (the generator made a program jax.jit rejects)
    message: str = ""
    rewritten: bool = False
    rules: dict[str, int] = field(default_factory=dict)


def _x64(spec: dict) -> bool:
    return any(p.get("dtype") == "float64" or p.get("to") == "float64" for _, _, p in spec["values"])


def check(spec: dict) -> Outcome:
    """Run one spec through jax.jit and optimize and compare (see the module docstring)."""
    with jax.enable_x64(_x64(spec)):
        return _check(spec)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def _err(got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
    g, r = got.astype(np.float64)[mask], ref[mask]
    num, den = float(np.linalg.norm(g - r)), float(np.linalg.norm(r))
    return num / den if den > 0 else num


def _check(spec: dict) -> Outcome:
    opts = spec["options"]
    fn = build(spec)
    args = make_inputs(spec, opts["seed"])
    try:
        want = jax.block_until_ready(jax.jit(fn)(*args))
    except Exception as e:  # noqa: BLE001 - a generator bug, reported as such
        return Outcome("invalid", f"jax.jit rejects the program: {type(e).__name__}: {e}")
    limits = Limits() if opts.get("min_gain") is None else Limits(min_gain=opts["min_gain"])
    opt = optimize(
        fn,
        strict=True,
        numerics=opts.get("numerics", "default"),
        extractor=opts.get("extractor", "greedy"),
        cost_model=opts.get("cost_model", "roofline"),
        limits=limits,
        verify=bool(opts.get("verify")) and not opts.get("poison"),
        hoist_argnums=(0,) if opts.get("hoist") else None,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = jax.block_until_ready(opt(*args))
            # the second call takes the path of later calls: the hoisted values (hot path), or
            # the class's own __call__ where the program is kept as written (state "jit")
            again = jax.block_until_ready(opt(*args))
            pairs = zip(again, got, strict=True)
            if not all(np.array_equal(_bits(np.asarray(a)), _bits(np.asarray(g))) for a, g in pairs):
                return Outcome("mismatch", f"the second call differs from the first ({opt._fast_state})")
        report = opt.report(*args)
    except VerificationError as e:  # verify=True found what this check would
        return Outcome("mismatch", f"VerificationError: {e}")
    except Exception as e:  # noqa: BLE001 - every exception from optimize is a crash
        tb = traceback.format_exception(e)
        return Outcome("crash", f"{type(e).__name__}: {e}\n{''.join(tb[-6:])}")
    out = Outcome(
        "ok", rewritten=bool(report and report.rewritten), rules=dict(report.rules_fired if report else {})
    )
    ref: list[np.ndarray] = []
    out = _compare(out, got, want, spec, report, ref)
    if out.status != "ok" or opts["seed"] % STAGES_EVERY:
        return out
    try:  # jax.jit's stages of the optimized function: its shapes, and its lowering compiled
        shapes = jax.tree_util.tree_leaves(opt.eval_shape(*args))
        staged = jax.block_until_ready(opt.lower(*args).compile()(*args))
    except Exception as e:  # noqa: BLE001 - a crash of a stage
        tb = traceback.format_exception(e)
        return Outcome("crash", f"stages: {type(e).__name__}: {e}\n{''.join(tb[-6:])}")
    for i, (s, w) in enumerate(zip(shapes, want, strict=True)):
        if (s.shape, s.dtype, s.weak_type) != (w.shape, w.dtype, w.weak_type):
            return _fail(out, f"eval_shape output {i}: {s}, jax.jit gives {jax.typeof(w)}")
    out = _compare(out, staged, want, spec, report, ref)
    if out.status != "ok":
        out.message = f"lowered and compiled: {out.message}"
    return out


def _compare(out: Outcome, got: Any, want: Any, spec: dict, report: Any, ref: list) -> Outcome:
    """`out`, or it failed with the first output of `got` that is not what jax.jit's `want` is
    within the spec's tolerance against the float64 reference (computed once into `ref`)."""
    opts = spec["options"]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        tg, tw = jax.typeof(g), jax.typeof(w)
        if (tg.shape, tg.dtype, tg.weak_type) != (tw.shape, tw.dtype, tw.weak_type):
            return _fail(out, f"output {i}: optimize gives {tg} (weak={tg.weak_type}), jax.jit {tw}")
        gn, wn = np.asarray(g), np.asarray(w)
        if np.array_equal(_bits(gn), _bits(wn)):
            continue
        split = bool(report and report.hoisted_bytes)  # prologue and main: two XLA programs
        if opts.get("numerics") == "strict" and not _reorders(out.rules, spec) and not split:
            return _fail(out, f"output {i}: not bit-identical under numerics='strict'")
        if not np.issubdtype(gn.dtype, np.floating) and str(gn.dtype) != "bfloat16":
            return _fail(out, f"output {i} ({gn.dtype}): differs from jax.jit in {np.sum(gn != wn)} elements")
        fin_g, fin_w = np.isfinite(gn.astype(np.float64)), np.isfinite(wn.astype(np.float64))
        poisoned = bool(opts.get("poison"))
        if poisoned and opts.get("numerics") == "fast":
            pass  # finite-only rules may keep a NaN or Inf of an input from spreading
        elif not np.array_equal(fin_g, fin_w):
            return _fail(
                out,
                f"output {i}: non-finite where jax.jit is finite or the reverse "
                f"({int(np.sum(fin_g != fin_w))} elements{', NaN/Inf input' if poisoned else ''})",
            )
        if not ref:
            ref.extend(reference(spec))
        r = ref[i]
        mask = fin_g & fin_w & np.isfinite(r)
        e_opt, e_jit = _err(gn, r, mask), _err(wn, r, mask)
        allowed = max(_base(spec, str(gn.dtype)), JIT_FACTOR * e_jit)
        if e_opt > allowed:
            return _fail(
                out,
                f"output {i} ({gn.dtype}): error {e_opt:.3g} against float64 > allowed "
                f"{allowed:.3g} (jax.jit's error {e_jit:.3g})",
            )
    return out


def _base(spec: dict, out_dtype: str) -> float:
    """The error always allowed for an output: that of the least precise float type the program
    computes in (a float32 result converted from bfloat16 work carries bfloat16 rounding)."""
    types = {out_dtype} | {p.get(k) for _, _, p in spec["values"] for k in ("dtype", "to")}
    return max(BASE[t] for t in types if t in BASE)


def _reorders(rules: dict[str, int], spec: dict) -> bool:
    """Whether a rule that fired lets XLA sum a dot in another order: docs/numerics.md allows
    "strict" results to differ from jax.jit there. A merged, batched or transposed dot; or any
    rewrite in a program with a dot, since XLA fuses a dot with the ops that produce its operands
    and sums it by how it fused (the same four values summed as a loop after a reduce over a
    concatenation, vectorized after three maxima: 1 ULP apart, found by `make fuzz`)."""
    has_dot = any(op == "dot" for op, _args, _params in spec["values"])
    return any(name.startswith(REORDERING) for name in rules) or (has_dot and bool(rules))


def _fail(out: Outcome, message: str) -> Outcome:
    out.status, out.message = "mismatch", message
    return out


def reference(spec: dict) -> list[np.ndarray]:
    """The spec's outputs with every float widened to float64 (rounded where the program converts)."""
    with jax.enable_x64(True):
        fn = build(spec, x64=True)
        args = make_inputs(spec, spec["options"]["seed"], x64=True)
        return [
            np.asarray(x, dtype=np.float64) if np.asarray(x).dtype != bool else np.asarray(x)
            for x in jax.jit(fn)(*args)
        ]


# --- the command ----------------------------------------------------------------------------------


class _Run:
    """Counts over a hypothesis run; keeps the last failing spec (the shrunk one, at the end)."""

    def __init__(self, progress: int):
        self.counts: Counter[str] = Counter()
        self.rules: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.shrinking = False
        self.last_failure: tuple[dict, Outcome] | None = None
        self.progress = progress
        self.t0 = time.perf_counter()

    def __call__(self, spec: dict) -> None:
        out = check(spec)
        if not self.shrinking:
            self.counts["examples"] += 1
            self.counts[out.status] += 1
            self.counts["rewritten"] += out.rewritten
            self.rules.update({k: 1 for k, v in out.rules.items() if v})
            self.ops.update(v[0] if v[0] != "opq" else "opq." + v[2]["f"] for v in spec["values"])
            n = self.counts["examples"]
            if n % 200 == 0:  # compiled programs of past examples are never called again
                jax.clear_caches()
                gc.collect()
            if self.progress and n % self.progress == 0:
                print(f"  {n} examples, {self.summary_line()}", flush=True)
        if out.status != "ok":
            self.shrinking = True
            self.last_failure = (spec, out)
            raise AssertionError(f"{out.status}: {out.message}")

    def summary_line(self) -> str:
        c = self.counts
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return (
            f"{c['mismatch']} mismatches, {c['crash']} crashes, {c['invalid']} invalid, "
            f"{c['rewritten']} rewritten, {time.perf_counter() - self.t0:.0f}s, peak RSS {rss:.0f} MiB"
        )


def run(
    examples: int, seed: int, max_steps: int, progress: int = 100, save: Path | None = None
) -> tuple[_Run, list[dict]]:
    """Run `examples` programs; returns the counts and the shrunk failures (each also appended
    to `save` as soon as it is shrunk, so a long run that is stopped keeps what it found)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    state = _Run(progress)
    failures: list[dict] = []
    attempt = 0
    while state.counts["examples"] < examples:
        left = examples - state.counts["examples"]
        state.shrinking = False

        @hseed(seed + attempt)
        @settings(
            max_examples=left,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.generate, Phase.shrink],
            report_multiple_bugs=False,
            print_blob=False,
        )
        @given(programs(max_steps=max_steps))
        def body(spec: dict) -> None:
            state(spec)

        try:
            body()
        except Exception:  # noqa: BLE001 - the shrunk failure is in state.last_failure
            if state.last_failure is None:
                raise
            spec, out = state.last_failure
            failures.append(
                {
                    "spec": spec,
                    "status": out.status,
                    "message": out.message.splitlines()[0],
                    "found": date.today().isoformat(),
                }
            )
            print(
                f"  FAILURE ({out.status}), shrunk: {out.message.splitlines()[0]}\n    {json.dumps(spec)}",
                flush=True,
            )
            if save is not None:
                old = json.loads(save.read_text()) if save.exists() else []
                save.write_text(json.dumps([*old, failures[-1]], indent=1) + "\n")
            state.last_failure = None
        attempt += 1
    return state, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrw.bench.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--progress", type=int, default=100, help="print counts every N examples (0: never)")
    ap.add_argument(
        "--save",
        type=Path,
        default=Path("tests/fuzz/regressions.json"),
        help="append shrunk failures to this JSON file",
    )
    ap.add_argument("--summary", type=Path, default=None, help="write the counts as JSON here")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    state, failures = run(a.examples, a.seed, a.max_steps, a.progress, a.save)
    elapsed = time.perf_counter() - t0
    c = state.counts
    print(
        f"jaxrw fuzz: {c['examples']} examples in {elapsed:.0f}s (seed {a.seed}, jax {jax.__version__}): "
        f"{c['mismatch']} mismatches, {c['crash']} crashes, {c['invalid']} invalid, "
        f"{c['rewritten']} rewritten"
    )
    if state.rules:
        print("rules fired (examples):", ", ".join(f"{k} {v}" for k, v in state.rules.most_common()))
    print("ops generated:", ", ".join(f"{k} {v}" for k, v in sorted(state.ops.items())))
    if a.summary:
        a.summary.write_text(
            json.dumps(
                {
                    "examples": c["examples"],
                    "mismatches": c["mismatch"],
                    "crashes": c["crash"],
                    "invalid": c["invalid"],
                    "rewritten": c["rewritten"],
                    "seconds": round(elapsed, 1),
                    "seed": a.seed,
                    "jax": jax.__version__,
                    "date": date.today().isoformat(),
                    "rules": dict(state.rules),
                    "failures": failures,
                },
                indent=1,
            )
        )
    return 1 if c["mismatch"] or c["crash"] or c["invalid"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

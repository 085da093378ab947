"""What a rewrite reports: why saturation stopped (`StopReason`), the bounds it ran under
(`Limits`) and the `RewriteReport` whose repr is a table (e-graph size, iterations, rules that
fired, predicted cost before and after, the extractor and the time of each phase)."""

from __future__ import annotations

import enum
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOptionError
from .cost import speedup

__all__ = ["Limits", "StopReason", "RewriteReport", "NUMERICS", "DEFAULT_MAX_HOIST_BYTES", "bodies_row"]

NUMERICS = ("strict", "default", "fast")
DEFAULT_MAX_HOIST_BYTES = 2 * 2**30


class StopReason(enum.Enum):
    """Why saturation stopped (`report.stop_reason`), or why a program was kept without it: the
    first limit reached, saturation itself, no rules, or what made jaxrw keep the program."""

    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"
    NO_RULES = "no rules"
    SIZE_LIMIT = "size limit"  # the program has more equations than limits.equations: not encoded
    BAD_SHAPE = "negative dimension"  # jax.jit refuses it when compiling: kept, so that it says so
    EFFECTS = "side effects"  # a body whose effects are not taken apart (rewrite/effects.py): kept
    SHARDED = "tensor-parallel arguments"  # split along an inner axis: kept (docs/multi-gpu.md)
    FAILED = "failed"  # optimize raised before a program was chosen: jax.jit runs (report.fallback)


@dataclass(frozen=True)
class Limits:
    """Bounds on equality saturation. The run stops at the first one reached and says which.

    iterations (12), nodes (50,000 e-graph rows), time_s (10 s for a signature's whole rewrite,
    bodies included); min_gain (0.03): the guard takes a rewrite only when predicted that fraction
    faster; equations (10,000): larger programs are kept as written. nodes and equations may be
    math.inf."""

    iterations: int = 12
    nodes: int = 50_000
    time_s: float = 10.0
    # the guard: a rewrite is taken only when it is predicted this fraction faster
    min_gain: float = 0.03
    # larger programs are kept as written (encoding costs ~1 ms per equation; bench/README-scale.md)
    equations: int = 10_000

    def __post_init__(self):
        """Counts are positive ints (NumPy's too; nodes and equations may be math.inf: no limit),
        time_s a positive number; never a bool or NaN, which compares False and so lifted a limit."""
        for name in ("iterations", "nodes", "equations"):
            v = getattr(self, name)
            if isinstance(v, float) and v == math.inf and name != "iterations":
                continue
            try:
                n = operator.index(v) if not isinstance(v, bool) else 0
            except TypeError:  # an integral float (nodes=1e5) counts too
                n = (
                    int(v)
                    if isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer()
                    else 0
                )
            if n <= 0:
                raise InvalidOptionError(f"limits.{name} must be a positive int; got {v!r}")
            object.__setattr__(self, name, n)  # frozen: normalized once, here
        for name, low, high in (("time_s", 0.0, math.inf), ("min_gain", 0.0, 1.0)):
            v = getattr(self, name)
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)
            if not ok or not (low < v <= high if name == "time_s" else low <= v < high):
                valid = "a positive number" if name == "time_s" else "a number in [0, 1)"
                raise InvalidOptionError(f"limits.{name} must be {valid}; got {v!r}")
            object.__setattr__(self, name, float(v))


@dataclass
class RewriteReport:
    n_equations: int = 0
    n_outputs: int = 0
    egraph_nodes: int = 0
    egraph_classes: int = 0
    iterations: int = 0
    rewrites_skipped: int = 0  # rewrites that can never match this program, not registered
    stop_reason: StopReason = StopReason.NO_RULES
    rules_fired: dict[str, int] = field(default_factory=dict)
    cost_before: float = 0.0
    cost_after: float = 0.0
    cost_model: str = ""
    extractor: str = ""
    extractor_note: str = ""
    rewritten: bool = False  # False: the guard kept the original program
    guard_note: str = ""
    phase_s: dict[str, float] = field(default_factory=dict)
    autotune: dict[str, Any] | None = None  # winner, median times, whether from the disk cache
    hoisted_bytes: int = 0  # size of the values kept between calls for hoisted arguments
    hoisted_sets: int = 0  # parameter sets whose values may be kept at once (Hoisted.sets)
    hoisted_in_loop: bool = False  # a loop body's: its loop-invariant work, done once per call
    bodies: list[RewriteReport] = field(default_factory=list)  # control-flow bodies, recursively
    hoist_note: str = ""
    nonfinite_note: str = ""  # why numerics="default" fell back to exact rules (nonfinite.py)
    rules_note: str = ""  # rules asked for by name that this numerics level leaves out, and why
    schedule: str = ""  # what runs the program and why ("xla: asked for"); set by optimize
    fallback: str = ""  # why jax.jit runs this signature instead ("" when jaxrw's program runs)
    handed_off: int = 0  # hoisted, but its hoisted arguments were new on this many calls in a row:
    # jax.jit's program runs (hoist.run_direct)
    not_kept: str = ""  # set by report() alone: why the arguments asked about run jax.jit's program
    # (their hoisted values would pass max_hoist_bytes: HoistedCall.refused_for)

    @property
    def predicted_speedup(self) -> float:
        return speedup(self.cost_before, self.cost_after)

    @classmethod
    def failed(cls, closed: Any, why: str) -> RewriteReport:
        """The report of a signature whose optimization raised (`why`): jax.jit runs it."""
        report = cls(
            n_equations=len(closed.jaxpr.eqns),
            n_outputs=len(closed.jaxpr.outvars),
            stop_reason=StopReason.FAILED,
        )
        report.fell_back(why)
        return report

    def fell_back(self, why: str) -> None:
        """The signature runs jax.jit instead (`why`), so the report says so."""
        self.rewritten = False
        self.fallback = why
        self.guard_note = f"fell back to jax.jit: {why}"
        self.schedule = "jax.jit: fallback"

    def rows(self) -> list[tuple[str, str]]:
        from ..explain_render import hoisted_text, predicted_text

        bodies = any(b.rewritten for b in self.bodies)
        predicted = predicted_text(self.cost_before, self.cost_after, self.cost_model, self.rewritten, bodies)
        predicted += " (not run since the hand-off)" if self.handed_off and self.rewritten else ""
        predicted += " (not run for these arguments)" if self.not_kept and self.rewritten else ""
        fired = ", ".join(f"{k}×{v}" for k, v in sorted(self.rules_fired.items())) or "none"
        hoisted = self.not_kept or hoisted_text(self.hoisted_bytes, self.hoisted_sets, self.hoisted_in_loop)
        phases = " ".join(f"{k} {v * 1e3:.0f}ms" for k, v in self.phase_s.items())
        return (
            [
                ("equations", str(self.n_equations)),
                ("e-graph", f"{self.egraph_nodes} nodes, {self.egraph_classes} classes"),
                ("iterations", f"{self.iterations} (stop: {self.stop_reason.value})"),
                ("rules fired", fired),
                ("cost model", self.cost_model),
                ("extractor", self.extractor + (f" ({self.extractor_note})" if self.extractor_note else "")),
                ("predicted", predicted),
                ("result", self._result_text()),
                ("phases", phases),
            ]
            + ([("autotune", _autotune_row(self.autotune))] if self.autotune else [])
            + ([("hoisted", hoisted)] if self.hoisted_bytes and not self.handed_off else [])
            + ([("hoisting", self.hoist_note)] if self.hoist_note else [])
            + ([("non-finite", self.nonfinite_note)] if self.nonfinite_note else [])
            + ([("rules", self.rules_note)] if self.rules_note else [])
            + ([("schedule", self.schedule)] if self.schedule else [])
            + ([("bodies", bodies_row(self.bodies))] if self.bodies else [])
        )

    def _result_text(self) -> str:
        if not self.rewritten:
            return f"original kept ({self.guard_note})"
        if self.handed_off:  # hoist.run_direct: the rewrite is not run, nothing is hoisted now
            return (
                f"rewritten, then handed off to jax.jit's program: the hoisted arguments were new on "
                f"{self.handed_off} calls in a row (nothing is hoisted now; clear_cache() hoists again)"
            )
        return "rewritten"

    def __repr__(self) -> str:
        rows = self.rows()
        w = max(len(k) for k, _ in rows)
        return "RewriteReport\n" + "\n".join(f"  {k:<{w}}  {v}" for k, v in rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_equations": self.n_equations,
            "egraph_nodes": self.egraph_nodes,
            "egraph_classes": self.egraph_classes,
            "iterations": self.iterations,
            "stop_reason": self.stop_reason.value,
            "rules_fired": dict(self.rules_fired),
            "cost_before": self.cost_before,
            "cost_after": self.cost_after,
            "cost_model": self.cost_model,
            "extractor": self.extractor,
            "extractor_note": self.extractor_note,
            "rewritten": self.rewritten,
            "guard_note": self.guard_note,
            "phase_s": dict(self.phase_s),
            "autotune": self.autotune,
            "hoisted_bytes": self.hoisted_bytes,
            "hoisted_sets": self.hoisted_sets,
            "hoisted_in_loop": self.hoisted_in_loop,
            "hoist_note": self.hoist_note,
            "nonfinite_note": self.nonfinite_note,
            "rules_note": self.rules_note,
            "schedule": self.schedule,
            "fallback": self.fallback,
            "handed_off": self.handed_off,
            "not_kept": self.not_kept,
            "bodies": [b.to_dict() for b in self.bodies],
        }


def bodies_row(bodies: list[RewriteReport]) -> str:
    """How many control-flow bodies were rewritten, with the rules fired in them."""
    done = [b for b in bodies if b.rewritten]
    fired: dict[str, int] = {}
    for b in done:
        for k, v in b.rules_fired.items():
            fired[k] = fired.get(k, 0) + v
    rules = ", ".join(f"{k}×{v}" for k, v in sorted(fired.items())) or "none"
    from ..explain_render import speedup_text

    gains = ", ".join(speedup_text(b.cost_before, b.cost_after) for b in done)
    predicted = f", predicted {gains}" if done else ""
    return f"{len(done)} of {len(bodies)} control-flow bodies rewritten{predicted} ({rules})"


def _autotune_row(info: dict[str, Any]) -> str:
    times = ", ".join(f"{k} {v * 1e6:.1f}us" for k, v in sorted(info["times"].items(), key=lambda kv: kv[1]))
    return f"winner {info['winner']}{' (cached)' if info['cached'] else ''}: {times}"

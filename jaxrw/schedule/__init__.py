"""jaxrw.schedule: run an optimized program under an explicit GPU schedule (jax.experimental.thunky).

    plan_program(closed_jaxpr, profile)    -> Plan (regions, streams, events, buffers, predictions)
    check(plan) / simulate(plan, args)     -> validation without a GPU
    schedule_program(fn, specs, mode|plan) -> a thunky-scheduled callable, or None for XLA's schedule
    schedule_selection(mode, fn, specs, ...) -> what optimize() calls: the program and which schedule;
    apply(...) -> its callable alone (scheduled, else jax.jit(fn))

Modes: "xla" (never thunky), "streams" (always; raises ScheduleUnavailableError without thunky or
CUDA), "auto" (on CUDA only: thunky where a gain is predicted, and XLA's command-buffer modes
`XLA_MODES` where kernel launches are a large enough share of the call, each kept only when a
measurement confirms it; `choice` applies the option to plain and hoisted programs).
"""

from .plan import (
    H200_STREAMS,
    Buffer,
    Plan,
    Region,
    ScheduleError,
    ScheduleUnavailableError,
    Slot,
    Step,
    Storage,
    StreamCosts,
    plan_program,
)
from .program import Program, build_program
from .thunky import (
    MODES,
    Decision,
    Scheduled,
    Selection,
    apply,
    choose,
    cuda_available,
    emit,
    lower_to_dialect,
    schedule_program,
    schedule_selection,
    select,
    select_xla_mode,
    thunky_available,
)
from .timing import fast_path_frame_s, python_path_overhead_s
from .validate import PlanError, ValidationReport, check, simulate, validate
from .xla_modes import XLA_MODES, TopLevel, jit_mode

__all__ = [
    "MODES",
    "H200_STREAMS",
    "StreamCosts",
    "Plan",
    "Region",
    "Step",
    "Buffer",
    "Slot",
    "Storage",
    "Program",
    "build_program",
    "plan_program",
    "ScheduleError",
    "ScheduleUnavailableError",
    "PlanError",
    "ValidationReport",
    "check",
    "validate",
    "simulate",
    "Decision",
    "Scheduled",
    "choose",
    "emit",
    "schedule_program",
    "apply",
    "schedule_selection",
    "python_path_overhead_s",
    "fast_path_frame_s",
    "select",
    "select_xla_mode",
    "XLA_MODES",
    "TopLevel",
    "jit_mode",
    "Selection",
    "thunky_available",
    "cuda_available",
    "lower_to_dialect",
]

"""Which schedule runs a signature optimize() built: its `schedule` option applied to one program.

`for_program` serves a plain (not hoisted) program: "xla", "streams" or auto's measured choice
(thunky.schedule_selection). Before it, `confirm_rewrite` times a rewrite predicted to gain little
against the program as written, and keeps the one that measured faster. `for_hoisted` serves a
hoisted signature's main program, which stays a plain jit behind the identity check: XLA's
schedule or one of XLA's command-buffer modes, timed.
Under a trace (an outer jit/grad/vmap) nothing concrete can be timed: XLA's schedule. Elsewhere
the candidates are timed on the call's own arrays (`timing.device_inputs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import compat
from ..rewrite.profiles import Profile
from ..signature import spec
from .thunky import Selection, select_xla_mode
from .timing import device_inputs, fast_path_frame_s, kept_terms, pick_fastest, python_path_overhead_s

__all__ = [
    "for_program",
    "for_hoisted",
    "for_plain_jit",
    "confirm_rewrite",
    "CONFIRM_BELOW",
    "REWRITE_MARGIN",
]

log = logging.getLogger("jaxrw")

# Under schedule="auto" on CUDA, a rewrite predicted under this speedup is timed against the program
# as written before it is kept: the model's error on such small margins is larger than the margin.
# On the H200 (bench/HISTORY.md, seventeenth lease) multibranch_cell bf16, predicted 1.08x, ran
# 0.98x; stacked_matvec_16, predicted 1.17x (f32) and 1.28x (bf16), ran 1.06x and 1.01x
CONFIRM_BELOW = 1.5
# ... and kept only when it measured at least this much faster, its fast path's Python frame paid
REWRITE_MARGIN = 0.02


def _package() -> Any:
    """jaxrw.schedule, whose names are looked up per build (tests stand in a GPU or a fault there)."""
    from .. import schedule

    return schedule


def _untimed(mode: str, leaves: Sequence[Any]) -> str:
    """Why auto cannot time candidates for this signature here ("" when it can)."""
    if mode != "auto":
        return ""
    if not _package().cuda_available():
        return "no CUDA device"
    return "built under a trace" if compat.traced(leaves) else ""


def for_program(
    mode: str,
    fn: Callable,
    specs: Sequence[Any],
    leaves: Sequence[Any],
    donate: Sequence[int],
    profile: Profile | None,
    memory_slack: float,
    kept: bool = False,
) -> tuple[Selection, str]:
    """(auto's or the asked-for selection, why when auto could not time). `kept`: `fn` is the
    program as written (not rewritten): a candidate must beat timing.kept_terms. Raises what
    schedule_selection raises (ScheduleUnavailableError for "streams" where it cannot run)."""
    why = _untimed(mode, leaves)
    if why:
        mode = "xla"
    chosen = _package().schedule_selection(
        mode,
        fn,
        specs,
        donate,
        profile,
        memory_slack=memory_slack,
        call_overhead=python_path_overhead_s,
        inputs=device_inputs(leaves) if mode == "auto" else None,  # only auto times candidates
        **kept_terms(kept),
    )
    return chosen, why


def confirm_rewrite(
    mode: str,
    rewritten: Callable,
    original: Callable,
    leaves: Sequence[Any],
    report: Any,
    name: str = "program",
) -> Callable:
    """The program to schedule (`name`: the user's function's, for the logs): `original` where
    all three hold: auto can time here, the rewrite's predicted speedup is under CONFIRM_BELOW,
    and it did not measure REWRITE_MARGIN faster than `original` (twice, as auto's picks);
    `report` then says so (not rewritten, with the guard's note). Else `rewritten`. The program
    as written runs with no Python of jaxrw's, so the rewrite pays the fast path's frame. Peak
    memory is not a condition, as it is not the guard's (a schedule's is: for_program). If the
    timing fails, the rewrite stands (the guard's prediction, as without a GPU)."""
    predicted = report.predicted_speedup
    if mode != "auto" or _untimed(mode, leaves) or predicted >= CONFIRM_BELOW:
        return rewritten
    notes: list[str] = []
    try:
        args = device_inputs(leaves)
        picked = pick_fastest(
            jax.jit(original),
            {"rewrite": jax.jit(rewritten)},
            [spec(x) for x in args],
            name,
            memory_slack=None,
            overhead={"rewrite": fast_path_frame_s},
            notes=notes,
            inputs=args,
            margin=REWRITE_MARGIN,
        )
    except Exception as e:  # noqa: BLE001 - timing is a check: without it the guard's prediction holds
        log.warning(
            "jaxrw: could not time the rewrite against the program as written (%s: %s)", type(e).__name__, e
        )
        return rewritten
    if picked is not None:
        return rewritten
    report.rewritten = False
    report.guard_note = (
        f"predicted {predicted:.2f}x, measured no gain of {REWRITE_MARGIN:.0%} over the program as written"
        f" ({', '.join(notes) or 'not timed'})"
    )
    report.cost_after = report.cost_before
    return original


def for_hoisted(mode: str, hoisted: Any, leaves: Sequence[Any], memory_slack: float) -> tuple[str, str]:
    """(XLA mode for the main program, why). Only auto times anything; thunky streams are not
    used for hoisted programs (their prologue values are cached outside any schedule)."""
    if mode != "auto":
        return "xla", "hoisted: XLA's schedule" if mode == "streams" else "asked for"

    def main_inputs() -> list[Any]:  # what the main program is called with: the prologue's values
        args = device_inputs(leaves)
        values = jax.jit(hoisted.prologue)(*[args[i] for i in hoisted.slow])
        return [*(args[i] for i in hoisted.main_args), *values]

    return for_plain_jit(mode, hoisted.main_used, main_inputs, leaves, memory_slack)


def for_plain_jit(
    mode: str,
    fn: Callable,
    inputs: Callable[[], Sequence[Any]],
    leaves: Sequence[Any],
    memory_slack: float,
    kept: bool = False,
) -> tuple[str, str]:
    """(XLA mode, why) for a program that stays a plain jit: a hoisted main program, or jax.jit's
    program of a hoisted signature handed off (its parameters new on every call; `kept`: a mode
    must beat timing.kept_terms). `inputs()` gives concrete arguments to time it on; `leaves` are the
    call's, to see whether it runs under a trace."""
    why = _untimed(mode, leaves) if mode == "auto" else "asked for"
    if why:
        return "xla", why
    try:
        args = inputs()
        specs = [spec(x) for x in args]
        return select_xla_mode(fn, specs, memory_slack, inputs=args, **kept_terms(kept))
    except Exception as e:  # noqa: BLE001 - timing is optional: XLA's schedule always works
        log.warning("jaxrw: could not time schedules of %s (%s: %s)", fn, type(e).__name__, e)
        return "xla", f"not timed ({type(e).__name__})"

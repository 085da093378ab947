"""Which schedule runs a signature optimize() built: its `schedule` option applied to one program.

`for_program` serves a plain (not hoisted) program: "xla", "streams" or auto's measured choice
(thunky.schedule_selection). `for_hoisted` serves a hoisted signature's main program, which stays a
plain jit behind the identity check: XLA's schedule or one of XLA's command-buffer modes, timed.
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
from .timing import device_inputs, kept_terms, python_path_overhead_s

__all__ = ["for_program", "for_hoisted", "for_plain_jit"]

log = logging.getLogger("jaxrw")


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
    return "built under a trace" if any(map(compat.is_tracer, leaves)) else ""


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

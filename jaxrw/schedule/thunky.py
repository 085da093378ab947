"""Run a Plan under thunky in place of XLA's schedule, and the policy choosing it.

The plan is emitted as a function of the flat inputs (emit.py) and called through its compiled
executable directly (direct.py), not jax's Python dispatch.
`choose` is the policy: "xla" never uses thunky; "streams" always does and raises where it cannot;
"auto" uses it only on CUDA with thunky present and a predicted gain, confirmed by a measurement.
`select` (behind `apply(mode="auto")`) also weighs XLA's own command-buffer modes (xla_modes.py:
every kernel run recorded into a CUDA graph, and those graphs' independent kernels overlapped),
timed on the device and kept only when measured faster.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from .. import compat
from ..errors import check_choice
from ..rewrite.profiles import Profile, default_profile
from .direct import ThunkyProgram
from .emit import embedded_constant_bytes, emit
from .plan import H200_STREAMS, Plan, ScheduleError, ScheduleUnavailableError, StreamCosts, plan_program
from .program import build_program
from .timing import MEASURED_MARGIN, PEAK_ALLOWANCE_BYTES, peak_bytes, pick_fastest
from .validate import check
from .xla_modes import XLA_MODES, jit_mode, launch_s

__all__ = [
    "Selection",
    "select",
    "select_xla_mode",
    "MODES",
    "Decision",
    "Scheduled",
    "ThunkyProgram",
    "choose",
    "emit",
    "schedule_program",
    "apply",
    "schedule_selection",
    "thunky_available",
    "cuda_available",
    "lower_to_dialect",
]

log = logging.getLogger("jaxrw")
MODES = ("auto", "xla", "streams")

# `auto` also times the plan forced to twice the streams of the planner's pick (up to WIDE_STREAMS)
# when that plan, too, is predicted at parity: the planner prices thin GEMMs too cheaply and so
# undercounts what more streams gain there (H200, experts_packed_8x128x2048: planned 2 streams,
# 1.54x; 4 streams forced, 1.70-1.79x in runs g1, g4, h4; bench/HISTORY.md). A trial is a
# compilation: it is skipped for programs whose regions embed more than WIDE_TRIAL_CONSTANT_BYTES of
# constants (thunky compiled experts_equal's 128 MiB in 18-20 s).
WIDE_STREAMS = 4
WIDE_TRIAL_CONSTANT_BYTES = 16 << 20
THUNKY_TRIALS = ("thunky", "thunky-wide")  # auto's names for its thunky candidates
_said: set[str] = set()


def _say_once(key: str, msg: str) -> None:
    if key not in _said:
        _said.add(key)
        log.info(msg)


def thunky_available() -> bool:
    """jax.experimental.thunky imports and its MLIR dialect is built into this jaxlib."""
    mod = compat.thunky_module()
    if mod is None or not hasattr(mod, "call_jax"):
        return False
    try:
        from jax._src.lib import thunky_dialect  # jax 0.12: None when jaxlib lacks the dialect
    except ImportError:
        return False
    return thunky_dialect is not None


def cuda_available() -> bool:
    try:
        return compat.device_kind() == "cuda" and bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@dataclass(frozen=True)
class Decision:
    use_thunky: bool
    reason: str


def choose(
    mode: str,
    plan: Plan | None = None,
    *,
    thunky: bool | None = None,
    cuda: bool | None = None,
    costs: StreamCosts = H200_STREAMS,
    measured: bool = False,
) -> Decision:
    """Whether `mode` runs `plan` under thunky here. `thunky`/`cuda` override the detection (tests).
    In "auto", `measured` says a timing will confirm it, so for a plan of several streams and at
    most `costs.trial_regions` regions a smaller predicted gain will do (`costs.trial_gain` instead
    of `costs.min_gain`)."""
    check_choice("schedule", mode, MODES)
    if mode == "xla":
        return Decision(False, "schedule='xla'")
    have = thunky_available() if thunky is None else thunky
    gpu = cuda_available() if cuda is None else cuda
    if mode == "streams":
        if not have:
            raise ScheduleUnavailableError(
                "schedule='streams' needs jax.experimental.thunky with its MLIR dialect (jax >= 0.12); "
                f"this is jax {jax.__version__}. Use schedule='auto' or 'xla'."
            )
        if not gpu:
            raise ScheduleUnavailableError(
                f"schedule='streams' needs a CUDA device; the default backend is {jax.default_backend()!r}. "
                "Use schedule='auto' or 'xla'."
            )
        return Decision(True, "schedule='streams'")
    if not have:
        _say_once(
            "no-thunky",
            f"jaxrw: jax.experimental.thunky is not available (jax {jax.__version__}); using XLA's schedule",
        )
        return Decision(False, "thunky unavailable")
    if not gpu:
        return Decision(False, "no CUDA device")
    if plan is None or not plan.regions:
        return Decision(False, "nothing to schedule")
    trial = measured and plan.streams > 1 and len(plan.regions) <= costs.trial_regions
    gain = costs.trial_gain if trial else costs.min_gain
    if plan.thunky_s < plan.xla_s * (1 - gain):
        return Decision(True, f"predicted {plan.predicted_speedup:.2f}x")
    return Decision(
        False,
        f"predicted {plan.predicted_speedup:.2f}x, below the {1 / (1 - gain):.2f}x "
        f"a schedule must promise{' to be timed' if trial else ''}",
    )


class Scheduled:
    """The callable schedule_program returns: the thunky program, with jax.jit of the original for
    calls under a JAX transformation (grad, vmap, ...), which thunky programs do not support."""

    def __init__(self, fast: Callable, fallback: Callable, plan: Plan, decision: Decision):
        self.fast, self.fallback, self.plan, self.decision = fast, fallback, plan, decision

    def __call__(self, *args: Any) -> Any:
        # a jit trace (DynamicJaxprTracer) is fine; JVP/batching tracers are not
        if any(compat.is_tracer(a) and type(a).__name__ != "DynamicJaxprTracer" for a in args):
            return self.fallback(*args)
        return self.fast(*args)

    def __repr__(self) -> str:
        return f"Scheduled({self.decision.reason})\n{self.plan!r}"


def schedule_program(
    result_fn: Callable,
    flat_specs: Sequence[Any],
    plan_or_mode: Plan | str,
    profile: Profile | None = None,
    donate: Sequence[int] = (),
    *,
    costs: StreamCosts = H200_STREAMS,
    measure: bool = True,
) -> Scheduled | None:
    """The thunky program for `result_fn` (a function of the flat inputs), or None for XLA's schedule.

    `plan_or_mode` is a Plan (emitted as given, after validation) or a mode of `choose`. In "auto",
    a predicted gain is confirmed by timing both programs on the device (`measure=False` skips it)."""
    profile = profile or default_profile(compat.device_kind())
    mode = "streams" if isinstance(plan_or_mode, Plan) else plan_or_mode
    first = choose(mode, None, costs=costs)  # raises for "streams" where thunky cannot run
    if mode == "xla" or (mode == "auto" and first.reason in ("thunky unavailable", "no CUDA device")):
        return None
    closed, shape = jax.make_jaxpr(result_fn, return_shape=True)(*flat_specs)
    out_tree = jax.tree_util.tree_structure(shape)
    if isinstance(plan_or_mode, Plan):
        plan = plan_or_mode
    else:
        try:
            plan = plan_program(closed, profile, costs=costs, donate=tuple(donate))
        except ScheduleError as e:
            if mode == "streams":
                raise
            log.debug("jaxrw: not scheduling %s: %s", _name(result_fn), e)
            return None
    check(plan)
    decision = choose(mode, plan, costs=costs, measured=measure)
    if not decision.use_thunky or not plan.regions:
        log.debug("jaxrw: XLA schedule for %s: %s", _name(result_fn), decision.reason)
        return None
    fallback = jax.jit(result_fn, donate_argnums=tuple(donate))
    if mode == "auto" and measure:
        picked = pick_fastest(
            jax.jit(result_fn), {"thunky": emit(plan, (), out_tree)}, flat_specs, _name(result_fn)
        )
        if picked is None:
            return None
        decision = Decision(True, f"measured {picked[1]:.2f}x ({decision.reason})")
    program = emit(plan, donate, out_tree)
    if mode == "streams" and not isinstance(plan_or_mode, Plan) and plan.streams > 1:
        over = _over_xla_peak(program, fallback, flat_specs)
        if over:  # independent regions' buffers live at once: one stream keeps XLA's order instead
            one = plan_program(closed, profile, costs=costs, streams=1, donate=tuple(donate))
            check(one)
            log.info("jaxrw: %s: %d streams would need %s; one stream", _name(result_fn), plan.streams, over)
            reason = f"one stream: {plan.streams} needed {over}"
            plan, program, decision = one, emit(one, donate, out_tree), Decision(True, reason)
    return Scheduled(program, fallback, plan, decision)


def _over_xla_peak(program: Callable, plain: Callable, flat_specs: Sequence[Any]) -> str:
    """How far the compiled thunky program's peak memory passes jax.jit's for the same program
    (XLA's memory_analysis; "" when within PEAK_ALLOWANCE_BYTES or either is unknown). On the H200
    the planner's two streams for experts_medium_4 peaked at 502 MiB against XLA's 462, one
    stream at 462 (bench/HISTORY.md, scheduler runs)."""
    mine, xla = peak_bytes(program, flat_specs), peak_bytes(plain, flat_specs)
    if mine is None or xla is None or mine <= xla + PEAK_ALLOWANCE_BYTES:
        return ""
    return f"{mine / 2**20:.1f} MiB of peak memory, XLA {xla / 2**20:.1f} MiB"


def apply(mode: str, fn: Callable, flat_specs: Sequence[Any], *args: Any, **kwargs: Any) -> Callable:
    """The scheduled program for `fn`, else `jax.jit(fn, donate_argnums=donate)`: the callable
    `schedule_selection` (same arguments) picks."""
    return schedule_selection(mode, fn, flat_specs, *args, **kwargs).fn


def schedule_selection(
    mode: str,
    fn: Callable,
    flat_specs: Sequence[Any],
    donate: Sequence[int] = (),
    profile: Profile | None = None,
    *,
    measure: bool = True,
    concurrent_xla: bool = True,
    memory_slack: float = 0.0,
    call_overhead: Callable[[], float] | None = None,
    mode_overhead: Callable[[], float] | None = None,
    inputs: Sequence[Any] | None = None,
    margin: float = MEASURED_MARGIN,
) -> Selection:
    """What optimize() calls: which program runs `fn` ("xla", "thunky" or an XLA mode) and
    the callable.

    "xla": the plain jit. "streams": the thunky program (raises ScheduleUnavailableError without
    thunky or CUDA). "auto": off CUDA the plain jit; on CUDA the fastest of the plain jit, the thunky
    program (when it is predicted to gain) and, with `concurrent_xla`, the jit compiled under XLA's
    command-buffer modes (`XLA_MODES`), timed on `inputs`; a candidate must be faster by `margin`
    (5%, timing.MEASURED_MARGIN; optimize passes timing.KEPT_MARGIN for a program kept as written)
    and use no more peak memory than the plain jit, plus `memory_slack` (a fraction: 0.05 allows
    5% more) and 1 MiB (timing.PEAK_ALLOWANCE_BYTES).
    `call_overhead()`: the extra host seconds per call of the path a candidate runs on
    (optimize's Python path; the plain jit takes jax's C++ dispatch), added to the thunky
    candidate's measured time; `mode_overhead()` the same for XLA's modes (for a program kept as
    written: the plain jit runs with no Python of jaxrw's, a mode through `Optimized.__call__`).
    `inputs`: concrete arguments to time on (optimize passes the call's own); default random ones."""
    check_choice("schedule", mode, MODES)
    plain = jax.jit(fn, donate_argnums=tuple(donate))
    if mode == "xla":
        return Selection("xla", plain, "asked for")
    if mode == "streams":
        scheduled = schedule_program(fn, flat_specs, "streams", profile, donate)
        if scheduled is None:
            return Selection("xla", plain, "no regions to schedule")
        return Selection("thunky", scheduled, "asked for")
    return select(
        fn,
        flat_specs,
        donate,
        profile,
        measure=measure,
        concurrent_xla=concurrent_xla,
        memory_slack=memory_slack,
        call_overhead=call_overhead,
        mode_overhead=mode_overhead,
        inputs=inputs,
        margin=margin,
    )


@dataclass(frozen=True)
class Selection:
    """What `auto` picked: "xla", "thunky" or a key of XLA_MODES, the callable, and why."""

    choice: str
    fn: Callable
    reason: str


def select(
    fn: Callable,
    flat_specs: Sequence[Any],
    donate: Sequence[int] = (),
    profile: Profile | None = None,
    *,
    measure: bool = True,
    concurrent_xla: bool = True,
    memory_slack: float = 0.0,
    call_overhead: Callable[[], float] | None = None,
    mode_overhead: Callable[[], float] | None = None,
    inputs: Sequence[Any] | None = None,
    margin: float = MEASURED_MARGIN,
) -> Selection:
    """The policy of schedule="auto" (see `apply`), with its choice and reason."""
    plain = jax.jit(fn, donate_argnums=tuple(donate))
    choose("auto", None)  # says once when thunky is missing
    if not cuda_available():
        return Selection("xla", plain, "no CUDA device")
    profile = profile or default_profile(compat.device_kind())
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*flat_specs)
    out_tree = jax.tree_util.tree_structure(shape)
    try:
        plan: Plan | None = plan_program(closed, profile, donate=tuple(donate))
        check(plan)
    except ScheduleError as e:
        plan, unplanned = None, str(e)
    costs = H200_STREAMS
    trial: dict[str, Callable] = {}
    final: dict[str, Callable[[], Callable]] = {}
    predicted: dict[str, float] = {}
    peaks: dict[str, int] = {}  # the thunky plans' predicted peak memory
    thunky_decision = (
        choose("auto", plan, costs=costs, measured=measure) if plan else Decision(False, unplanned)
    )
    # with nothing donated the program timed is the program kept: compiled again, it could run
    # apart from what was measured (auto's thunky pick for experts_equal, measured 1.10x, ran
    # 0.85x in H200 run g3 and 1.36x in g6), and a thunky compilation took 18 s there
    if plan and thunky_decision.use_thunky and plan.regions:
        thunky_plans = {"thunky": (plan, thunky_decision)}
        wide = _wider_plan(closed, profile, plan, donate, costs) if measure else None
        if wide is not None:
            thunky_plans["thunky-wide"] = wide
        for name, (p, decision) in thunky_plans.items():
            peaks[name] = p.peak_bytes
            timed = trial[name] = emit(p, (), out_tree)
            emitted = functools.partial(_timed_or_again, timed, p, donate, out_tree)
            final[name] = functools.partial(_scheduled, emitted, plain, p, decision)
        predicted["thunky"] = plan.thunky_s
    if concurrent_xla:  # XLA's command-buffer modes: no plan predicts host launch time; measured
        for mode in XLA_MODES:
            trial[mode] = jit_mode(fn, mode)
            final[mode] = (
                (lambda f=trial[mode]: f) if not donate else functools.partial(jit_mode, fn, mode, donate)
            )
        if plan and plan.overlap_s < plan.xla_s * (1 - costs.min_gain):
            predicted["xla-concurrent"] = plan.overlap_s
    if not measure:
        if not plan or not predicted:
            return Selection("xla", plain, f"no predicted gain ({thunky_decision.reason})")
        name = min(predicted, key=predicted.__getitem__)
        return Selection(name, final[name](), f"predicted {plan.xla_s / predicted[name]:.2f}x")
    if not trial:
        return Selection("xla", plain, f"no predicted gain ({thunky_decision.reason})")
    launch = launch_s(plan.program) if plan else None
    choice, why = _measured(
        fn,
        trial,
        flat_specs,
        memory_slack,
        launch,
        overhead=_overheads(call_overhead, mode_overhead),
        inputs=inputs,
        margin=margin,
        predicted_peak=peaks,
    )
    kept = plain if choice == "xla" else final[choice]()
    if choice == "thunky-wide":  # a thunky program like any other from here on
        choice, why = "thunky", f"on {kept.plan.streams} streams (the planner's {plan.streams}), {why}"
    return Selection(choice, kept, why)


def _wider_plan(
    closed: Any, profile: Profile, plan: Plan, donate: Sequence[int], costs: StreamCosts
) -> tuple[Plan, Decision] | None:
    """The plan on twice `plan`'s streams (at most WIDE_STREAMS) with auto's decision, where it
    is worth a second thunky trial (see WIDE_STREAMS), else None."""
    streams = min(2 * plan.streams, WIDE_STREAMS)
    if (
        plan.streams < 2
        or streams <= plan.streams
        or embedded_constant_bytes(plan) > WIDE_TRIAL_CONSTANT_BYTES
    ):
        return None
    try:
        wide = plan_program(closed, profile, costs=costs, streams=streams, donate=tuple(donate))
        check(wide)
    except ScheduleError:
        return None
    decision = choose("auto", wide, costs=costs, measured=True)
    return (wide, decision) if decision.use_thunky and wide.streams > plan.streams else None


def _timed_or_again(timed: ThunkyProgram, plan: Plan, donate: Sequence[int], out_tree: Any) -> ThunkyProgram:
    """The program timed, or with inputs donated the plan emitted again (a donating program cannot
    be timed on the caller's inputs)."""
    return timed if not donate else emit(plan, donate, out_tree)


def _scheduled(
    emitted: Callable[[], ThunkyProgram], plain: Callable, plan: Plan, decision: Decision
) -> Scheduled:
    """The Scheduled auto keeps for a thunky pick."""
    return Scheduled(_or_xla(emitted(), plain), plain, plan, decision)


def _or_xla(program: ThunkyProgram, plain: Callable) -> ThunkyProgram:
    """`program`, its calls that cannot take its executable directly sent to XLA's `plain`: auto
    measured it through that executable, not through jax's dispatch."""
    program.otherwise = plain
    return program


def select_xla_mode(
    fn: Callable,
    flat_specs: Sequence[Any],
    memory_slack: float = 0.0,
    inputs: Sequence[Any] | None = None,
    margin: float = MEASURED_MARGIN,
    mode_overhead: Callable[[], float] | None = None,
) -> tuple[str, str]:
    """(mode, why) for a program that must stay a plain jit (a hoisted signature's main program):
    "xla" or the XLA command-buffer mode measured fastest on this CUDA device, timed on `inputs`
    (default random ones); `mode_overhead` as in `schedule_selection`."""
    if not cuda_available():
        return "xla", "no CUDA device"
    trial = {mode: jit_mode(fn, mode) for mode in XLA_MODES}
    closed = jax.make_jaxpr(fn)(*flat_specs)
    launch = launch_s(build_program(closed, default_profile(compat.device_kind())))
    overhead = _overheads(None, mode_overhead)
    return _measured(
        fn, trial, flat_specs, memory_slack, launch, overhead=overhead, inputs=inputs, margin=margin
    )


def _overheads(
    call_overhead: Callable[[], float] | None, mode_overhead: Callable[[], float] | None
) -> dict[str, Callable[[], float]]:
    """pick_fastest's `overhead`: the call path's cost per candidate that pays one."""
    paid = {} if call_overhead is None else dict.fromkeys(THUNKY_TRIALS, call_overhead)
    if mode_overhead is not None:
        paid.update(dict.fromkeys(XLA_MODES, mode_overhead))
    return paid


def _measured(
    fn: Callable,
    trial: dict[str, Callable],
    flat_specs: Sequence[Any],
    memory_slack: float,
    launch: float | None,
    **kw: Any,
) -> tuple[str, str]:
    """(the candidate measured fastest against jax.jit(fn), else "xla"; why: what each candidate
    measured, or the pick's speedup and its peak memory against XLA's where known), XLA's modes
    bounded by the kernel-launch time `launch` (seconds a call, or None where no plan gives it)."""
    notes: list[str] = []
    picked = pick_fastest(
        jax.jit(fn),
        trial,
        flat_specs,
        _name(fn),
        memory_slack=memory_slack,
        notes=notes,
        launch_s=launch,
        launch_bound=tuple(XLA_MODES),
        **kw,
    )
    if picked is None:
        return "xla", f"measured no gain ({', '.join(notes)})"
    peak = [n for n in notes if n.startswith("peak memory")]
    return picked[0], ", ".join([f"measured {picked[1]:.2f}x", *peak])


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))


# -- lowering without CUDA ------------------------------------------------------------------------


def lower_to_dialect(plan: Plan, flat_specs: Sequence[Any], compile_regions: bool = True) -> str:
    """The plan's thunky program in the thunky MLIR dialect, as far as a machine without CUDA gets.

    Each `call_jax` needs a GPU executable to splice; here every region is instead compiled for the
    host (`compile_regions`) and stands in the module as a `memzero` of the buffers it writes. The
    rest (buffer slices, streams, events, scratch) is the real lowering, verified by MLIR."""
    from jax._src import core
    from jax._src.state.types import AbstractRef, WriteEffect
    from jax._src.thunky import thunky as impl  # private: the dialect lowering (jax 0.12)

    closed = jax.make_jaxpr(emit(plan))(*flat_specs)
    inner = _find_eqn(closed.jaxpr, "thunky.call_thunky_nested")
    if inner is None:
        raise ScheduleError("the emitted program has no thunky call")

    def stub(ctx: Any, block: Any, env: dict, eqn: Any) -> None:
        specs, is_ref = eqn.params["slice_specs"], eqn.params["is_ref"]
        if compile_regions:
            avals = [
                AbstractRef(core.ShapedArray(s[1], s[2])) if r else core.ShapedArray(s[1], s[2])
                for s, r in zip(specs, is_ref, strict=True)
            ]
            jax.jit(eqn.params["fn"]).trace(*avals).lower().compile()
        written = {e.input for e in eqn.effects if isinstance(e, WriteEffect)}
        seen = set()
        for k, var in enumerate(eqn.invars):
            if (k in written or var in written) and (var, specs[k]) not in seen:
                seen.add((var, specs[k]))
                impl._thunky.memzero(impl._mlir_get_slice(ctx, env, var, specs[k]))

    rules = impl._thunky_mlir_rules
    saved = rules[impl.call_jax_p]
    rules[impl.call_jax_p] = stub
    try:
        module = impl.jaxpr_to_mlir(inner.params["jaxpr"])
    finally:
        rules[impl.call_jax_p] = saved
    return str(module)


def _find_eqn(jaxpr: Any, name: str) -> Any:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            return eqn
        body = eqn.params.get("jaxpr")
        if body is not None:
            found = _find_eqn(getattr(body, "jaxpr", body), name)
            if found is not None:
                return found
    return None

"""The rewrite pipeline for one jaxpr: encode, run rules within limits, extract, guard, decode.

The runner always says why it stopped (`StopReason`) and returns a `RewriteReport` whose repr is
a table: e-graph size, iterations, rules that fired, predicted cost before and after, which
extractor ran and the time of each phase.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import back_off
from egglog import run as run_schedule

from ..errors import Interrupt, JaxrwError, RewriteStageError
from . import lease
from .cost import CostModel, get_cost_model
from .decode import decode
from .effects import bound_once, split_callbacks
from .encode import Program, count_equations, encode
from .extract import Extraction, get_extractor, node_costs, reachable
from .graph import EGraphView
from .nonfinite import cone, exact_dtype, rules_of_marks, saturating_name, touched, unsafe_classes
from .profiles import Profile
from .reach import analysis_rules, can_fire
from .report import DEFAULT_MAX_HOIST_BYTES, NUMERICS, Limits, RewriteReport, StopReason, bodies_row
from .rules import Rule, is_finding, left_out, select_rules
from .terms import analysis
from .xla_passes import program_cost

log = logging.getLogger("jaxrw")

__all__ = [
    "Limits",
    "StopReason",
    "RewriteReport",
    "RewriteResult",
    "rewrite_jaxpr",
    "NUMERICS",
    "DEFAULT_MAX_HOIST_BYTES",
    "bodies_row",
]


@dataclass
class RewriteResult:
    fn: Callable[..., list[Any]] | None  # None: keep the original program
    report: RewriteReport
    program: Program | None  # None: not encoded (over limits.equations)
    view: EGraphView | None = None
    extraction: Extraction | None = None
    costs: dict[str, float] | None = None
    before: EGraphView | None = None  # the e-graph before any rule ran
    closed: Any = None  # the program rewritten (a closed jaxpr)
    # the control-flow bodies rewritten within it, each named by where it is (control.py)
    bodies: list[tuple[str, RewriteResult]] = field(default_factory=list)
    # the program as written without its jax.debug calls, for verify=True (rewrite/effects.py)
    reference: Callable[..., list[Any]] | None = None
    written: Any = None  # the program as written, calls and all, where `closed` is it without them

    def release(self) -> None:
        """Drop the e-graphs of this finished rewrite and its bodies': the decoded program reads
        only the side tables, and the e-graph was lent (lease.py). One kept per signature was
        ~10 MB (a new user's batch sizes 1..200: 2.5 GB against jax.jit's 0.5 GB)."""
        if self.program is not None:
            self.program.egraph = None
        for _, body in self.bodies:
            body.release()


def _stage(name: str, fn: Callable, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except JaxrwError:  # deliberate errors (unsupported program, bad option) keep their type
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit, Interrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - a Rust panic in egglog arrives as a BaseException
        raise RewriteStageError(name, e) from e


def saturate(
    program: Program, rules: Sequence[Rule], limits: Limits, report: RewriteReport, guarded: bool = False
) -> None:
    """Run `rules` (with the shape analysis) until saturation or a limit; fill the report.
    `guarded`: inexact rules leave values that reach a saturating op alone (nonfinite.py)."""
    eg = program.egraph
    t0 = time.perf_counter()  # the seeds and their analysis count against limits.time_s too
    for r in rules:  # group identities, written once (rules/__init__.py: Rule.seed)
        joined = r.seed(program) if r.seed is not None else 0
        if joined:
            report.rules_fired[r.name] = report.rules_fired.get(r.name, 0) + joined
    _run(eg, analysis.saturate())
    if not rules:
        report.stop_reason = StopReason.NO_RULES
        return
    from egglog import ruleset

    decl_names, is_late = {}, {}
    rewrites = []
    for r in rules:
        for rw in r.rewrites(guarded):
            if not is_finding(rw.decl):  # a finding rewrites nothing: not counted as fired
                decl_names[rw.decl] = r.name
            is_late[rw.decl] = r.late
            rewrites.append(rw)
    if program.symbols:  # only rewrites that can ever match this program (reach.py)
        fires = can_fire(rewrites, program.symbols, analysis_rules())
        report.rewrites_skipped = len(rewrites) - sum(fires)
        rewrites = [rw for rw, ok in zip(rewrites, fires, strict=True) if ok]
    main = [rw for rw in rewrites if not is_late[rw.decl]]
    late = [rw for rw in rewrites if is_late[rw.decl]]
    if main:
        rs = ruleset(*main, name=f"jaxrw_rules_{id(program)}")
        _register(eg, rs)
        _run_main(eg, rs, decl_names, limits, report, t0)
    else:
        report.stop_reason = StopReason.SATURATED
    if late:  # once, after the main rules: nothing they add is matched again
        rs = ruleset(*late, name=f"jaxrw_late_{id(program)}")
        _register(eg, rs)
        _run_late(eg, rs, decl_names, limits, report)


def _register(eg: Any, rs: Any) -> None:
    """Add the rules of ruleset `rs` to `eg` in one batch of egglog commands. egglog-python does
    it at the ruleset's first run, one batch per rule, and each batch costs more the more global
    names the e-graph holds (the encoder's lets, one per equation): an RNN gradient of 8,400
    equations, rewrite phase 4.8-5.1 -> 3.7-4.4 s (bench/large_program_cpu.py). They are still
    added after the program is loaded: added before it, the rules searched a sum of 16 scaled
    products 11x longer (62 s to the time limit, against 5.5 s; tests/rewrite/rules/test_limits.py),
    for a cause inside egglog not known."""
    try:  # egglog-python's internals (egglog 14): where they differ, its own way at the first run
        from egglog import bindings
        from egglog.declarations import RulesetDecl
        from egglog.egraph_state import span

        schedule = run_schedule(rs)
        eg._add_decls(schedule)
        state = eg._state
        ident = schedule.schedule.ruleset
        decl = state.__egg_decls__._rulesets.get(ident)
        registered, transcript = ident in state.rulesets, state.egglog_file_state is not None
        if not isinstance(decl, RulesetDecl) or registered or transcript:  # its own way then
            return
        commands = [bindings.AddRuleset(span(), str(ident))]
        for rule in decl.rules:
            commands.extend(state.commands_to_egg(rule, ident))
    except (ImportError, AttributeError, TypeError):
        return
    state.run_program(*commands)
    state.rulesets[ident] = set(decl.rules)


@dataclass
class _Ran:
    """What one run of a schedule did: whether it changed the e-graph, the matches it applied by
    jaxrw rule name, and the matches each rule found per iteration (applied or dropped)."""

    updated: bool
    fired: dict[str, int]
    found: list[int]


def _run(eg: Any, schedule: Any, decl_names: dict[Any, str] | None = None) -> _Ran:
    """eg.run(schedule), without egglog-python's RunReport: it hashes every rule's declaration for
    every iteration's report (a Hessian of a GP likelihood: 815k hash calls, 0.6 of 3.5 s), where
    a rule's name, looked up once, does."""
    names = decl_names or {}
    try:  # egglog-python's internals (egglog 14): where they differ, its public report
        eg._add_decls(schedule)
        state = eg._state
        rule_map = state.rule_name_to_command_decl
        (out,) = state.run_program(state.run_schedule_to_egg(schedule.schedule))
    except AttributeError:
        return _run_public(eg, schedule, names)
    named: dict[str, str | None] = {}

    def name_of(key: str) -> str | None:
        if key not in named:
            named[key] = names.get(rule_map.get(key)) if key in rule_map else None
        return named[key]

    return _ran(out.report, name_of)


def _run_public(eg: Any, schedule: Any, decl_names: dict[Any, str] | None = None) -> _Ran:
    """`_run` through egglog-python's public RunReport (its rules keyed by declaration)."""
    names = decl_names or {}
    return _ran(eg.run(schedule), names.get)


def _ran(report: Any, name_of: Callable[[Any], str | None]) -> _Ran:
    """A run report's _Ran: its rules named by `name_of` (None: not counted)."""
    fired: dict[str, int] = {}
    for key, n in report.num_matches_per_rule.items():
        if n and (name := name_of(key)):
            fired[name] = fired.get(name, 0) + n
    found = [
        sum(r.num_matches for r in reports)
        for it in report.iterations
        for reports in it.rule_set_report.rule_reports.values()
    ]
    return _Ran(report.updated, fired, found)


def _count_fired(ran: _Ran, report: RewriteReport) -> None:
    for name, n in ran.fired.items():
        report.rules_fired[name] = report.rules_fired.get(name, 0) + n


_BOOKKEEPING = (cone, touched, saturating_name, exact_dtype)  # marks, not e-nodes: not in limits.nodes


def _size(eg: Any) -> int:
    """The e-graph's rows that count against limits.nodes."""
    return sum(n for f, n in eg.all_function_sizes() if f not in _BOOKKEEPING)


def _run_main(
    eg: Any, rs: Any, decl_names: dict[Any, str], limits: Limits, report: RewriteReport, t0: float
) -> None:
    """Iterate the main ruleset until saturation or the first limit; record why it stopped."""
    report.stop_reason = StopReason.ITERATION_LIMIT
    last, growth = _size(eg), 1.0
    # already past a limit before any rule ran (2,000 independent products: the encoding and
    # batch.stack_dots's seed made 70k rows, and a first iteration took 10 s more under time_s=1)
    if last > limits.nodes:
        report.stop_reason = StopReason.NODE_LIMIT
        return
    if time.perf_counter() - t0 > limits.time_s:
        report.stop_reason = StopReason.TIME_LIMIT
        return
    for i in range(limits.iterations):
        before_iteration = time.perf_counter() - t0
        ran = _run(eg, run_schedule(rs) + analysis.saturate(), decl_names)
        report.iterations = i + 1
        _count_fired(ran, report)
        if not ran.updated:
            report.stop_reason = StopReason.SATURATED
            break
        size = _size(eg)
        # The limits are only checked between iterations, and one egglog iteration cannot be cut
        # short, so stop also when the next one would pass them: growing as this one did, faster
        # still where growth is accelerating (under "fast", (a@b)*0.0 + a grew 331 -> 3,983 rows,
        # projected 48k at this one's rate, then 937k in 40 s), and taking as much longer as the
        # e-graph grows (the time check assumed no growth: (a@b)*0.0 ran 15 minutes past 2 s).
        rate = size / max(last, 1)
        ahead = max(1.0, rate) * max(1.0, rate / growth)
        if size > limits.nodes or size * ahead > limits.nodes:
            report.stop_reason = StopReason.NODE_LIMIT
            break
        last, growth = size, max(rate, 1.0)
        elapsed = time.perf_counter() - t0
        if elapsed > limits.time_s or elapsed + (elapsed - before_iteration) * ahead > limits.time_s:
            report.stop_reason = StopReason.TIME_LIMIT
            break


_ROWS_PER_MATCH = 4  # rows a late match adds (batch.index_rows: a reshape, a dot, a slice; 3.25 measured)


def _run_late(eg: Any, rs: Any, decl_names: dict[Any, str], limits: Limits, report: RewriteReport) -> None:
    """Run the late rules once, a rule with more matches than fit in the rows left under
    limits.nodes not at all (egglog's back-off scheduler drops its matches): after a sum of 16 products of
    scaled 16x16 matrices stopped at 32k rows, `batch.index_rows` matched 159k times and grew
    the e-graph to 265k rows, extracted in 14 s (with 36 products, 1.45M rows in 86 s)."""
    left = limits.nodes - _size(eg)
    most = max(1, int(left) // _ROWS_PER_MATCH) if left != math.inf else 0
    limited = {"scheduler": back_off(match_limit=most, ban_length=1)} if most else {}
    ran = _run(eg, run_schedule(rs, **limited), decl_names)  # apart from the analysis: not counted
    _run(eg, analysis.saturate())
    _count_fired(ran, report)
    found = ran.found  # matches each rule found, applied or dropped (fired: applied only)
    over = _size(eg) > limits.nodes or (most and any(n > most for n in found))
    if over and report.stop_reason is StopReason.SATURATED:  # else the main rules' limit stands
        report.stop_reason = StopReason.NODE_LIMIT


# egglog's rule declarations (made at the process's first rewrite) and e-graphs are not safe to
# use from two threads at once: one rewrite at a time (reentrant: bodies are rewritten within)
_ONE_AT_A_TIME = threading.RLock()


def _one_at_a_time(fn: Callable) -> Callable:
    """`fn` (a rewrite of one program) runs under the process's lock, on an e-graph lent to it
    (lease.py): its result holds none (`release`), as the template's e-graph no longer has it."""

    @functools.wraps(fn)
    def serialized(*args: Any, **kwargs: Any) -> Any:
        with _ONE_AT_A_TIME:
            with lease.lent():
                result = fn(*args, **kwargs)
            result.release()
            return result

    return serialized


@_one_at_a_time
def rewrite_jaxpr(
    closed: Any,
    *,
    rules: str | Sequence[str] | None = None,
    cost_model: str | CostModel = "roofline",
    profile: Profile,
    extractor: str = "greedy",
    limits: Limits | None = None,
    numerics: str = "default",
    force: bool = False,
    slow: frozenset[int] = frozenset(),
    max_hoist_bytes: int = DEFAULT_MAX_HOIST_BYTES,
    control_flow: bool = True,
    cone_outputs: frozenset[int] = frozenset(),
    sharded: str = "",
    _note: str = "",
    _exact_note: str = "",
    _dropped: frozenset[str] = frozenset(),
    _deadline: float | None = None,
    _split: bool = False,
    _body: bool = False,
) -> RewriteResult:
    """Optimize one ClosedJaxpr. `force=True` skips the guard (for tests and measured top-k).

    `slow` names flat inputs whose work is hoisted out of the hot call: the cost model prices it
    as free and the decoded function carries the prologue/main split (`fn.hoisted`). Past
    `max_hoist_bytes` of hoisted values, nothing is hoisted and the report says why.
    `control_flow` rewrites the bodies of scan/while/cond too (recursively, see control.py).
    `cone_outputs`: outputs that reach a saturating op outside (a body's; nonfinite.py).
    `sharded`: where the call's arrays are split along an inner axis (signature.split_inner_axis):
    the program is kept as written, since the cost model prices no communication.
    `limits.time_s` bounds the signature's saturation as a whole: control-flow bodies and a rerun
    (exact rules only, or nothing hoisted) take what is left of it (`_deadline`).
    `_split`: `closed` is a program whose jax.debug calls were taken out (loops that make some
    stay: it still has effects, and is not split again); `_body`: a control-flow body, kept as
    written where its calls cannot be taken out (as the whole program falls back)."""
    limits = limits or Limits()
    deadline = time.perf_counter() + limits.time_s if _deadline is None else _deadline
    # the options a nested or repeated run shares with this one
    same = dict(
        rules=rules,
        cost_model=cost_model,
        profile=profile,
        extractor=extractor,
        limits=limits,
        numerics=numerics,
        max_hoist_bytes=max_hoist_bytes,
        sharded=sharded,  # a program without its jax.debug calls is kept as written too
        _deadline=deadline,
    )
    split = split_callbacks(closed) if closed.effects and not _split else None  # jax.debug.print
    if split is not None:
        pure, calls = split
        why = "not hoisted: the function makes jax.debug calls (print, callback)" if slow else _note
        # a body's own outputs come first (the same indices); the calls' values follow: a call is
        # user code the e-graph does not model, so what it reads keeps jax.jit's non-finite values
        cone = cone_outputs | calls.value_outputs()
        kw = dict(
            force=force, control_flow=control_flow, _note=why, _exact_note=_exact_note, _dropped=_dropped
        )
        result = calls.applied(rewrite_jaxpr(pure, **same, **kw, cone_outputs=cone, _split=True), pure)
        result.written = closed  # a body's explanation shows its calls in their places
        return result
    model = get_cost_model(cost_model, profile)
    extract_fn = get_extractor(extractor)
    selected = select_rules(rules, numerics)
    chosen = [r for r in selected if r.name not in _dropped]  # a non-finite rerun leaves some out
    report = RewriteReport(cost_model=model.name, hoist_note=_note, nonfinite_note=_exact_note)
    report.rules_note = left_out(rules, numerics, selected)
    n_eqns = count_equations(closed.jaxpr)
    kept = None  # why the program is kept as written without being encoded
    if sharded:  # a rewrite there changed output shardings and added collectives (0.4x on CPU)
        kept = StopReason.SHARDED, f"{sharded} (tensor parallel): kept as written (docs/multi-gpu.md)"
    elif n_eqns > limits.equations:
        note = f"{n_eqns} equations > limits.equations {limits.equations}: not rewritten"
        kept = StopReason.SIZE_LIMIT, note
    elif _deadline is not None and time.perf_counter() >= deadline:  # a body or rerun, too late
        before = "before this program"
        if _exact_note:
            without = f"without {', '.join(sorted(_dropped))}" if _dropped else "with exact rules only"
            before = f"before its rerun {without} (non-finite)"
        kept = StopReason.TIME_LIMIT, f"limits.time_s {limits.time_s:g} s spent {before}: kept as written"
    elif _body and closed.effects and not _split:  # split_callbacks could not take them apart
        kept = StopReason.EFFECTS, "its effects are not taken apart (rewrite/effects.py): kept as written"
    elif (bad := _negative_shape(closed.jaxpr)) is not None:  # jax.random.normal(k, (-1,)) traces
        kept = StopReason.BAD_SHAPE, f"a value has the shape {bad}: kept as written (XLA refuses it)"
    if kept is not None:
        report.n_equations, report.n_outputs = n_eqns, len(closed.jaxpr.outvars)
        report.stop_reason, report.guard_note = kept
        return RewriteResult(None, report, None, closed=closed)
    t = time.perf_counter()
    hook, bodies = None, []
    # the same program again, with other options (exact rules only, or nothing hoisted)
    again = functools.partial(
        rewrite_jaxpr,
        closed,
        force=force,
        control_flow=control_flow,
        cone_outputs=cone_outputs,
        _split=_split,  # a program without its calls is not split again
    )
    if control_flow:
        from .control import make_body_hook

        def rewrite_body(body: Any, body_slow: frozenset[int], body_cone: frozenset[int]) -> RewriteResult:
            return rewrite_jaxpr(body, **same, slow=body_slow, cone_outputs=body_cone, _body=True)

        hook = make_body_hook(rewrite_body, bodies)
    program = _stage("encode", encode, closed, hook, cone_outputs, lease.current())
    report.bodies = [res.report for _, res in bodies]
    report.n_equations, report.n_outputs = program.n_equations, len(program.outputs)
    report.phase_s["encode"] = time.perf_counter() - t
    log.debug("encode: %s in %.1f ms", program.describe(), report.phase_s["encode"] * 1e3)

    t = time.perf_counter()
    _stage("rewrite", lambda: _run(program.egraph, analysis.saturate()))
    before = _stage("rewrite", EGraphView.from_egraph, program.egraph)
    left = dataclasses.replace(limits, time_s=max(deadline - time.perf_counter(), 1e-6))  # bodies took some
    _stage("rewrite", saturate, program, chosen, left, report, numerics == "default")
    report.phase_s["rewrite"] = time.perf_counter() - t
    log.debug(
        "rewrite: %d rules, %d iterations, stop: %s, fired %s in %.1f ms",
        len(chosen),
        report.iterations,
        report.stop_reason.value,
        report.rules_fired or "none",
        report.phase_s["rewrite"] * 1e3,
    )

    t = time.perf_counter()
    view = _stage("extract", EGraphView.from_egraph, program.egraph).with_slow(slow)
    in_cone = [view.outputs[i] for i in cone_outputs]
    unsafe = _stage("extract", unsafe_classes, view, in_cone) if numerics == "default" else set()
    if unsafe:  # a class changed by an inexact rule joined a saturating op's cone after the change
        rerun = _rerun_safely(again, same, slow, unsafe, view, report, _dropped)
        for phase, took in report.phase_s.items():  # the time of both runs (a time limit reads so)
            rerun.report.phase_s[phase] = rerun.report.phase_s.get(phase, 0.0) + took
        return rerun
    report.egraph_nodes, report.egraph_classes = view.n_nodes, view.n_classes
    costs = _stage("extract", node_costs, view, model)
    ex = _stage("extract", extract_fn, view, costs)
    if closed.effects and not _stage("extract", _binds_effects_once, program, view, ex.choice):
        report.stop_reason = StopReason.EFFECTS
        report.guard_note = "a loop that makes jax.debug calls is not bound once by the rewrite: kept"
        return RewriteResult(None, report, program, view, ex, None, before, closed, bodies)
    report.extractor, report.extractor_note = ex.extractor, ex.note
    # what XLA does next (its dot merger on a GPU) counts for both programs
    report.cost_after = _stage("extract", program_cost, view, ex.choice, costs, model)
    before_costs = _stage("extract", node_costs, before, model)
    report.cost_before = _stage("extract", program_cost, before, _only_choice(before), before_costs, model)
    report.phase_s["extract"] = time.perf_counter() - t
    log.debug(
        "extract: %d nodes, %d classes, %s, cost %.3g -> %.3g in %.1f ms",
        view.n_nodes,
        view.n_classes,
        ex.extractor,
        report.cost_before,
        report.cost_after,
        report.phase_s["extract"] * 1e3,
    )

    # a call's fixed dispatch is paid either way: gains on tiny programs must beat it too
    total_before = report.cost_before + profile.call_s
    gain = 1.0 - (report.cost_after + profile.call_s) / total_before if total_before > 0 else 0.0
    bodies_rewritten = sum(1 for b in report.bodies if b.rewritten)
    if not force and gain < limits.min_gain and not bodies_rewritten:
        report.rewritten = False
        report.guard_note = f"predicted gain {gain * 100:.2f}% < margin {limits.min_gain * 100:g}%"
        report.cost_after = report.cost_before
        log.debug("guard: original kept (%s)", report.guard_note)
        return RewriteResult(None, report, program, view, ex, costs, before, closed, bodies)

    t = time.perf_counter()
    original = frozenset(original_classes(before, view))
    fn = _stage("decode", decode, program, view, ex.choice, original)
    hoisted = getattr(fn, "hoisted", None)
    if hoisted is not None and hoisted.nbytes > max_hoist_bytes:
        report.hoist_note = f"not hoisted: {hoisted.nbytes} bytes > max_hoist_bytes {max_hoist_bytes}"
        report.phase_s["decode"] = time.perf_counter() - t
        return again(**same, _note=report.hoist_note)
    report.hoisted_bytes = hoisted.nbytes if hoisted is not None else 0
    report.hoisted_in_loop = _body and hoisted is not None
    if hoisted is not None and not _body:  # parameter sets in turn get values of their own while they fit
        report.hoisted_sets = hoisted.fit(max_hoist_bytes)
    report.phase_s["decode"] = time.perf_counter() - t
    report.rewritten = True
    log.debug("decode: rewritten program built in %.1f ms", report.phase_s["decode"] * 1e3)
    return RewriteResult(fn, report, program, view, ex, costs, before, closed, bodies)


def _binds_effects_once(program: Program, view: EGraphView, choice: dict[str, str]) -> bool:
    """Whether the chosen program binds each equation with effects (a loop that makes jax.debug
    calls) exactly once, and all of it in one function (nothing hoisted: decode splits there)."""
    chosen = [view.nodes[choice[c]] for c in reachable(view, choice, view.outputs)]
    return not view.slow and bound_once(program, chosen)


def _negative_shape(jaxpr: Any) -> tuple | None:
    """The first shape of a value of this jaxpr with a negative dimension (jax traces some; the
    cost model would price them below zero, and XLA refuses them), or None."""
    for v in (*jaxpr.invars, *(v for e in jaxpr.eqns for v in e.outvars)):
        dims = getattr(getattr(v, "aval", None), "shape", ())
        if any(isinstance(n, int) and n < 0 for n in dims):
            return tuple(dims)
    return None


def _rerun_safely(again, same, slow, unsafe, view, report, dropped) -> RewriteResult:
    """The program rewritten again where inexact rules changed values that reach a saturating op
    (`unsafe`): without the rules that changed them (their marks: nonfinite.rules_of_marks), and
    where that run has such values too, or the marks name no rule, with exact rules only. A
    transformer's DP-SGD step lost every rewrite to one scalar move at a clipping divisor."""
    offending = rules_of_marks(view.touched.get(c, 0) for c in unsafe)
    first = f"(the first run: {report.iterations} iterations, stop: {report.stop_reason.value})"
    why = f"{len(unsafe)} values changed by inexact rules reach a saturating op"
    if offending and not dropped:
        note = f"{why}: rewritten again without {', '.join(sorted(offending))} {first}"
        options = same  # the user's rules spec kept, for the report's rules_note
    else:
        note = f"{why}: exact rules only {first}"
        options, offending = {**same, "numerics": "strict"}, frozenset()
    log.debug("non-finite guard: %s", note)
    return again(**options, slow=slow, _exact_note=note, _dropped=frozenset(offending))


def _only_choice(view: EGraphView) -> dict[str, str]:
    """The program as written: before any rule, the cheapest node per class is the original one
    (classes hold one node each except where identical equations were shared)."""
    return {c: nids[0] for c, nids in view.classes.items()}


def original_classes(before: EGraphView, after: EGraphView) -> set[str]:
    """Classes of `after` that contain an original node: same op and attributes, and children of
    the same shapes and dtypes (class ids differ between the two views). Without the children, a
    slice of a stack of constant weights matched the program's slice `xs[0]` (both (0, 0, 1)) and
    was taken for the program as written, so decode did not fold the stack."""

    def key(view: EGraphView, n: Any) -> tuple:
        kids = tuple((view.shapes.get(c), view.dtypes.get(c)) for c in n.children)
        return n.op, n.attrs, kids

    keys = {key(before, n) for n in before.nodes.values()}
    return {n.eclass for n in after.nodes.values() if key(after, n) in keys}

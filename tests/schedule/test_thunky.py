"""Emission and policy: every emitted program traces and lowers (as far as CPU allows); modes behave."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.errors import InvalidOptionError, JaxrwError
from jaxrw.rewrite.measure import Timing
from jaxrw.rewrite.profiles import H200
from jaxrw.schedule import (
    H200_STREAMS,
    Scheduled,
    ScheduleUnavailableError,
    apply,
    choose,
    cuda_available,
    emit,
    lower_to_dialect,
    plan_program,
    schedule_program,
    thunky_available,
)
from jaxrw.schedule import thunky as sched_thunky
from jaxrw.schedule import timing as sched_timing
from jaxrw.schedule.xla_modes import XLA_MODES, TopLevel

from .programs import (
    PROGRAMS,
    assert_matches_jit_directly,
    cell,
    donated,
    experts_packed,
    flat,
    pretend_cuda,
    specs_of,
)

needs_cuda = pytest.mark.skipif(not (cuda_available() and thunky_available()), reason="needs CUDA and thunky")


def _setup(make, k):
    fn, args, donate = make(np.random.default_rng(0))
    specs = specs_of(args)
    closed, shape = jax.make_jaxpr(flat(fn), return_shape=True)(*specs)
    plan = plan_program(closed, H200, streams=k, donate=donate)
    return plan, fn, args, specs, donate, jax.tree_util.tree_structure(shape)


def _big_plan():
    from .test_plan import THIN_GEMMS

    e, m, d = 4, 256, 8192
    specs = [jax.ShapeDtypeStruct((e, m, d), "bfloat16"), jax.ShapeDtypeStruct((e, d, d), "bfloat16")]
    f = lambda x, w: [jnp.stack([jnp.tanh(x[i] @ w[i]) for i in range(e)])]  # noqa: E731
    return plan_program(jax.make_jaxpr(f)(*specs), THIN_GEMMS)


# -- policy ---------------------------------------------------------------------------------------


def test_thunky_imports_here():
    assert thunky_available()  # jax 0.12 ships thunky and its dialect, CPU included


@pytest.mark.parametrize("thunky", [True, False])
@pytest.mark.parametrize("cuda", [True, False])
def test_policy(thunky, cuda):
    gain, loss = _big_plan(), _setup(experts_packed, None)[0]
    assert gain.predicted_speedup > 1.1 and loss.predicted_speedup < 1.0
    assert not choose("xla", gain, thunky=thunky, cuda=cuda).use_thunky
    auto_gain = choose("auto", gain, thunky=thunky, cuda=cuda)
    assert auto_gain.use_thunky == (thunky and cuda)
    assert not choose("auto", loss, thunky=thunky, cuda=cuda).use_thunky
    assert not choose("auto", None, thunky=thunky, cuda=cuda).use_thunky
    if thunky and cuda:
        assert choose("streams", loss, thunky=thunky, cuda=cuda).use_thunky
        assert "predicted" in auto_gain.reason
    else:
        with pytest.raises(ScheduleUnavailableError, match="CUDA" if thunky else "thunky") as err:
            choose("streams", loss, thunky=thunky, cuda=cuda)
        assert isinstance(err.value, JaxrwError) and "schedule='auto'" in str(err.value)


def test_auto_times_a_plan_of_streams_predicted_at_parity():
    # a timing confirms "auto"'s thunky program, so a plan of several streams predicted at parity is
    # worth one; without a timing, or on one stream, the plan must promise min_gain
    near = dataclasses.replace(_big_plan())
    assert near.streams > 1
    near.thunky_s = near.xla_s / 1.01
    assert choose("auto", near, thunky=True, cuda=True, measured=True).use_thunky
    unmeasured = choose("auto", near, thunky=True, cuda=True)
    assert not unmeasured.use_thunky and "1.11x a schedule must promise" in unmeasured.reason
    below = dataclasses.replace(near)
    below.thunky_s = below.xla_s / 0.97
    timed = choose("auto", below, thunky=True, cuda=True, measured=True)
    assert not timed.use_thunky and "1.00x a schedule must promise to be timed" in timed.reason
    one = _setup(cell, 1)[0]
    one.thunky_s = one.xla_s / 1.05
    assert one.streams == 1 and not choose("auto", one, thunky=True, cuda=True, measured=True).use_thunky
    # each region is a compilation of its own: a plan of many regions must promise min_gain too
    few = dataclasses.replace(H200_STREAMS, trial_regions=len(near.regions) - 1)
    many = choose("auto", near, thunky=True, cuda=True, measured=True, costs=few)
    assert not many.use_thunky and "1.11x a schedule must promise" in many.reason


def test_unknown_mode():
    with pytest.raises(JaxrwError, match="valid"):
        choose("fast")


def test_missing_thunky_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(sched_thunky, "thunky_available", lambda: False)
    monkeypatch.setattr(sched_thunky, "_said", set())
    fn, args, _ = chain_args()
    with caplog.at_level(logging.INFO, logger="jaxrw"):
        for _ in range(3):
            f = apply("auto", fn, specs_of(args))
            np.testing.assert_allclose(f(*args)[0], fn(*args)[0], rtol=1e-5)
    said = [r for r in caplog.records if "thunky is not available" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def chain_args():
    from .programs import chain

    fn, args, donate = chain(np.random.default_rng(0))
    return fn, args, donate


@pytest.mark.skipif(cuda_available(), reason="checks the behaviour without CUDA")
def test_modes_without_cuda():
    fn, args, _ = chain_args()
    specs = specs_of(args)
    for mode in ("auto", "xla"):
        assert schedule_program(fn, specs, mode, H200) is None
        out = apply(mode, fn, specs)
        np.testing.assert_allclose(out(*args)[0], jax.jit(fn)(*args)[0], rtol=1e-6)
    with pytest.raises(ScheduleUnavailableError, match="CUDA device"):
        apply("streams", fn, specs)
    plan = _setup(cell, 2)[0]
    with pytest.raises(ScheduleUnavailableError):
        schedule_program(fn, specs, plan, H200)


def test_apply_keeps_donation():
    fn, args, donate = donated(np.random.default_rng(0))
    f = apply("xla", flat(fn), specs_of(args), donate)
    x = jnp.asarray(args[0])
    f(x, *args[1:])
    assert x.is_deleted() or jax.default_backend() == "cpu"  # CPU may ignore donation


# -- emission -------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("make", PROGRAMS, ids=lambda m: m.__name__)
def test_every_emitted_program_traces(make, k):
    plan, fn, args, specs, donate, tree = _setup(make, k)
    jaxpr = jax.make_jaxpr(emit(plan, donate, tree))(*specs)
    text = str(jaxpr)
    assert text.count("thunky.call_jax") == len(plan.regions)
    assert text.count("thunky.async_start") == sum(s.kind == "start" for s in plan.steps)
    assert text.count("thunky.async_done") == sum(s.kind == "done" for s in plan.steps)
    mlir = lower_to_dialect(plan, specs, compile_regions=False)
    assert mlir.count("thunky.async_start") == sum(s.kind == "start" for s in plan.steps)
    streams = {s.stream - 1 for s in plan.steps if s.kind == "start"}
    assert all(f"stream = {i}" in mlir for i in streams)
    outs = jax.eval_shape(emit(plan, donate, tree), *specs)
    want = jax.eval_shape(flat(fn), *specs)
    assert jax.tree_util.tree_structure(outs) == jax.tree_util.tree_structure(want)
    for o, w in zip(jax.tree_util.tree_leaves(outs), jax.tree_util.tree_leaves(want), strict=True):
        assert o.shape == w.shape and o.dtype == w.dtype


@pytest.mark.parametrize(
    ("make", "k"), [(cell, 4), (experts_packed, 4), (donated, 1)], ids=["cell", "experts", "donated"]
)
def test_lowers_to_the_thunky_dialect(make, k):
    plan, _, _, specs, _, _ = _setup(make, k)
    text = lower_to_dialect(plan, specs, compile_regions=True)
    assert "func.func @main" in text and "!thunky.buffer" in text
    assert text.count("thunky.async_start") == sum(s.kind == "start" for s in plan.steps)
    assert text.count("thunky.async_done") == sum(s.kind == "done" for s in plan.steps)
    if any(b.kind in ("view", "part") for b in plan.buffers.values()):
        assert "thunky.slice_buffer" in text


def test_scheduled_uses_xla_under_transformations():
    fn, args, _ = chain_args()
    specs = specs_of(args)
    plan = plan_program(jax.make_jaxpr(fn)(*specs), H200)

    def boom(*a):
        raise AssertionError("the thunky program ran under a transformation")

    s = Scheduled(boom, jax.jit(fn), plan, sched_thunky.Decision(True, "test"))
    g = jax.grad(lambda x: s(x, *args[1:])[0].sum())(args[0])
    want = jax.grad(lambda x: fn(x, *args[1:])[0].sum())(args[0])
    np.testing.assert_allclose(g, want, rtol=1e-5)
    batched = jax.vmap(lambda x: s(x, *args[1:])[0])(jnp.stack([args[0]] * 2))
    assert batched.shape[0] == 2
    with pytest.raises(AssertionError, match="ran under"):
        s(*args)  # a plain call takes the thunky path
    assert "Scheduled(test)" in repr(s)


# -- on the device --------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("make", PROGRAMS, ids=lambda m: m.__name__)
def test_streams_match_jit_on_gpu(make):
    fn, args, donate = make(np.random.default_rng(1))
    want = jax.jit(fn)(*args)
    got = apply("streams", fn, specs_of(args), ())(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-5, atol=1e-5)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 4])
def test_forced_stream_plans_match_jit_on_gpu(k):
    plan, fn, args, specs, _, tree = _setup(cell, k)
    out = schedule_program(fn, specs, plan, H200)(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(fn)(*args)), rtol=1e-5, atol=1e-5)


@needs_cuda
@pytest.mark.gpu
def test_emitted_program_runs_through_its_executable_on_gpu():
    # jax's Python dispatch would cost ~12 µs per argument here (schedule/direct.py); the emitted
    # program calls its executable directly from its first call on, with jax.jit's results
    plan, fn, host_args, specs, donate, tree = _setup(experts_packed, 2)
    args = [jnp.asarray(a) for a in host_args]  # numpy arguments would go to jax.jit (it places them)
    assert_matches_jit_directly(emit(plan, (), tree), fn, args, rtol=1e-5)


# -- auto on CUDA, simulated here ----------------------------------------------------------------

# a device so slow at matrix products that every branch is worth a stream of its own
SLOW = dataclasses.replace(H200, matmul_flops={"float32": 1e9}, gemm_efficiency={0: 0.2})


def test_auto_follows_predictions_without_measuring(monkeypatch):
    pretend_cuda(monkeypatch)
    fn, args, _ = cell(np.random.default_rng(0))
    specs = specs_of(args)
    picked = apply("auto", fn, specs, (), SLOW, measure=False, concurrent_xla=False)
    assert isinstance(picked, Scheduled) and picked.plan.streams > 1
    # XLA overlapping the same branches in a graph pays no host launches: predicted faster still
    picked = apply("auto", fn, specs, (), SLOW, measure=False)
    assert not isinstance(picked, Scheduled)
    np.testing.assert_allclose(picked(*args), fn(*args), rtol=1e-5)
    plain = apply("auto", fn, specs, (), H200, measure=False, concurrent_xla=False)
    assert not isinstance(plain, Scheduled)  # tiny kernels on an H200: XLA's schedule
    np.testing.assert_allclose(plain(*args), fn(*args), rtol=1e-5)


@pytest.mark.parametrize("donate", [(), (0,)])
def test_auto_keeps_the_very_program_it_timed_unless_inputs_are_donated(monkeypatch, donate):
    # compiled again, a pick could run apart from what was measured (H200 run g3: measured 1.10x,
    # ran 0.85x); timed on the caller's inputs, a donating program cannot be the one timed
    pretend_cuda(monkeypatch)
    seen = {}

    def pick(base, trial, specs, name, **kw):
        seen.update(trial)
        return "thunky", 1.3

    monkeypatch.setattr(sched_thunky, "pick_fastest", pick)
    fn, args, _ = cell(np.random.default_rng(0))
    sel = sched_thunky.select(fn, specs_of(args), donate, SLOW, concurrent_xla=True)
    assert sel.choice == "thunky" and isinstance(sel.fn, Scheduled)
    assert (sel.fn.fast is seen["thunky"]) == (not donate)
    assert sel.fn.fast.otherwise is sel.fn.fallback  # no executor: XLA's program, not jax's dispatch

    def pick_mode(base, trial, specs, name, **kw):
        seen.update(trial)
        return "xla-graphs", 1.2

    monkeypatch.setattr(sched_thunky, "pick_fastest", pick_mode)
    sel = sched_thunky.select(fn, specs_of(args), donate, SLOW)
    assert sel.choice == "xla-graphs" and (sel.fn is seen["xla-graphs"]) == (not donate)
    np.testing.assert_allclose(sel.fn(*args), fn(*args), rtol=1e-5)


def test_forced_streams_keep_to_xla_peak_memory(monkeypatch):
    # the planner's streams compiled to more peak memory than jax.jit's program (on the H200:
    # experts_medium_4, two streams 502 MiB, XLA 462): one stream instead, and the reason says so
    pretend_cuda(monkeypatch)
    fn, args, _ = cell(np.random.default_rng(0))
    specs = specs_of(args)
    mib = 1 << 20

    def peaks(extra):
        def peak(f, a):
            return 100 * mib + (extra if "jaxrw_scheduled" in getattr(f, "__name__", "") else 0)

        return peak

    monkeypatch.setattr(sched_thunky, "peak_bytes", peaks(40 * mib))
    one = schedule_program(fn, specs, "streams", SLOW)
    assert one.plan.streams == 1 and one.decision.reason.startswith("one stream: ")
    assert "140.0 MiB of peak memory, XLA 100.0 MiB" in one.decision.reason
    monkeypatch.setattr(sched_thunky, "peak_bytes", peaks(4096))  # within the allowance: kept
    kept = schedule_program(fn, specs, "streams", SLOW)
    assert kept.plan.streams > 1
    monkeypatch.setattr(sched_thunky, "peak_bytes", lambda f, a: None)  # unknown: kept
    assert schedule_program(fn, specs, "streams", SLOW).plan.streams > 1


def test_auto_survives_a_candidate_that_fails(monkeypatch, caplog):
    pretend_cuda(monkeypatch)  # the thunky candidate cannot run on this CPU: auto must shrug it off
    fn, args, _ = cell(np.random.default_rng(0))
    with caplog.at_level(logging.INFO, logger="jaxrw"):
        f = apply("auto", fn, specs_of(args), (), SLOW)
    assert not isinstance(f, Scheduled)
    assert any("thunky schedule of" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(f(*args), fn(*args), rtol=1e-5)


def test_concurrent_xla_options_compile():
    fn, args, _ = cell(np.random.default_rng(0))
    f = jax.jit(fn, compiler_options=XLA_MODES["xla-concurrent"])
    np.testing.assert_allclose(f(*args), fn(*args), rtol=1e-5)


def _fake_seconds(monkeypatch, seconds):
    """pick_fastest's clocks (its first probe and the interleaved samples) report `seconds(fn)`."""
    monkeypatch.setattr(sched_timing, "time_call", lambda f, args, calls=20: seconds(f))

    def measure(variants, repeats, **kw):
        return {k: Timing([seconds(f)] * repeats, calls=1) for k, (f, _args) in variants.items()}

    monkeypatch.setattr(sched_timing, "measure", measure)


def test_auto_takes_a_faster_schedule_over_the_memory_bound_only_with_slack(monkeypatch):
    # a candidate 2x faster at 4% more peak memory: refused by default, taken with 5% slack
    base, fast = (lambda x: x + 1), (lambda x: x + 1)
    mib = 1 << 20
    peaks = {"fast": 104 * mib}
    monkeypatch.setattr(sched_timing, "peak_bytes", lambda f, args: peaks["fast"] if f is fast else 100 * mib)
    _fake_seconds(monkeypatch, lambda f: 1.0 if f is fast else 2.0)
    specs = [jax.ShapeDtypeStruct((4,), np.float32)]
    assert sched_timing.pick_fastest(base, {"xla-concurrent": fast}, specs, "f") is None
    picked = sched_timing.pick_fastest(base, {"xla-concurrent": fast}, specs, "f", memory_slack=0.05)
    assert picked is not None and picked[0] == "xla-concurrent" and picked[1] == pytest.approx(2.0)
    # a few KiB over (XLA's command-buffer bookkeeping) is within the fixed allowance; the notes say why
    notes: list[str] = []
    peaks["fast"] = 100 * mib + 7408
    picked = sched_timing.pick_fastest(base, {"xla-concurrent": fast}, specs, "f", notes=notes)
    want = ["xla-concurrent 2.00x", "xla-concurrent again 2.00x", "peak memory +0.0%"]
    assert picked is not None and notes == want  # the pick's peak too (7,408 bytes over)
    peaks["fast"] = 100 * mib + sched_timing.PEAK_ALLOWANCE_BYTES + 1
    notes.clear()
    assert sched_timing.pick_fastest(base, {"xla-concurrent": fast}, specs, "f", notes=notes) is None
    assert notes == ["xla-concurrent +1.0% peak memory"]


def test_schedule_memory_slack_is_validated():
    want = r"schedule_memory_slack must be a number in \[0, 1\]; got 2"
    with pytest.raises(InvalidOptionError, match=want):
        jaxrw.optimize(lambda x: x, schedule_memory_slack=2)
    assert jaxrw.optimize(lambda x: x, schedule_memory_slack=0.1).schedule_memory_slack == 0.1


# -- schedule="auto" and optimize()'s fast path ------------------------------------------------------


def _auto_on_cuda(monkeypatch, choice):
    """Pretend to be on CUDA with auto choosing `choice`; count the selections and scheduled calls."""
    import jaxrw.schedule

    calls = {"select": 0, "scheduled": 0, "tracer_select": 0, "margins": []}

    def select(fn, flat_specs, donate=(), profile=None, **kw):
        calls["select"] += 1
        calls["margins"].append(kw.get("margin"))
        plain = jax.jit(fn)
        if choice == "xla":
            return sched_thunky.Selection("xla", plain, "test")

        def scheduled(*xs):
            calls["scheduled"] += 1
            return plain(*xs)

        return sched_thunky.Selection(choice, scheduled, "test")

    monkeypatch.setattr(jaxrw.schedule, "cuda_available", lambda: True)
    monkeypatch.setattr(sched_thunky, "select", select)
    return calls


def _two_step(x, w):
    return (x @ w) @ w + (x @ w)


def _called_three_times(opt):
    x, w = jnp.ones((4, 8)), jnp.full((8, 8), 0.1)
    want = jax.jit(_two_step)(x, w)
    for _ in range(3):
        np.testing.assert_allclose(opt(x, w), want, rtol=1e-6)


def test_auto_keeping_xla_uses_the_fast_path(monkeypatch):
    # auto times candidates when a signature is built, which cannot happen inside jax.jit's trace
    # of the fast path: the first call builds outside it; when auto keeps XLA's schedule, later
    # calls take the C++ dispatch again (on jax >= 0.12 with CUDA this path used to be off): here
    # the guard keeps _two_step, so they go to a jax.jit of it with no Python (state "jit")
    calls = _auto_on_cuda(monkeypatch, "xla")
    opt = jaxrw.optimize(_two_step)
    _called_three_times(opt)
    assert calls["select"] == 1 and opt.traces == 1
    assert opt._fast_state == "jit"
    # kept as written: a schedule must beat jax.jit(fn)'s own executable by the larger margin
    assert calls["margins"] == [sched_timing.KEPT_MARGIN]


def test_auto_judges_a_rewritten_program_by_the_ordinary_margin(monkeypatch):
    calls = _auto_on_cuda(monkeypatch, "xla")
    opt = jaxrw.optimize(lambda a, b, v: (a @ b) @ v)
    a, v = jnp.full((256, 256), 0.01), jnp.ones((256, 2))
    np.testing.assert_allclose(opt(a, a, v), (a @ a) @ v, rtol=1e-5)
    assert opt.report(a, a, v).rewritten
    assert calls["margins"] == [sched_timing.MEASURED_MARGIN]


def test_a_candidate_inside_the_kept_margin_is_not_taken(monkeypatch):
    # 7% faster: past the ordinary 5% margin, within the 10% that a kept program's candidates need
    # (separate compilations of one program differed by up to 7% on the H200)
    base, fast = (lambda x: x + 1), (lambda x: x + 1)
    monkeypatch.setattr(sched_timing, "peak_bytes", lambda f, args: 100)
    _fake_seconds(monkeypatch, lambda f: 1.0 if f is fast else 1.07)
    specs = [jax.ShapeDtypeStruct((4,), np.float32)]
    picked = sched_timing.pick_fastest(base, {"xla-graphs": fast}, specs, "f")
    assert picked is not None and picked[0] == "xla-graphs"
    kept = sched_timing.pick_fastest(base, {"xla-graphs": fast}, specs, "f", margin=sched_timing.KEPT_MARGIN)
    assert kept is None


def test_auto_choosing_a_schedule_runs_it(monkeypatch):
    calls = _auto_on_cuda(monkeypatch, "thunky")
    opt = jaxrw.optimize(_two_step)
    _called_three_times(opt)
    assert calls["select"] == 1 and calls["scheduled"] == 3
    assert opt._fast_state == "off"
    assert opt.report(jnp.ones((4, 8)), jnp.full((8, 8), 0.1)).schedule == "thunky: test"


def test_auto_choosing_an_xla_mode_keeps_jax_dispatch(monkeypatch):
    # an XLA command-buffer mode is compiler options on a plain jit: the fast path's jit is compiled
    # with them (C++ dispatch, no Python per call); the first call ran the selected program itself
    calls = _auto_on_cuda(monkeypatch, "xla-graphs")
    opt = jaxrw.optimize(_two_step)
    _called_three_times(opt)
    assert calls["select"] == 1 and calls["scheduled"] == 1
    assert opt._fast_state == "on" and opt._fast_mode == "xla-graphs"
    # the jit with the options itself (no TopLevel frame per call); its plain twin for nested traces
    assert not isinstance(opt._fast, TopLevel) and opt._fast_nested is not None
    x, w = jnp.ones((4, 8)), jnp.full((8, 8), 0.1)
    tuned, plain = (f.lower(x, w).as_text() for f in (opt._fast, opt._fast_nested))
    assert tuned == plain  # the same program; only how XLA launches it differs
    # the options cannot be nested in another jit: under jit/grad the plain twin is traced in
    np.testing.assert_allclose(jax.jit(opt)(x, w), jax.jit(_two_step)(x, w), rtol=1e-6)
    g = jax.grad(lambda x, w: opt(x, w).sum())(x, w)
    np.testing.assert_allclose(g, jax.grad(lambda x, w: _two_step(x, w).sum())(x, w), rtol=1e-5)
    # a second signature measured best under XLA's default schedule leaves the fast path's options
    # to the first: it runs its own program on the Python path
    calls_xla = _auto_on_cuda(monkeypatch, "xla")
    x2 = jnp.ones((2, 8))
    np.testing.assert_allclose(opt(x2, w), jax.jit(_two_step)(x2, w), rtol=1e-6)
    assert calls_xla["select"] == 1 and opt._fast_state == "off"
    np.testing.assert_allclose(opt(x, w), jax.jit(_two_step)(x, w), rtol=1e-6)
    opt.clear_cache()
    assert opt._fast_mode == "xla" and not isinstance(opt._fast, TopLevel) and opt._fast_nested is None


def test_auto_under_an_outer_jit_does_not_time(monkeypatch):
    # a signature first seen with tracers gets XLA's schedule: nothing concrete to time
    calls = _auto_on_cuda(monkeypatch, "xla-concurrent")
    x, w = jnp.ones((4, 8)), jnp.full((8, 8), 0.1)
    opt = jaxrw.optimize(_two_step)
    np.testing.assert_allclose(jax.jit(opt)(x, w), jax.jit(_two_step)(x, w), rtol=1e-6)
    assert calls["select"] == 0


def test_a_scheduled_signature_called_under_an_outer_jit_is_traced_in(monkeypatch):
    # auto picked XLA's concurrent mode for direct calls (a jit with compiler options, which cannot
    # be nested in another jit); the same signature under an outer jit or grad runs the plain program
    calls = _auto_on_cuda(monkeypatch, "xla-concurrent")

    def nestable_only_at_top(*xs):
        raise ValueError("`compiler_options` can only be passed to top-level jax.jit")

    opt = jaxrw.optimize(_two_step)
    _called_three_times(opt)
    (entry,) = opt._cache.values()
    entry.call = nestable_only_at_top  # what the real concurrent-mode jit does under a trace
    x, w = jnp.ones((4, 8)), jnp.full((8, 8), 0.1)
    np.testing.assert_allclose(jax.jit(opt)(x, w), jax.jit(_two_step)(x, w), rtol=1e-6)
    g = jax.grad(lambda x, w: opt(x, w).sum())(x, w)
    np.testing.assert_allclose(g, jax.grad(lambda x, w: _two_step(x, w).sum())(x, w), rtol=1e-5)
    assert calls["select"] == 1


def test_auto_charges_candidates_the_call_path_they_need(monkeypatch):
    # a candidate 10% faster on the device loses once its calls pay the Python path's host time
    base, fast = (lambda x: x + 1), (lambda x: x + 1)
    monkeypatch.setattr(sched_timing, "peak_bytes", lambda f, args: 100)
    _fake_seconds(monkeypatch, lambda f: 0.9e-5 if f is fast else 1.0e-5)
    specs = [jax.ShapeDtypeStruct((4,), np.float32)]
    trial = {"xla-concurrent": fast}
    picked = sched_timing.pick_fastest(base, trial, specs, "f", overhead={"xla-concurrent": lambda: 0.0})
    assert picked is not None and picked[0] == "xla-concurrent"
    assert (
        sched_timing.pick_fastest(base, trial, specs, "f", overhead={"xla-concurrent": lambda: 2e-6}) is None
    )
    assert sched_timing.pick_fastest(base, trial, specs, "f", overhead={"thunky": lambda: 2e-6}) is not None


@pytest.mark.parametrize("name", ["python_path_overhead_s", "fast_path_frame_s"])
def test_the_call_path_overheads_are_measured_once(name):
    import jaxrw.schedule

    measure = getattr(jaxrw.schedule, name)
    first = measure()
    assert first >= 0.0 and measure() == first  # cached for the process


def test_auto_times_candidates_on_the_calls_own_arrays(monkeypatch):
    # drawing random inputs compiled one program per parameter shape (1-2 s for a model); with the
    # call's arrays nothing is drawn, and non-jax leaves are put on the device once
    def no_random(specs, seed=0):
        raise AssertionError("random inputs drawn")

    monkeypatch.setattr(sched_timing, "random_inputs", no_random)
    timed_on = []
    real_measure = sched_timing.measure

    def measure(variants, **kw):
        timed_on.extend(a for _f, a in variants.values())
        return real_measure(variants, **kw)

    monkeypatch.setattr(sched_timing, "measure", measure)
    x, s = jnp.arange(4.0), np.float32(2.0)
    args = sched_timing.device_inputs([x, s])
    assert args[0] is x and isinstance(args[1], jax.Array) and float(args[1]) == 2.0
    specs = [jax.ShapeDtypeStruct((4,), np.float32), jax.ShapeDtypeStruct((), np.float32)]
    trial = {"xla-graphs": jax.jit(lambda x, s: x * s)}
    sched_timing.pick_fastest(jax.jit(lambda x, s: x * s), trial, specs, "f", inputs=args)
    # base and the candidate; base and a pick once more if one was made (noise here)
    assert len(timed_on) in (2, 4) and all(a[0] is x and a[1] is args[1] for a in timed_on)

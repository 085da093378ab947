"""Plans of small benchmark-like programs: valid, executable in simulation, and priced sensibly."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite.profiles import H200
from jaxrw.schedule import check, plan_program, simulate
from jaxrw.schedule.plan import StreamCosts

from .programs import PROGRAMS, experts_packed, flat


def _plan(make, k, seed=0):
    fn, args, donate = make(np.random.default_rng(seed))
    closed = jax.make_jaxpr(flat(fn))(*args)
    return plan_program(closed, H200, streams=k, donate=donate), fn, args


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("make", PROGRAMS, ids=lambda m: m.__name__)
def test_plan_is_valid_and_simulates_to_the_program(make, k):
    plan, fn, args = _plan(make, k)
    rep = check(plan)
    assert rep.peak_bytes == plan.peak_bytes
    want = [np.asarray(jnp.asarray(w)) for w in jax.tree_util.tree_leaves(fn(*args))]
    for seed in range(2):
        got = simulate(plan, args, seed=seed, jit=seed == 1)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("make", PROGRAMS, ids=lambda m: m.__name__)
def test_plan_repr_and_dict(make):
    plan, _, _ = _plan(make, 2)
    text = repr(plan)
    assert text.startswith("Plan: ") and "predicted XLA" in text and "peak" in text
    assert re.search(r"region\s+stage\s+stream", text) and "steps:" in text
    assert re.search(r"storage\s+kind", text) and re.search(r"buffer\s+kind\s+storage\s+offset", text)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["streams"] == plan.streams and len(d["regions"]) == len(plan.regions)


def test_regions_are_few_stage_times_lanes():
    for make in PROGRAMS:
        for k in (1, 2, 4):
            plan, _, _ = _plan(make, k)
            assert plan.streams <= k
            assert len(plan.regions) <= plan.stages * k
            if k == 1:
                assert len(plan.regions) <= 1 and plan.stages <= 1


def test_packed_experts_use_views_and_write_the_stack_in_place():
    plan, _, _ = _plan(experts_packed, 4)
    kinds = [b.kind for b in plan.buffers.values()]
    assert kinds.count("view") >= 12  # x[i], w1[i], w2[i] for four experts
    parts = [b for b in plan.buffers.values() if b.kind == "part"]
    assert len(parts) == 4 and {b.slot.storage for b in parts} == {"out:0"}
    assert sorted(b.slot.offset for b in parts) == [0, 128, 256, 384]
    assert plan.streams > 1  # four independent experts spread over lanes


def test_donated_input_hosts_an_output():
    from .programs import donated

    plan, _, _ = _plan(donated, 1)
    hosted = {b.slot.storage for b in plan.buffers.values() if b.kind == "donated"}
    assert hosted  # x (read by the same region that writes x + y) or v
    assert not any(s.startswith("out:") for s in hosted)
    assert all(plan.storages[s].kind == "input" for s in hosted)


def test_no_donation_without_donate_argnums():
    from .programs import donated

    fn, args, _ = donated(np.random.default_rng(0))
    plan = plan_program(jax.make_jaxpr(flat(fn))(*args), H200, streams=1)
    assert not any(b.kind == "donated" for b in plan.buffers.values())


def test_scratch_is_reused_across_stages():
    # two sequential fork-join rounds of equal size: the second round reuses the first one's bytes
    def f(x, w):
        y = sum(jax.numpy.tanh(x @ w[i]) for i in range(4))
        return [sum(jax.numpy.sin(y @ w[i]) for i in range(4))]

    args = (np.ones((64, 64), np.float32), np.ones((4, 64, 64), np.float32) * 0.01)
    plan = plan_program(jax.make_jaxpr(f)(*args), H200, streams=4, costs=StreamCosts(light_s=0.0, sync_s=0.0))
    rep = check(plan)
    scratch = [b for b in plan.buffers.values() if b.kind == "scratch"]
    arena = sum(s.nbytes for s in plan.storages.values() if s.kind == "arena")
    assert sum(int(np.prod(b.slot.shape)) * 4 for b in scratch) > arena  # some bytes serve two values
    assert rep.arena_live_bytes <= arena


def test_chooser_prefers_one_stream_for_tiny_kernels():
    # DESIGN.md: small experts lose under thunky; more streams do not help them
    plan, _, _ = _plan(experts_packed, None)
    assert plan.streams == 1
    assert plan.thunky_s > plan.xla_s  # so `auto` keeps XLA's schedule


# GEMMs that keep 30% of the machine busy (a profile fixed here so the test is about the planner)
THIN_GEMMS = dataclasses.replace(H200, gemm_efficiency={0: 0.05, 8: 0.3, 12: 0.95})


def test_independent_underfilling_gemms_predict_a_gain_on_streams():
    e, m, d = 4, 256, 8192
    specs = [jax.ShapeDtypeStruct((e, m, d), "bfloat16"), jax.ShapeDtypeStruct((e, d, d), "bfloat16")]

    def f(x, w):
        return [jax.numpy.stack([jax.numpy.tanh(x[i] @ w[i]) for i in range(e)])]

    plan = plan_program(jax.make_jaxpr(f)(*specs), THIN_GEMMS)
    assert plan.streams > 1 and plan.predicted_speedup > 1.5
    full = plan_program(jax.make_jaxpr(f)(*specs), dataclasses.replace(THIN_GEMMS, gemm_efficiency={}))
    assert full.streams == 1  # GEMMs that fill the GPU gain nothing from a second stream


def test_unschedulable_programs_raise_schedule_error():
    from jaxrw.schedule import ScheduleError

    def f(x):
        jax.debug.print("{}", x)
        return [x * 2]

    with pytest.raises(ScheduleError):
        plan_program(jax.make_jaxpr(f)(np.ones(3, np.float32)), H200)

    # a typed PRNG key (any jax.random call wraps its raw key) raised TypeError, which the callers
    # that keep XLA's schedule on ScheduleError let through
    def g(k, w):
        return [jax.random.normal(k, (4, 4)) @ w]

    with pytest.raises(ScheduleError, match="key<fry>"):
        plan_program(jax.make_jaxpr(g)(np.zeros(2, np.uint32), np.ones((4, 4), np.float32)), H200)


@pytest.mark.parametrize("dtype", ["int2", "uint2", "int4", "float4_e2m1fn"])
def test_sub_byte_values_are_refused(dtype):
    # numpy sizes them a byte per element; XLA packs them (int2 was let through)
    from jaxrw.schedule import ScheduleError

    x = np.zeros(8, np.float32)
    closed = jax.make_jaxpr(lambda x: [x.astype(dtype).astype(np.float32) * 2])(x)
    with pytest.raises(ScheduleError, match=dtype):
        plan_program(closed, H200)


@pytest.mark.parametrize("streams", [-1, 0, 2.0, True])
def test_a_bad_stream_count_is_named(streams):
    from jaxrw.errors import InvalidOptionError

    closed = jax.make_jaxpr(lambda x: [x * 2])(np.ones(3, np.float32))
    with pytest.raises(InvalidOptionError, match=f"streams={streams!r}"):
        plan_program(closed, H200, streams=streams)


def test_program_inlines_calls_and_custom_jvp():
    from jaxrw.schedule import build_program

    def f(x):
        return [jax.jit(jax.nn.relu)(x) + jax.nn.gelu(x)]

    prog = build_program(jax.make_jaxpr(f)(np.ones(3, np.float32)), H200)
    assert not any(op.name in ("jit", "pjit", "custom_jvp_call") for op in prog.ops)
    x = np.linspace(-2, 2, 3).astype(np.float32)
    np.testing.assert_allclose(prog.evaluate([x])[0], f(x)[0], rtol=1e-6)


def test_dead_code_gets_no_region():
    def f(x, w):
        jax.numpy.sin(x @ w)  # unused: no region computes it
        return [jax.numpy.tanh(x) * 2]

    args = (np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))
    plan = plan_program(jax.make_jaxpr(f)(*args), H200, streams=4)
    assert [op.name for op in plan.program.ops] == ["tanh", "mul"] and len(plan.regions) == 1


def _scheduler_cases():
    """bench/schedule_h200.py's cases (name, fn, specs), loaded from the script without running it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "schedule_h200.py"
    spec = importlib.util.spec_from_file_location("schedule_h200", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(name, fn, specs) for name, _desc, fn, specs in module.cases(False)]


def _recorded(run: str) -> dict[str, dict[str, float]]:
    """Median seconds per variant per case of a recorded bench/schedule_h200.py run."""
    from pathlib import Path

    recorded = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / run).read_text())
    return {
        r["case"]: {k: v["median_us"] * 1e-6 for k, v in r["variants"].items() if "median_us" in v}
        for r in recorded["cases"]
    }


def test_predictions_match_the_recorded_h200_run():
    # XLA's time and the thunky program's on one and on four streams, for each scheduler case, as
    # the H200 stream costs predict them, against H200 run f8 (the run they were fitted to, with
    # thunky programs called through their executables: schedule/direct.py)
    measured = _recorded("h200-2026-12-04f8-schedule.json")
    errors = []
    for name, fn, specs in _scheduler_cases():
        closed = jax.make_jaxpr(fn)(*specs)
        one, four = plan_program(closed, H200, streams=1), plan_program(closed, H200, streams=4)
        m = measured[name]
        for predicted, key in ((one.xla_s, "xla"), (one.thunky_s, "1 stream"), (four.thunky_s, "4 streams")):
            errors.append(abs(np.log(predicted / m[key])))
    assert len(errors) == 33 and np.mean(errors) < 0.3, np.round(errors, 2)


def test_recorded_runs_before_direct_calls_paid_the_python_dispatch():
    # the same one-stream programs measured through jax.jit (run q) and through their executables
    # (run f8): 192-argument programs were host-bound on jax's Python dispatch, ~12 µs per argument
    before, after = _recorded("h200-2026-12-03q-schedule.json"), _recorded("h200-2026-12-04f8-schedule.json")
    assert before["experts_varied_64"]["1 stream"] > 2.5 * after["experts_varied_64"]["1 stream"]
    assert before["experts_varied_8"]["1 stream"] > 3 * after["experts_varied_8"]["1 stream"]

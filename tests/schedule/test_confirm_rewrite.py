"""schedule="auto" times a rewrite predicted to gain little against the program as written
(choice.confirm_rewrite) and keeps the program as written unless the rewrite measured faster.

No GPU here: CUDA is stood in, and the timing itself (timing.pick_fastest) is stood in where a test
is about the decision; one test times both programs for real on this CPU."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
import jaxrw.schedule
from jaxrw.schedule import choice, timing
from jaxrw.schedule import thunky as sched_thunky


def _factorable(x, a, b):
    return x @ a + x @ b  # factored to x @ (a + b): one GEMM fewer


def _args():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((256, 256)).astype(np.float32))
    a, b = (jnp.asarray(rng.standard_normal((256, 256)).astype(np.float32) / 16) for _ in range(2))
    return x, a, b


def _pretend_cuda_without_thunky(monkeypatch):
    for module in (sched_thunky, jaxrw.schedule):
        monkeypatch.setattr(module, "cuda_available", lambda: True)
    monkeypatch.setattr(sched_thunky, "thunky_available", lambda: False)


@pytest.fixture
def gpu_auto(monkeypatch):
    """CUDA stood in, thunky absent, XLA's modes never picked, every rewrite confirmed: the list
    of calls of the stood-in confirmation timing is returned; set `.result` on it to answer."""
    _pretend_cuda_without_thunky(monkeypatch)
    monkeypatch.setattr(sched_thunky, "pick_fastest", lambda *a, **k: None)
    monkeypatch.setattr(choice, "CONFIRM_BELOW", math.inf)
    calls = _Calls()

    def pick(base, trial, specs, name, **kw):
        calls.append({"trial": sorted(trial), **kw})
        if isinstance(calls.result, Exception):
            raise calls.result
        return calls.result

    monkeypatch.setattr(choice, "pick_fastest", pick)
    return calls


class _Calls(list):
    result: object = None


def test_a_rewrite_measured_no_faster_is_replaced_by_the_program_as_written(gpu_auto):
    gpu_auto.result = None  # the rewrite did not measure REWRITE_MARGIN faster
    x, a, b = _args()
    opt = jaxrw.optimize(_factorable)
    out = opt(x, a, b)
    rep = opt.report(x, a, b)
    assert len(gpu_auto) == 1
    assert gpu_auto[0]["trial"] == ["rewrite"] and gpu_auto[0]["margin"] == choice.REWRITE_MARGIN
    # the program as written runs with no Python of jaxrw's: the rewrite pays the fast path's frame
    assert gpu_auto[0]["overhead"] == {"rewrite": timing.fast_path_frame_s}
    assert gpu_auto[0]["memory_slack"] is None  # peak memory is the schedule's condition, not the guard's
    assert not rep.rewritten and rep.cost_after == rep.cost_before
    assert "measured no gain of 2% over the program as written" in rep.guard_note
    assert rep.guard_note.startswith("predicted ")
    np.testing.assert_allclose(out, jax.jit(_factorable)(x, a, b), rtol=1e-6)
    opt(x, a, b)
    assert opt._fast_state == "jit"  # kept as written: jax's own dispatch from here on


def test_a_rewrite_measured_faster_is_kept(gpu_auto):
    gpu_auto.result = ("rewrite", 1.2)
    x, a, b = _args()
    opt = jaxrw.optimize(_factorable)
    out = opt(x, a, b)
    rep = opt.report(x, a, b)
    assert len(gpu_auto) == 1 and rep.rewritten and rep.cost_after < rep.cost_before
    np.testing.assert_allclose(out, _factorable(x, a, b), rtol=1e-4, atol=1e-5)


def test_a_failed_timing_leaves_the_rewrite_to_the_guards_prediction(gpu_auto, caplog):
    gpu_auto.result = RuntimeError("no device memory")
    x, a, b = _args()
    opt = jaxrw.optimize(_factorable)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user's program is not disturbed: a log line only
        out = opt(x, a, b)
    assert opt.report(x, a, b).rewritten
    assert "could not time the rewrite" in caplog.text and "no device memory" in caplog.text
    np.testing.assert_allclose(out, _factorable(x, a, b), rtol=1e-4, atol=1e-5)


def test_large_predicted_gains_explicit_schedules_and_autotune_are_not_timed(gpu_auto, monkeypatch):
    x, a, b = _args()
    jaxrw.optimize(_factorable, schedule="xla")(x, a, b)
    jaxrw.optimize(_factorable, autotune=True, autotune_k=1)(x, a, b)
    assert gpu_auto == []
    monkeypatch.setattr(choice, "CONFIRM_BELOW", 1.0)  # every prediction is at least 1.0x
    opt = jaxrw.optimize(_factorable)
    opt(x, a, b)
    assert gpu_auto == [] and opt.report(x, a, b).rewritten


def test_without_cuda_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(choice, "CONFIRM_BELOW", math.inf)
    monkeypatch.setattr(choice, "pick_fastest", lambda *a, **k: pytest.fail("timed without CUDA"))
    x, a, b = _args()
    opt = jaxrw.optimize(_factorable)
    opt(x, a, b)
    assert opt.report(x, a, b).rewritten


def test_the_real_timing_keeps_a_report_that_agrees_with_the_program_run(monkeypatch):
    # both programs compiled and timed on this CPU: whichever is kept, the report says which
    _pretend_cuda_without_thunky(monkeypatch)
    monkeypatch.setattr(sched_thunky, "pick_fastest", lambda *a, **k: None)
    monkeypatch.setattr(choice, "CONFIRM_BELOW", math.inf)
    x, a, b = _args()
    opt = jaxrw.optimize(_factorable)
    out = opt(x, a, b)
    rep = opt.report(x, a, b)
    np.testing.assert_allclose(out, _factorable(x, a, b), rtol=1e-4, atol=1e-5)
    if rep.rewritten:
        assert rep.cost_after < rep.cost_before
    else:
        assert "over the program as written" in rep.guard_note
        opt(x, a, b)
        assert opt._fast_state == "jit"

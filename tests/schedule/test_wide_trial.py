"""auto's second thunky trial: the plan on twice the planner's streams, timed beside it where it
too is predicted at parity (thunky.WIDE_STREAMS), and skipped where it would not pay its compile."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxrw.rewrite.profiles import H200
from jaxrw.schedule import Scheduled
from jaxrw.schedule import thunky as sched_thunky
from jaxrw.schedule.plan import plan_program

from .programs import cell, experts_varied, pretend_cuda, specs_of

# matrix products slow enough that the planner puts cell on two streams and predicts four at
# parity or better; experts_varied on two, with four predicted slower
MID = dataclasses.replace(H200, matmul_flops={"float32": 1e10}, gemm_efficiency={0: 0.2})
# slower still: the planner already uses four streams for cell
SLOW = dataclasses.replace(H200, matmul_flops={"float32": 1e9}, gemm_efficiency={0: 0.2})


def _select(monkeypatch, case, profile, answer="xla", donate=()):
    """select() on a pretend CUDA device, pick_fastest answering `answer`; (selection, trial)."""
    pretend_cuda(monkeypatch)
    seen: dict = {}

    def pick(base, trial, specs, name, **kw):
        seen.update(trial)
        seen["predicted_peak"] = kw.get("predicted_peak")
        return None if answer == "xla" else (answer, 1.4)

    monkeypatch.setattr(sched_thunky, "pick_fastest", pick)
    fn, args, _ = case(np.random.default_rng(0))
    sel = sched_thunky.select(fn, specs_of(args), donate, profile, concurrent_xla=False)
    peaks = seen.pop("predicted_peak", None)
    assert peaks is None or set(peaks) == set(seen)  # each thunky trial with its plan's peak
    return sel, seen


def test_a_two_stream_plan_is_timed_beside_its_four_stream_twin(monkeypatch):
    sel, trial = _select(monkeypatch, cell, MID)
    assert set(trial) == {"thunky", "thunky-wide"}
    assert sel.choice == "xla"


def test_each_thunky_trial_comes_with_its_plans_predicted_peak(monkeypatch):
    pretend_cuda(monkeypatch)
    given: dict = {}
    monkeypatch.setattr(sched_thunky, "pick_fastest", lambda *a, **kw: given.update(kw))
    fn, args, _ = cell(np.random.default_rng(0))
    sched_thunky.select(fn, specs_of(args), (), MID, concurrent_xla=False)
    plan = plan_program(jax.make_jaxpr(fn)(*specs_of(args)), MID)
    peaks = given["predicted_peak"]
    assert set(peaks) == {"thunky", "thunky-wide"} and peaks["thunky"] == plan.peak_bytes > 0


@pytest.mark.parametrize("donate", [(), (0,)])
def test_a_wide_pick_is_kept_as_a_thunky_program_that_says_so(monkeypatch, donate):
    sel, trial = _select(monkeypatch, cell, MID, answer="thunky-wide", donate=donate)
    assert sel.choice == "thunky" and isinstance(sel.fn, Scheduled)
    assert sel.fn.plan.streams == 4 and "on 4 streams (the planner's 2)" in sel.reason
    assert (sel.fn.fast is trial["thunky-wide"]) == (not donate)  # the program timed, unless donated
    assert sel.fn.fast.otherwise is sel.fn.fallback
    narrow, _ = _select(monkeypatch, cell, MID, answer="thunky", donate=donate)
    assert narrow.fn.plan.streams == 2 and "streams" not in narrow.reason


def test_no_wide_trial_where_more_streams_are_predicted_slower(monkeypatch):
    _, trial = _select(monkeypatch, experts_varied, MID)
    assert set(trial) == {"thunky"}


def test_no_wide_trial_where_the_planner_already_uses_four_streams(monkeypatch):
    _, trial = _select(monkeypatch, cell, SLOW)
    assert set(trial) == {"thunky"}


def test_no_wide_trial_for_regions_with_many_constants_in_their_code(monkeypatch):
    # each thunky trial compiles the regions with their constants: experts_equal's 128 MiB took
    # 18-20 s on the H200; here any embedded constant is too many
    monkeypatch.setattr(sched_thunky, "WIDE_TRIAL_CONSTANT_BYTES", -1)
    _, trial = _select(monkeypatch, cell, MID)
    assert set(trial) == {"thunky"}

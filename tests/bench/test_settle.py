"""Settling "at least 0.98x": the confidence interval of a median, the verdict it gives, and the
runner sampling on while a speedup's interval straddles the line."""

from __future__ import annotations

import itertools
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrw.bench import runner
from jaxrw.bench.report import AT_LEAST, case_notes, speedup_interval, verdict
from jaxrw.bench.summarize import settled_line
from jaxrw.rewrite import measure
from jaxrw.rewrite.measure import Timing, median_interval


def test_median_interval_takes_the_binomial_order_statistics():
    xs = list(range(1, 12))  # n = 11: P(B <= 1) = 12/2048 < 0.025 < P(B <= 2): x(2) and x(10)
    assert median_interval(xs[::-1]) == (2, 10)
    assert median_interval(list(range(1, 7))) == (1, 6)  # n = 6: only the extremes reach 95%
    assert median_interval([1.0] * 5) is None  # too few values for 95% (P(B = 0) = 1/32 > 0.025)
    assert median_interval([]) is None
    assert median_interval(range(1, 12), level=0.5) == (4, 8)  # narrower for a lower level


@given(st.lists(st.floats(0.1, 10.0), min_size=6, max_size=200))
def test_median_interval_holds_the_sample_median(xs):
    lo, hi = median_interval(xs)
    assert min(xs) <= lo <= statistics.median(xs) <= hi <= max(xs)


def test_median_interval_covers_the_true_median_as_promised():
    # 2,000 samples of 11 from a skewed distribution whose median is 1: the interval misses it in
    # at most ~1.2% of them (its exact level is 98.8%); a seeded generator keeps the test exact
    import numpy as np

    rng = np.random.default_rng(0)
    draws = rng.lognormal(0.0, 0.3, size=(2000, 11))
    misses = sum(not (lo <= 1.0 <= hi) for lo, hi in map(median_interval, draws.tolist()))
    assert misses / 2000 < 0.025


def test_verdict_needs_the_whole_interval_on_one_side():
    assert verdict((0.99, 1.2)) == "at least"
    assert verdict((AT_LEAST, 1.0)) == "at least"
    assert verdict((0.90, 0.97)) == "below"
    assert verdict((0.97, 1.01)) == "unresolved"
    assert verdict(None) == "unresolved"


def _record(jit: list[float], rw: list[float]) -> dict:
    return {
        "suite": "s",
        "case": "c",
        "status": "ok",
        "speedup": statistics.median(jit) / statistics.median(rw),
        "notes": [],
        "variants": {"jax.jit": {"samples_s": jit}, "jaxrw": {"samples_s": rw}},
    }


def test_unsettled_cases_are_named_with_their_interval():
    same = _record([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0], [1.0, 0.9, 1.1, 1.02, 1.0, 1.0, 0.97])
    fast = _record([2.0] * 11, [1.0, 1.01, 0.99] * 3 + [1.0, 1.0])
    assert verdict(speedup_interval(fast)) == "at least"
    assert "unresolved 0.98x: by round" in case_notes(same) and "7 rounds" in case_notes(same)
    assert "0.98x" not in case_notes(fast)
    # a kept case names its control over the same rounds: two compilations of one program
    same["variants"]["jax.jit#2"] = {"samples_s": [1.0, 1.0, 1.0, 1.1, 1.0, 1.0, 1.0]}
    same["second_jit"] = 1.0
    assert "a second jax.jit: 1.00x (1.00x by round in [0.90, 1.10])" in case_notes(same)
    line = settled_line([same, fast])
    assert "1 of 2" in line and "unresolved: s/c [" in line and "below: none" in line


def _fake_variants(monkeypatch, per_call: dict) -> tuple[dict, dict]:
    """Variants whose samples come from the given cycles (time_calls replaced): the settling logic
    alone, without timing noise."""
    by_fn = {}
    variants = {}
    for name, values in per_call.items():
        fn = lambda *a, _n=name: _n  # noqa: E731
        by_fn[fn] = values
        variants[name] = (fn, ())
    monkeypatch.setattr(measure, "time_calls", lambda fn, args, calls: next(by_fn[fn]))
    monkeypatch.setattr(measure, "block", lambda x: x)
    timings = {name: Timing(calls=1) for name in variants}
    measure.more_rounds(variants, timings, 11)
    return variants, timings


def test_settle_samples_on_until_the_interval_clears_the_line(monkeypatch):
    # as fast as jax.jit with noise: 11 rounds cannot tell 0.98x apart; more rounds narrow it
    noise = [1.0, 1.06, 0.95, 1.03, 0.97, 1.0, 1.04, 0.96, 1.01, 0.99, 1.02, 0.98, 1.0]
    variants, timings = _fake_variants(
        monkeypatch,
        {
            "jax.jit": itertools.cycle([1.0]),
            "jaxrw": itertools.cycle(noise),
            "jax.jit#2": itertools.cycle([1.0]),
        },
    )
    rec: dict = {"notes": []}
    opts = runner.Options(size="large", repeats=11, max_rounds=400, settle_s=60)
    runner.settle(variants, timings, opts, rec)
    n = len(timings["jaxrw"].samples)
    assert 11 < n < 400 and (n - 11) % 4 == 0  # four rounds at a time
    assert len(timings["jax.jit"].samples) == n == len(timings["jax.jit#2"].samples)  # the control too
    ratios = measure.round_ratios(timings["jax.jit"].samples, timings["jaxrw"].samples)
    assert verdict(median_interval(ratios)) == "at least"
    assert rec["notes"] == [f"{n - 11} more rounds to settle the {AT_LEAST}x interval"]


def test_settle_stops_at_the_round_limit_and_leaves_settled_pairs_alone(monkeypatch):
    variants, timings = _fake_variants(
        monkeypatch,
        {
            "jax.jit": itertools.cycle([1.0]),
            "jaxrw": itertools.cycle([0.95, 1.05, 1.0]),  # straddles the line for good: ratio ~ 1
            "jax.jit:new-args": itertools.cycle([2.0]),
            "jaxrw:new-args": itertools.cycle([1.0]),  # 2x: settled by the first 11 rounds
        },
    )
    rec: dict = {"notes": []}
    runner.settle(variants, timings, runner.Options(size="large", repeats=11, max_rounds=30), rec)
    assert len(timings["jaxrw"].samples) == 30 == len(timings["jax.jit"].samples)  # 11 + 4 + 4 + 4 + 4 + 3
    assert len(timings["jaxrw:new-args"].samples) == 11
    assert rec["notes"] == [f"19 more rounds to settle the {AT_LEAST}x interval"]


def test_settle_takes_no_rounds_at_the_small_size_by_default(monkeypatch):
    variants, timings = _fake_variants(
        monkeypatch, {"jax.jit": itertools.cycle([1.0]), "jaxrw": itertools.cycle([0.98, 1.02])}
    )
    rec: dict = {"notes": []}
    runner.settle(variants, timings, runner.Options(size="small", repeats=11), rec)
    assert len(timings["jaxrw"].samples) == 11 and rec["notes"] == []
    assert runner.Options(size="large", repeats=5).round_limit() == 30
    assert runner.Options(size="large", repeats=5, max_rounds=2).round_limit() == 5  # never below repeats
    # the small size: the 6 rounds a 95% interval needs (with 5, make bench read "unresolved" for all)
    assert runner.Options(size="small", repeats=5).round_limit() == runner.MIN_INTERVAL_ROUNDS == 6
    assert runner.Options(size="small", repeats=11).round_limit() == 11


@pytest.mark.parametrize("rounds", [0, 3])
def test_more_rounds_rotates_the_first_variant(monkeypatch, rounds):
    variants, timings = _fake_variants(
        monkeypatch, {"a": itertools.cycle([1.0]), "b": itertools.cycle([2.0])}
    )
    order: list[str] = []
    monkeypatch.setattr(measure, "time_calls", lambda fn, args, calls: order.append(fn()) or 1.0)
    measure.more_rounds(variants, timings, rounds)
    assert len(order) == 2 * rounds and sorted(order) == sorted(["a", "b"] * rounds)
    assert order[::2] == ["b", "a", "b"][:rounds]  # 11 rounds taken: the 12th starts with the second


def test_measure_settle_ignores_pairs_not_timed(monkeypatch):
    # the scheduler script settles `auto` against XLA; a variant that failed to build has no timing
    variants, timings = _fake_variants(
        monkeypatch, {"xla": itertools.repeat(1.0), "auto": itertools.cycle([0.95, 1.05, 1.0])}
    )
    pairs = [("auto", "xla", ("missing",)), ("auto +10% mem", "xla", ())]
    added = measure.settle(variants, timings, pairs, AT_LEAST, max_rounds=19, max_s=60)
    assert added == 8 and len(timings["auto"].samples) == 19 == len(timings["xla"].samples)


def test_a_pair_at_the_round_limit_does_not_stop_the_others(monkeypatch):
    variants, timings = _fake_variants(
        monkeypatch,
        {
            "a": itertools.cycle([0.95, 1.05, 1.0]),  # never settles
            "b": itertools.repeat(1.0),
            "c": itertools.cycle([0.95, 1.05, 1.0]),
            "d": itertools.repeat(1.0),
        },
    )
    measure.more_rounds({k: variants[k] for k in ("a", "b")}, timings, 8)  # a, b: 19 rounds already
    added = measure.settle(variants, timings, [("a", "b", ()), ("c", "d", ())], AT_LEAST, 19, 60)
    assert added == 8 and len(timings["c"].samples) == 19 and len(timings["a"].samples) == 19

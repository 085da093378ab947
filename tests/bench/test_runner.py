"""The measurement machinery: interleaved timing, the optimization deadline, the float64
reference and the case registry."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.bench import runner, timing
from jaxrw.bench.case import CASES, Rand, load_suites, select
from jaxrw.bench.report import (
    geomean,
    matched_speedup,
    paired_speedup,
    summarize_suites,
    with_matched_speedups,
    write_rows,
)
from jaxrw.errors import InvalidOptionError

load_suites()


def test_measure_interleaves_and_calibrates():
    order: list[str] = []

    def make(name: str, delay: float):
        def fn(x):
            order.append(name)
            time.sleep(delay)
            return x

        return fn

    x = jnp.ones(3)
    res = timing.measure(
        {"a": (make("a", 0.002), (x,)), "b": (make("b", 0.0005), (x,))}, repeats=3, sample_s=0.01
    )
    assert set(res) == {"a", "b"}
    assert all(len(t.samples) == 3 for t in res.values())
    assert res["b"].calls > res["a"].calls  # calls per sample chosen per variant
    assert res["a"].median > res["b"].median
    assert res["a"].compile_s > 0 and res["a"].to_dict()["samples_s"] == res["a"].samples
    # after warm-up and calibration, rounds alternate which variant goes first
    n = res["a"].calls + res["b"].calls + 2  # + one untimed call of each before its sample
    rounds = order[-3 * n :]
    assert [rounds[0], rounds[n], rounds[2 * n]] == ["a", "b", "a"]


def test_deadline_stops_optimization_and_is_reported():
    def slow_report(*args):
        time.sleep(5)

    class Slow:
        report = staticmethod(slow_report)

    rec = {"notes": [], "opt_timeout": False}
    t = time.perf_counter()
    out = runner._optimize(Slow(), (), runner.Options(opt_timeout_s=0.2), rec)
    assert time.perf_counter() - t < 2
    assert out is None and rec["opt_timeout"] and "exceeded 0.2 s" in rec["notes"][0]


# the alarm may land in a gc callback, where Python reports and swallows the raise (it re-fires)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_run_case_with_short_deadline_keeps_the_case():
    opts = runner.Options(repeats=1, sample_s=1e-4, warmup=0, opt_timeout_s=1e-3, in_jit=False)
    rec = runner.run_case(CASES["stacked_matvec_16"], opts)
    assert rec["status"] == "ok"
    assert rec["opt_timeout"] and rec["opt_s"] < 5.0
    assert "jaxrw" not in rec["variants"] and rec["speedup"] is None
    assert rec["variants"]["jax.jit"]["rel_err"] < 1e-5


def test_reference_is_float64_and_leaves_x64_off():
    x = Rand(0, "bfloat16").normal(8, 8)
    (ref,) = runner.reference(lambda a: a @ a, (x,))
    assert ref.dtype == np.float64
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float32
    want = np.asarray(x, np.float64) @ np.asarray(x, np.float64)
    np.testing.assert_allclose(ref, want, rtol=1e-12)


def test_random_inputs_are_fresh_and_never_zero():
    a, b = Rand(1, "float32").normal(64), Rand(2, "float32").normal(64)
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    assert np.all(np.asarray(a) != 0)
    assert np.array_equal(np.asarray(Rand(1, "float32").normal(64)), np.asarray(a))  # reproducible


def test_select_by_suite_and_pattern():
    assert {c.suite for c in select("merge")} == {"merge"}
    assert [c.name for c in select("all", "chain_mv")] == ["chain_mv"]
    # a whole name selects that case alone; anything else matches as a glob or substring
    assert [c.name for c in select("models", "llama288")] == ["llama288"]
    assert {c.name for c in select("models", "llama288_")} == {"llama288_hoist", "llama288_const"}
    assert {c.name for c in select("models", "nasrnn_args,llama4096")} == {"nasrnn_args", "llama4096"}
    assert {c.name for c in select("algebra", "chain*")} >= {"chain_mv", "chain4", "chain_rect", "chain_left"}
    # as the tables and results name a case ("--case algebra/chain_mv" was refused: a new user)
    assert [(c.suite, c.name) for c in select("all", "algebra/chain_mv")] == [("algebra", "chain_mv")]
    assert {c.suite for c in select("all", "merge/*")} == {"merge"}
    with pytest.raises(InvalidOptionError, match=r"'nope'.*valid: \['algebra/"):
        select("algebra", "nope")
    with pytest.raises(InvalidOptionError, match="'models/chain_mv'"):
        select("all", "models/chain_mv")
    with pytest.raises(InvalidOptionError, match=r"'graphs'.*'algebra'"):
        select("graphs")


def test_summary_geomean_and_slower_cases():
    recs = [
        {"suite": "s", "dtype": "float32", "case": "a", "status": "ok", "speedup": 4.0, "hand_speedup": 2.0},
        {
            "suite": "s",
            "dtype": "float32",
            "case": "b",
            "status": "ok",
            "speedup": 0.25,
            "hand_speedup": None,
        },
        {"suite": "s", "dtype": "float32", "case": "c", "status": "error", "speedup": None},
    ]
    s = summarize_suites(recs)["s/float32"]
    assert s["geomean_speedup"] == pytest.approx(1.0) and s["geomean_hand"] == pytest.approx(2.0)
    # the hand column covers case a alone: jaxrw on that case is reported beside it
    assert s["geomean_speedup_with_hand"] == pytest.approx(4.0) and s["with_hand"] == 1
    assert s["slower"] == ["b"] and s["errors"] == ["c"] and s["timed"] == 2
    assert geomean([]) is None


def test_paired_speedup_reads_the_samples_round_by_round():
    # llama288_const, bfloat16, H200 run s: every variant ran ~2x slower for its first five or six
    # rounds; the ratio of medians said 0.73x, every round but the switching one said ~1.4x
    jit = [637, 581, 601, 576, 576, 272, 275, 278, 285, 291, 297]
    rw = [455, 442, 434, 425, 423, 407, 198, 194, 197, 198, 207]
    rec = {
        "suite": "models",
        "dtype": "bfloat16",
        "case": "llama288_const",
        "status": "ok",
        "speedup": 297 / 407,
        "variants": {"jax.jit": {"samples_s": jit}, "jaxrw": {"samples_s": rw}},
    }
    per_round = [a / b for a, b in zip(jit, rw, strict=True)]
    assert paired_speedup(rec) == pytest.approx(statistics.median(per_round))
    assert 1.35 < paired_speedup(rec) < 1.45
    s = summarize_suites([rec])["models/bfloat16"]
    assert s["slower"] == ["llama288_const"] and s["slower_paired"] == []  # both are reported
    assert paired_speedup({"variants": {"jax.jit": {"samples_s": jit}}}) is None  # jaxrw not timed


def test_new_weights_every_call_is_also_judged_round_by_round():
    from jaxrw.bench.report import case_notes

    # nasrnn_args_hoist bf16, H200 run d3 (µs): the host's load moved both variants alike
    jit_new = [85.1, 92.7, 80.2, 83.3, 83.3, 99.3, 80.7, 90.0, 137.0, 113.4, 125.0]
    rw_new = [118.2, 91.9, 83.7, 90.2, 108.5, 113.9, 81.8, 83.2, 139.8, 103.1, 129.8]
    rec = {
        "speedup_new_args": statistics.median(jit_new) / statistics.median(rw_new),
        "variants": {"jax.jit:new-args": {"samples_s": jit_new}, "jaxrw:new-args": {"samples_s": rw_new}},
    }
    by_round = statistics.median(a / b for a, b in zip(jit_new, rw_new, strict=True))
    assert paired_speedup(rec, "jaxrw:new-args", "jax.jit:new-args") == pytest.approx(by_round)
    assert f"new weights every call: 0.87x, {by_round:.2f}x by round" in case_notes(rec)


def test_rotating_calls_switch_argument_sets():
    seen = []
    call = runner._rotating(lambda x: seen.append(x), [(1,), (2,), (3,)])
    for _ in range(6):
        call()
    assert seen == [2, 3, 1, 2, 3, 1]


@pytest.mark.skipif(not runner.optimize_supports("hoist_argnums"), reason="optimize() has no hoist_argnums")
def test_hoist_case_also_times_new_weights_every_call():
    opts = runner.Options(repeats=1, sample_s=1e-4, warmup=0, in_jit=False)
    rec = runner.run_case(CASES["llama4096_hoist"], opts)
    assert rec["status"] == "ok", rec.get("error")
    assert "jaxrw:new-args" in rec["variants"] and rec["speedup_new_args"] > 0
    assert "jax.jit:new-args" in rec["variants"]  # its baseline: jax.jit called the same way
    assert rec["speedup_bind"] > 0 and rec["variants"]["jaxrw:bind"]["rel_err_vs_jaxrw"] < 1e-6
    assert rec["numerics_ok"]


def test_a_kept_case_also_times_a_second_jax_jit():
    # diag_scale is kept (the original program): a second, separately compiled jax.jit of the same
    # function is the floor under its speedup, and is named in the notes
    from jaxrw.bench.report import case_notes

    opts = runner.Options(repeats=1, sample_s=1e-4, warmup=0)
    rec = runner.run_case(CASES["diag_scale"], opts)
    assert rec["status"] == "ok", rec.get("error")
    assert not rec["report"]["rewritten"] and "jax.jit#2" in rec["variants"] and rec["second_jit"] > 0
    assert "jaxrw@jit" not in rec["variants"] and "a second jax.jit:" in case_notes(rec)


def test_the_recorded_commit_can_be_given(monkeypatch):
    # a tree copied to a GPU machine can carry a stale .git: JAXRW_COMMIT names the real commit
    monkeypatch.setenv("JAXRW_COMMIT", "24b29b3+dirty")
    assert runner.git_commit() == "24b29b3+dirty"
    monkeypatch.setenv("JAXRW_COMMIT", "not a commit; rm -rf")  # anything else is ignored
    assert runner.git_commit() != "not a commit; rm -rf"


def test_write_rows_records_the_device_and_jax_with_the_rows(tmp_path):
    import json

    rows = [{"case": "a", "median_us": {"jax.jit": 1.5}}]
    meta = write_rows(str(tmp_path / "r.json"), rows)
    assert meta == {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    assert json.loads((tmp_path / "r.json").read_text()) == {**meta, "rows": rows}
    assert write_rows(None, rows) == meta  # no path: nothing written, the same meta


def test_hand_speedup_is_taken_over_the_rounds_hand_ran_in():
    # settle adds rounds to jax.jit and jaxrw only: here the host slowed down 1.35x for the added
    # ones (llama4096_hoist bf16, k5), which a median over all of jax.jit's rounds would credit to hand
    jit = [250e-6] * 11 + [337e-6] * 36
    hand = [238e-6] * 11
    rec = {
        "variants": {
            "jax.jit": {"samples_s": jit, "median_s": statistics.median(jit)},
            "hand": {"samples_s": hand, "median_s": 238e-6},
        }
    }
    assert statistics.median(jit) / 238e-6 > 1.3  # what the medians of all rounds said
    assert matched_speedup(rec, "hand") == pytest.approx(250 / 238)
    assert with_matched_speedups({**rec, "hand_speedup": 1.4})["hand_speedup"] == pytest.approx(250 / 238)
    assert matched_speedup(rec, "jaxrw:bind") is None


def test_a_wrong_hand_version_is_not_counted_against_jaxrw():
    # the hand-written version's error flagged the case's jaxrw cell and listed it as jaxrw's
    # numerics failure
    from jaxrw.bench.case import Case, Instance

    def build(size, dtype):
        def args(seed):
            r = Rand(seed, dtype)
            return r.weight(64, 64, 64), r.normal(64, 4)

        return Instance(lambda A, v: A @ v, args, hand=lambda A, v: 1.1 * (A @ v), shape="n=64")

    case = Case("wrong_hand", "algebra", build, "a hand version 10% off", ("float32",), False)
    rec = runner.run_case(case, runner.Options(repeats=1, sample_s=1e-4, warmup=0, in_jit=False))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["numerics_ok"] and rec["hand_numerics_ok"] is False


def test_notes_of_a_record_without_rounds():
    # older records carry medians but no samples: the unresolved note formatted None and raised
    from jaxrw.bench.report import case_notes

    rec = {
        "case": "c",
        "status": "ok",
        "speedup": 1.1,
        "variants": {"jax.jit": {"median_s": 1.1e-3}, "jaxrw": {"median_s": 1e-3}},
    }
    assert "unresolved" in case_notes(rec) and "by round —" in case_notes(rec)


def test_numerics_where_jax_jit_itself_overflows():
    # the bound max(tol, 2 x jax.jit's error) is infinite where jax.jit's result is not finite and
    # float64's is: any jaxrw result passed. It must now be close to float64's result or jax.jit's.
    inf, tol = float("inf"), 5e-3
    v = {"jax.jit": {"rel_err": inf}, "jaxrw": {"rel_err": inf, "rel_err_vs_jit": 0.0}}
    assert runner.numerics_ok(v, tol)  # jax.jit's own overflow, reproduced
    v["jaxrw"] = {"rel_err": 1e-7, "rel_err_vs_jit": inf}
    assert runner.numerics_ok(v, tol)  # finite where jax.jit overflowed, and right
    v["jaxrw"] = {"rel_err": 0.5, "rel_err_vs_jit": inf}
    assert not runner.numerics_ok(v, tol)  # neither: wrong
    v = {"jax.jit": {"rel_err": 1e-3}, "jaxrw": {"rel_err": 1.9e-3}, "hand": {"rel_err": 0.1}}
    assert runner.numerics_ok(v, 1e-4) and not runner.numerics_ok(v, 1e-4, ("hand",))

"""What `jaxrw bench` prints under its table (counts of cases run and skipped, the verdict line at
0.98x; on fake records, no case is timed here) and what its options mean at their edges."""

from __future__ import annotations

import pytest
from rich.console import Console

from jaxrw import cli
from jaxrw.bench import runner
from jaxrw.bench.report import summarize_suites


def _ok(case: str, rounds: int = 6) -> dict:
    return {
        "suite": "algebra",
        "case": case,
        "dtype": "float32",
        "status": "ok",
        "notes": [],
        "speedup": 2.0,
        "variants": {
            "jax.jit": {"median_s": 2.0, "samples_s": [2.0] * rounds},
            "jaxrw": {"median_s": 1.0, "samples_s": [1.0] * rounds},
        },
    }


def _skipped(case: str) -> dict:
    return {"suite": "algebra", "case": case, "dtype": "float32", "status": "skipped", "notes": ["budget"]}


def footer(cases: list[dict], opts: runner.Options) -> str:
    console = Console(record=True, width=400)
    result = {"meta": {"total_s": 4.0}, "cases": cases, "summary": summarize_suites(cases)}
    cli._footer(console, result, opts)
    return console.export_text()


def test_footer_counts_the_cases_run_and_skipped():
    # `--budget 3` printed "26 cases in 4 s" where 2 had run and 24 were skipped
    cases = [_ok("a"), _ok("b"), *[_skipped(f"s{i}") for i in range(24)]]
    text = footer(cases, runner.Options(size="small", repeats=5))
    assert "2 cases run (24 skipped) in 4 s." in text and "26 cases" not in text
    assert "1 case run in 4 s." in footer([_ok("a")], runner.Options(size="small", repeats=5))


def test_sample_ms_zero_is_one_call_per_sample_as_documented(capsys):
    # accepted, but its meaning was undocumented (--budget and --opt-timeout say "0: none")
    from jaxrw.rewrite.measure import measure

    timings = measure({"f": (lambda: 1.0, ())}, repeats=2, sample_s=0.0, warmup=1)
    assert timings["f"].calls == 1 and len(timings["f"].samples) == 2
    bench = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["bench"]
    help_ = bench.format_help().replace("\n", " ")
    assert "0 times one call per sample" in " ".join(help_.split())


def test_max_rounds_below_repeats_is_refused(monkeypatch, capsys):
    # was raised to --repeats silently, and the "At or above 0.98x" line then disappeared
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("ran with a refused option"))
    assert cli.main(["bench", "--case", "chain_mv", "--max-rounds", "2"]) == 2
    err = capsys.readouterr().err
    assert "--max-rounds 2 is below --repeats 5" in err and "valid: an integer >= 5" in err


def test_the_verdict_line_follows_whenever_an_interval_can_exist():
    # `--repeats 11` at the small size (no extra rounds: the limit is 11) printed no verdict
    for opts in (runner.Options(size="small", repeats=11), runner.Options(size="small", repeats=5)):
        assert "At or above 0.98x" in footer([_ok("a", rounds=opts.round_limit())], opts)
    text = footer([_ok("a", rounds=5)], runner.Options(size="small", repeats=5, max_rounds=5))
    assert "At or above" not in text and "No verdict at 0.98x: 5 rounds give no 95% interval" in text

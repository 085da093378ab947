"""`jaxrw bench` end to end on one tiny case, the markdown summary, and clear errors for bad
options (each names the bad value and the valid set)."""

from __future__ import annotations

import json
import sys

import pytest

from jaxrw import cli
from jaxrw.bench import summarize


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    js, png = out / "r" / "res.json", out / "res.png"
    rc = cli.main(
        [
            "bench",
            "--suite",
            "algebra",
            "--case",
            "chain_mv",
            "--repeats",
            "2",
            "--json",
            str(js),
            "--plot",
            str(png),
            "--sample-ms",
            "1",
        ]
    )
    return rc, js, png


def test_bench_writes_json_and_png(bench_run, capsys):
    rc, js, png = bench_run
    assert rc == 0
    result = json.loads(js.read_text())
    meta = result["meta"]
    for key in ("device", "platform", "jax", "jaxlib", "egglog", "date", "dtype", "size", "repeats"):
        assert meta[key], key
    assert meta["dtype"] == "float32" and meta["size"] == "small" and meta["repeats"] == 2
    assert meta["max_rounds"] == 6  # the small size: no more rounds than a 95% interval needs
    assert meta["iterations"] is None  # optimize's own limit
    # the profile the cost model took, with its switches (what an A/B of one compares)
    assert meta["profile"]["name"] and meta["profile"]["concat_chains"] is True
    (rec,) = result["cases"]
    assert rec["case"] == "chain_mv" and rec["status"] == "ok"
    for name in ("jax.jit", "jaxrw", "jaxrw@jit", "hand"):
        if name == "jaxrw@jit" and not (rec["report"] or {}).get("rewritten"):
            assert name not in rec["variants"]  # the original program: jax.jit's, not timed twice
            continue
        v = rec["variants"][name]
        assert len(v["samples_s"]) in (2, 6) and v["median_s"] > 0 and v["rel_err"] < 1e-4
    if rec["report"] is not None:
        assert rec["report"]["egraph_nodes"] > 0 and rec["report"]["stop_reason"]
    else:  # jaxrw fell back to jax.jit: the record says why
        assert rec["fallback"]
    assert rec["opt_s"] > 0 and rec["speedup"] > 0
    assert result["summary"]["algebra/float32"]["timed"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_iterations_limit_every_case(tmp_path):
    js = tmp_path / "it.json"
    argv = ["bench", "--case", "experts_packed", "--repeats", "1", "--iterations", "2", "--json", str(js)]
    assert cli.main([*argv, "--sample-ms", "1", "--quiet"]) == 0
    result = json.loads(js.read_text())
    assert result["meta"]["iterations"] == 2
    (rec,) = result["cases"]
    assert rec["report"]["iterations"] == 2 and rec["report"]["stop_reason"] == "iteration limit"


def test_summarize_prints_markdown(bench_run, capsys):
    _, js, _ = bench_run
    assert summarize.main([str(js)]) == 0
    text = capsys.readouterr().out
    assert "| algebra | chain_mv |" in text and "**geomean**" in text and "Slower than jax.jit" in text


def test_summarize_redraws_the_plot_from_the_json(bench_run, tmp_path, capsys):
    _, js, _ = bench_run
    assert summarize.main([str(js), "--plot", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "res.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| algebra | chain_mv |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text, named",
    [
        ("{}", "'meta'"),
        ("3", "'meta'"),  # these three raised TypeError/KeyError tracebacks
        ('{"meta": {}, "cases": []}', "'meta' lacks"),
        (
            '{"meta": {"device": "d", "platform": "p", "size": "s", "dtype": "t", "jax": "j", "date": "x",'
            ' "repeats": 1}, "cases": [{"suite": "a", "case": "b", "dtype": "t"}]}',
            "case 0 lacks ['status']",
        ),
    ],
)
def test_summarize_rejects_other_json(tmp_path, capsys, text, named):
    bad = tmp_path / "x.json"
    bad.write_text(text)
    assert summarize.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "x.json" in err and named in err


def test_summarize_plots_files_of_one_name_apart(bench_run, tmp_path):
    # a/res.json and b/res.json wrote one res.png, the second over the first
    _, js, _ = bench_run
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "res.json").write_text(js.read_text())
    assert (
        summarize.main(
            [
                str(tmp_path / "a" / "res.json"),
                str(tmp_path / "b" / "res.json"),
                "--plot",
                str(tmp_path / "p"),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["a-res.png", "b-res.png"]


@pytest.mark.parametrize(
    "option, path, why",
    [
        ("--json", "{dir}", "is a directory"),  # found after every case had run: the results were lost
        ("--plot", "{dir}/x.txt", "a file ending in .png, .pdf, .svg"),
        ("--plot", "{dir}/noext", "a file ending in .png"),  # matplotlib wrote noext.png, "wrote noext" said
    ],
)
def test_output_paths_are_checked_before_the_run(tmp_path, capsys, monkeypatch, option, path, why):
    import jaxrw.bench.runner as runner

    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("ran before the path was checked"))
    assert cli.main(["bench", "--case", "chain_mv", option, path.format(dir=tmp_path)]) == 2
    assert why in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "bad", "valid"),
    [
        (["--suite", "graphs"], "'graphs'", "'algebra', 'merge', 'models', 'streams', 'all'"),
        (["--size", "huge"], "'huge'", "'small', 'large'"),
        (["--dtype", "float16"], "'float16'", "'float32', 'bfloat16'"),
        (["--repeats", "0"], "'0'", "a positive integer"),
        (["--max-rounds", "-3"], "'-3'", "a positive integer"),
        (["--iterations", "0"], "'0'", "a positive integer"),
        (["--opt-timeout", "soon"], "'soon'", "a finite number >= 0"),
        (["--sample-ms", "inf"], "'inf'", "a finite number >= 0"),  # every case overflowed its timer
        (["--budget", "1e400"], "'1e400'", "a finite number >= 0"),
    ],
)
def test_bad_option_names_value_and_valid_set(argv, bad, valid, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert bad in err and valid in err


def test_unknown_case_names_pattern_and_cases(capsys):
    assert cli.main(["bench", "--suite", "merge", "--case", "nothing_like_this"]) == 2
    err = capsys.readouterr().err
    assert "'nothing_like_this'" in err and "qkv_const" in err


def test_unknown_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["benchmark"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'benchmark'" in err and "bench" in err and "calibrate" in err


def test_calibrate_missing_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jaxrw.rewrite.calibrate", None)  # import fails
    assert cli.main(["calibrate"]) == 2
    assert "jaxrw.rewrite.calibrate" in capsys.readouterr().err


def test_calibrate_forwards_arguments(monkeypatch):
    import types

    seen = {}
    fake = types.SimpleNamespace(main=lambda argv: seen.setdefault("argv", argv) and 0)
    monkeypatch.setitem(sys.modules, "jaxrw.rewrite.calibrate", fake)
    assert cli.main(["calibrate", "--quick", "--output", "p.json"]) == 0
    assert seen["argv"] == ["--quick", "--output", "p.json"]


def test_optimization_table_reports_time_per_thousand_equations():
    rec = {"suite": "models", "case": "m", "status": "ok", "opt_s": 2.0, "opt_timeout": False,
           "report": {"n_equations": 500, "egraph_nodes": 900, "stop_reason": "saturated", "rewritten": True,
                      "phase_s": {"encode": 1.5, "rewrite": 0.4, "extract": 0.1}}}  # fmt: skip
    text = summarize.optimization_table({"cases": [rec]})
    assert "| m | 500 | 2.00 | 4.0 | 1.50 / 0.40 / 0.10 / — | 900 | saturated |" in text  # no schedule phase
    rec["report"]["phase_s"]["schedule"] = 0.05  # auto timed candidate schedules (CUDA)
    text = summarize.optimization_table({"cases": [rec]})
    assert "| m | 500 | 2.00 | 4.0 | 1.50 / 0.40 / 0.10 / 0.05 | 900 | saturated |" in text
    assert summarize.optimization_table({"cases": []}) == ""


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("jaxrw ")

"""What `jaxrw bench` and `summarize` write and say when a run goes wrong or is read back: found by
the fourth review round (empty option values, one path for JSON and plot, Ctrl-C, a result outside
the tolerance, JAXRW_DISABLE, geomeans over different cases, slowdowns with new weights, stale
speedups of recorded runs, a glob with other files)."""

from __future__ import annotations

import json

import pytest

from jaxrw import cli
from jaxrw.bench import report, runner, summarize

TINY = ["bench", "--case", "chain_mv,chain4", "--repeats", "1", "--sample-ms", "1"]


@pytest.mark.parametrize("option", ["--json", "--plot", "--case"])
def test_an_empty_value_is_a_usage_error(option, capsys):
    # `--json "$OUT"` with OUT unset wrote nothing and said nothing; `--case ""` ran every case
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", option, ""])
    assert exit_.value.code == 2 and "empty value" in capsys.readouterr().err


def test_json_and_plot_on_one_path_is_refused(tmp_path, capsys):
    # the plot overwrote the JSON, and both "wrote" lines were printed
    path = str(tmp_path / "r.svg")
    assert cli.main([*TINY, "--json", path, "--plot", path]) == 2
    assert "name one file" in capsys.readouterr().err and not (tmp_path / "r.svg").exists()


def test_ctrl_c_keeps_the_finished_cases(tmp_path, monkeypatch):
    real, calls = runner.run_case, []

    def interrupted_second(case, opts):
        calls.append(case.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(case, opts)

    monkeypatch.setattr(runner, "run_case", interrupted_second)
    js = tmp_path / "r.json"
    assert cli.main([*TINY, "--json", str(js), "--quiet"]) == 130
    result = json.loads(js.read_text())
    assert result["meta"]["interrupted"] is True
    assert [c["status"] for c in result["cases"]] == ["ok", "skipped"]
    assert "interrupted" in result["cases"][1]["notes"][0]


def test_a_result_outside_the_tolerance_fails_the_run_and_leaves_the_geomean(tmp_path, monkeypatch, capsys):
    # exit 0, a silent footer, and its speedup in the geomean: only a red mark in one cell showed it
    monkeypatch.setattr(runner, "numerics_ok", lambda v, tol, names=("jaxrw", "jaxrw@jit"): "hand" in names)
    js = tmp_path / "r.json"
    assert cli.main([*TINY, "--json", str(js)]) == 1
    out = capsys.readouterr().out
    assert "outside the error tolerance" in out and "chain_mv" in out
    result = json.loads(js.read_text())
    s = result["summary"]["algebra/float32"]
    assert s["numerics_failed"] == ["chain_mv", "chain4"] and s["timed"] == 0 and s["geomean_speedup"] is None
    texts = []
    monkeypatch.setattr("matplotlib.axes.Axes.text", lambda self, x, y, t, **k: texts.append(t))
    report.plot(result, str(tmp_path / "r.png"))  # the plot says so on the bar too
    assert sum("outside the error tolerance" in t for t in texts) == 2


def test_a_disabled_jaxrw_is_said_and_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXRW_DISABLE", "1")
    js = tmp_path / "r.json"
    assert (
        cli.main(["bench", "--case", "chain_mv", "--repeats", "1", "--sample-ms", "1", "--json", str(js)])
        == 0
    )
    assert json.loads(js.read_text())["meta"]["jaxrw_disabled"] is True
    out = capsys.readouterr().out
    assert "warning: JAXRW_DISABLE is set" in out and "JAXRW_DISABLE was set" in out  # before and after


def _rec(case, speedup, hand=None, new_args=None, numerics=True):
    return {
        "suite": "s",
        "dtype": "float32",
        "case": case,
        "status": "ok",
        "speedup": speedup,
        "hand_speedup": hand,
        "speedup_new_args": new_args,
        "numerics_ok": numerics,
        "variants": {
            "jax.jit": {"median_s": 1.0},
            **({"jaxrw": {"median_s": 1 / speedup}} if speedup else {}),
        },
    }


def test_summaries_compare_hand_and_jaxrw_over_the_same_cases():
    # the hand geomean took a case jaxrw had no time for: 1.12x against 5.95x
    recs = [
        _rec("a", 1.1, hand=1.2),
        {**_rec("b", None, hand=30.0), "speedup": None},
        _rec("c", 0.9, new_args=0.8),
    ]
    s = report.summarize_suites(recs)["s/float32"]
    assert s["geomean_hand"] == pytest.approx(1.2) and s["with_hand"] == 1
    assert s["slower_new_args"] == ["c"] and s["slower"] == ["c"]
    text = summarize.markdown({"meta": {k: "x" for k in summarize.META_KEYS}, "cases": recs})
    assert "with new weights every call (< 0.97x): s/c 0.80x" in text


def test_the_table_of_a_recorded_run_matches_its_rounds():
    # a recorded run's stored hand speedup (medians of different rounds) was shown as it was
    jit, jaxrw, hand = [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [10.0, 0.5, 0.5]
    variants = {
        n: {"median_s": sorted(t)[1], "samples_s": t} for n, t in (("jax.jit", jit), ("jaxrw", jaxrw))
    }
    variants["hand"] = {"median_s": 0.05, "samples_s": hand}  # a stale median
    rec = {**_rec("a", 2.0, hand=20.0), "variants": variants}  # the stored hand speedup: 20x
    result = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": [rec], "summary": {}}
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(report.table(result))
    assert "20.00x" not in console.export_text()


def test_summarize_reads_every_bench_file_of_a_glob(tmp_path, capsys):
    # it stopped at the first file that was no bench result (a glob of bench/results/*)
    good = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": [_rec("a", 1.1)]}
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text(json.dumps(good))
    assert summarize.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    captured = capsys.readouterr()
    assert "| s | a |" in captured.out and "skipped" in captured.err and "a.json" in captured.err


@pytest.mark.parametrize("name", ["plots.png", "existing.txt"])
def test_summarize_plot_names_a_folder(tmp_path, name, capsys):
    # a file name made a folder of that name; an existing file raised FileExistsError
    (tmp_path / "existing.txt").write_text("")
    with pytest.raises(SystemExit) as exit_:
        summarize.main([str(tmp_path / "x.json"), "--plot", str(tmp_path / name)])
    assert exit_.value.code == 2 and "a folder for the plots" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--rescore", "missing.json"], "FileNotFoundError"),
        (["--rescore", "{bench}"], "not a costcheck result"),
        (["--profile", "nope"], "nope"),
    ],
)
def test_costcheck_mistakes_are_usage_errors(argv, said, tmp_path, capsys):
    # tracebacks with exit 1, and a --json folder that failed only after the timing
    from jaxrw.bench import costcheck

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"meta": {}, "cases": []}))
    with pytest.raises(SystemExit) as exit_:
        costcheck.main([a.replace("{bench}", str(bench)) for a in argv])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, said",
    [(["--eqns", "-5"], "--eqns"), (["--time-s", "-1"], "--time-s"), (["--case", "nope"], "nope")],
)
def test_scale_mistakes_are_usage_errors(argv, said, capsys):
    # --time-s -1 failed every size and exited 0; --case nope was a KeyError traceback
    from jaxrw.bench import scale

    with pytest.raises(SystemExit) as exit_:
        scale.main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_summarize_plot_takes_an_existing_folder_with_a_dot(tmp_path, capsys):
    good = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": [_rec("a", 1.1)]}
    (tmp_path / "r.json").write_text(json.dumps(good))
    (tmp_path / "plots.v2").mkdir()
    assert summarize.main([str(tmp_path / "r.json"), "--plot", str(tmp_path / "plots.v2")]) == 0
    assert (tmp_path / "plots.v2" / "r.png").exists()


def test_a_program_kept_as_written_is_not_shown_as_a_gain(tmp_path):
    # a kept case's 1.13x (two compilations of one program) was green in the table and the plot
    kept = {**_rec("kept", 1.13), "report": {"rewritten": False, "stop_reason": "saturated"}}
    done = {**_rec("done", 1.5), "report": {"rewritten": True, "stop_reason": "saturated"}}
    result = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": [kept, done], "summary": {}}
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(report.table(result))
    text = console.export_text(clear=False)
    assert "1.13x kept" in text and "1.50x" in text
    styled = console.export_text(styles=True)
    assert "1.13x kept" in styled and "\x1b[32m1.13x" not in styled  # not green
    pytest.importorskip("matplotlib")
    report.plot(result, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


def test_an_80_column_terminal_gets_a_table_it_can_show():
    # eleven columns folded into "9…" and notes three letters a line (a new user's try)
    long = _rec("algebra_case_with_a_long_name", 15.6)
    recs = [{**long, "report": {"rewritten": True, "stop_reason": "x"}}]
    recs.append({**_rec("failed", None), "status": "error", "error": "boom"})
    recs.append({**_rec("wrong", 3.0, numerics=False), "report": {"rewritten": True, "stop_reason": "x"}})
    result = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": recs, "summary": {}}
    from rich.console import Console

    console = Console(width=80, record=True)
    console.print(report.table(result, compact=True))
    text = console.export_text()
    assert "s/algebra_case_with_a_long_name" in text and "15.60x" in text and "…" not in text
    assert "error" in text and "wider terminal" in text and "3.00x ✗" in text  # outside the tolerance
    assert max(map(len, text.splitlines())) <= 80

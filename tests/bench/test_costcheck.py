"""costcheck: the summary statistics and re-scoring recorded measurements with the current model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrw.bench import costcheck
from jaxrw.rewrite.profiles import H200

RECORDED = (
    Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-02b-costcheck-builtin.json"
)


def test_summarize_counts_agreement_on_pairs_that_differ():
    rows = [
        {"measured": {"written": 2.0, "rewritten": 1.0}, "predicted": {"written": 3.0, "rewritten": 1.0}},
        {"measured": {"written": 1.0, "rewritten": 2.0}, "predicted": {"written": 3.0, "rewritten": 1.0}},
        {"measured": {"written": 1.0, "rewritten": 1.05}, "predicted": {"written": 1.0, "rewritten": 9.0}},
    ]
    s = costcheck.summarize(rows)
    assert s["pairs"] == 3 and s["pairs_differing_10pct"] == 2 and s["agreement"] == pytest.approx(0.5)


def test_rescore_keeps_the_measurements_and_recomputes_predictions():
    recorded = json.loads(RECORDED.read_text())
    recorded["rows"] = recorded["rows"][:4]  # float32 at n=2048: quick
    out = costcheck.rescore(recorded, H200)
    assert out["rescored"] and out["device"] == recorded["device"]
    for old, new in zip(recorded["rows"], out["rows"], strict=True):
        assert new["measured"] == old["measured"]
        assert set(new["predicted"]) == {"written", "rewritten"} and min(new["predicted"].values()) > 0


def _recording(tmp_path, **meta) -> str:
    recorded = json.loads(RECORDED.read_text())
    recorded["rows"] = recorded["rows"][:4]
    for key in ("profile", "device"):
        recorded.pop(key, None)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(recorded | meta))
    return str(path)


@pytest.mark.parametrize(
    ("meta", "argv", "used", "why"),
    [
        # an H200 recording was scored with this CPU's profile, silently (95.1% / 0.700, not 93.6% / 0.958)
        ({"profile": "h200", "device": "NVIDIA H200"}, [], "h200", "the recording's"),
        ({"profile": "h200"}, ["--profile", "cpu"], "cpu", "--profile"),  # an explicit one wins
        ({}, [], "cpu", "this machine's: the recording names none"),
    ],
)
def test_rescore_takes_the_recording_s_profile_and_says_which(
    tmp_path, monkeypatch, capsys, meta, argv, used, why
):
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))  # this machine's: the built-in cpu profile
    out = tmp_path / "out.json"
    assert costcheck.main(["--rescore", _recording(tmp_path, **meta), *argv, "--json", str(out)]) == 0
    assert f"with profile {used} ({why})" in capsys.readouterr().out
    assert json.loads(out.read_text())["profile"] == used


def test_rescore_of_a_calibrated_recording_asks_for_a_profile(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        costcheck.main(["--rescore", _recording(tmp_path, profile="h200-calibrated")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "'h200-calibrated', which is not built in" in err and "'h200'" in err

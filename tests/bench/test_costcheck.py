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

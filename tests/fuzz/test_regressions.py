"""Replays every shrunk fuzz failure saved in regressions.json (by `make fuzz` or by hand).

Each case is a program spec (JSON data, run only through jaxrw.bench.fuzzprog's interpreter) with
the failure it once showed; it must now pass the same differential check as the fuzzer's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrw.bench.fuzz import check

CASES = json.loads((Path(__file__).parent / "regressions.json").read_text())


def test_the_regressions_file_is_well_formed():
    for case in CASES:
        assert {"spec", "status", "message"} <= set(case)
        assert {"values", "outputs", "options"} <= set(case["spec"])


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['status']}" for i, c in enumerate(CASES)])
def test_regression(case):
    out = check(case["spec"])
    assert out.status == "ok", f"{out.status}: {out.message} (was: {case['message']})"

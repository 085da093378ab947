"""Where the bench tables put a case's notes (rounds added, paired ratios, verdicts): a column of
their own, not appended to the rules fired; and the runner's note on rounds added reads right."""

from __future__ import annotations

import itertools

from jaxrw.bench import report, runner, summarize
from jaxrw.bench.report import AT_LEAST

NOTE = f"1 more round to settle the {AT_LEAST}x interval"


def _rec() -> dict:
    jit, rw = [6.0, 5.0, 6.2, 5.8, 6.1, 6.0], [1.0, 1.1, 0.9, 1.05, 1.0, 0.95]
    return {
        "suite": "algebra",
        "case": "chain_mv",
        "dtype": "float32",
        "status": "ok",
        "notes": [NOTE],
        "speedup": 6.0,
        "opt_s": 1.0,
        "report": {"rewritten": True, "stop_reason": "saturated", "rules_fired": {"dot.assoc_2d": 2}},
        "variants": {
            "jax.jit": {"median_s": 6.0, "samples_s": jit},
            "jaxrw": {"median_s": 1.0, "samples_s": rw},
        },
    }


def _column(table, header: str) -> list[str]:
    (col,) = [c for c in table.columns if c.header == header]
    return [str(cell) for cell in col._cells]


def test_the_table_puts_notes_in_their_own_column():
    # "dot.assoc_2d×2 (1 more rounds to settle the 0.98x interval; ...)" in the rules fired column
    result = {"meta": {k: "x" for k in summarize.META_KEYS}, "cases": [_rec()], "summary": {}}
    t = report.table(result)
    assert _column(t, "rules fired")[0] == "dot.assoc_2d×2"
    assert NOTE in _column(t, "notes")[0]


def test_the_markdown_summary_puts_notes_in_their_own_column():
    row = summarize._case_row("algebra", _rec())
    assert len(row) == len(summarize.HEADER) and summarize.HEADER[-2:] == ["rules fired", "notes"]
    assert row[-2] == "dot.assoc_2d×2" and NOTE in row[-1]
    skipped = {**_rec(), "status": "skipped", "notes": ["budget spent"]}
    assert summarize._case_row("algebra", skipped)[-1] == "skipped: budget spent"


def test_one_round_added_is_said_in_the_singular(monkeypatch):
    # "(1 more rounds to settle the 0.98x interval)": the small size adds one round to five
    from tests.bench.test_settle import _fake_variants

    noise = itertools.cycle([0.95, 1.05, 1.0])
    variants, timings = _fake_variants(monkeypatch, {"jax.jit": itertools.cycle([1.0]), "jaxrw": noise})
    rec: dict = {"notes": []}
    runner.settle(variants, timings, runner.Options(size="large", repeats=11, max_rounds=12), rec)
    assert len(timings["jaxrw"].samples) == 12 and rec["notes"] == [NOTE]

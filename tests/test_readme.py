"""The README stays true: its Python blocks run (in a fresh interpreter, in order), the quick start
names the two commands, its H200 table matches the recorded JSON it cites, and a "pending"
placeholder disappears once the results it waits for are recorded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = ROOT / "bench" / "results"
COSTCHECK = RESULTS / "h200-2026-12-02-costcheck-builtin-profile.json"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_quick_start_names_the_two_commands():
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make bench" in section and "make test" in section


def test_python_blocks_run():
    blocks = python_blocks(README)
    assert len(blocks) >= 2
    code = "\n\n".join(blocks)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAXRW_DISABLE", None)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RewriteReport" in out.stdout and "jaxrw.explain" in out.stdout


def test_example_is_about_ten_lines():
    example = python_blocks(README)[0]
    code = [ln for ln in example.splitlines() if ln.strip()]
    assert len(code) <= 12


@pytest.mark.skipif(not COSTCHECK.exists(), reason="the cited recorded run is not in this checkout")
def test_h200_table_matches_the_recording():
    rows = {(r["pair"], r["dtype"], r["scale"]): r for r in json.loads(COSTCHECK.read_text())["rows"]}
    table = re.findall(r"^\| `(\w+)` \|[^|]*\| ([^|]*) \| ([^|]*) \| ([\d.]+)x \|$", README, flags=re.M)
    assert len(table) >= 5
    for pair, f32, bf16, pred in table:
        for cell, dtype in ((f32, "float32"), (bf16, "bfloat16")):
            m = rows[(pair, dtype, 8192)]["measured"]
            w, r = m["written"], m["rewritten"]
            want = f"{w * 1e6:.0f} → {r * 1e6:.0f} µs ({w / r:.2f}x)"
            assert cell.strip() == want, (pair, dtype)
        p = rows[(pair, "float32", 8192)]["predicted"]
        assert pred == f"{p['written'] / p['rewritten']:.2f}"


def _recorded(predicate) -> list[str]:
    found = []
    for path in sorted(RESULTS.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and predicate(path, doc):
            found.append(path.name)
    return found


def test_pending_placeholders_are_current():
    bench_runs = _recorded(lambda p, d: "meta" in d and "cases" in d)
    if "<!-- bench-results: pending -->" in README:
        assert not bench_runs, (
            f"bench/results now holds `jaxrw bench` runs {bench_runs}: replace the README's pending "
            "placeholder (Measured on an H200) with their table"
        )
    schedule_runs = _recorded(lambda p, d: p.name.startswith("schedule") and "cases" in d)
    if "<!-- schedule-results: pending -->" in README:
        assert not schedule_runs, (
            f"bench/results now holds scheduler runs {schedule_runs}: update the README's Notebooks section"
        )


def test_cited_rescore_commands_name_recorded_files():
    cited = re.findall(r"costcheck --rescore (bench/results/\S+\.json)", README)
    assert cited and all((ROOT / path).exists() for path in cited)

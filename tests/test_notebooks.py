"""Every notebook in notebooks/ runs top to bottom on CPU (nbclient, a kernel on this interpreter),
within its time budget, and is committed without outputs."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BUDGET_S = 120  # each notebook must finish on CPU within two minutes
KERNEL = "jaxrw-tests"


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """A kernel spec that starts ipykernel on this interpreter (the venv), found via JUPYTER_PATH,
    so an unrelated `python3` kernel installed on the machine is never picked."""
    base = tmp_path_factory.mktemp("jupyter")
    spec = base / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec_json = {"argv": argv, "display_name": KERNEL, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(spec_json))
    return base


def test_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    for want in ("01-quickstart", "02-rules-and-costs", "03-benchmarks", "04-scheduler"):
        assert f"{want}.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: clear outputs first"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_dir, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir) + os.pathsep + os.environ.get("JUPYTER_PATH", ""))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("JAXRW_DISABLE", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name=KERNEL, timeout=BUDGET_S, resources={"metadata": {"path": str(path.parent)}}
    )
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    assert elapsed < BUDGET_S, f"{path.name} took {elapsed:.0f} s (budget {BUDGET_S} s)"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors

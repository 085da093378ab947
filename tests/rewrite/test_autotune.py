"""Measured top-k: candidates are timed once, the choice is cached on disk and reused."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    return tmp_path


def _args(seed=0, n=128):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((n, n), (n, n), (n, 4))]


def test_autotune_times_candidates_and_reuses_the_cache(_cache_dir, monkeypatch):
    A, B, v = _args()
    f = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, autotune=True)
    out = f(A, B, v)
    np.testing.assert_allclose(out, (A @ B) @ v, rtol=1e-3, atol=1e-2)
    rep = f.report(A, B, v)
    assert rep.autotune is not None and not rep.autotune["cached"]
    assert "original" in rep.autotune["times"] and len(rep.autotune["times"]) >= 2
    data = json.loads((_cache_dir / "autotune.json").read_text())
    assert len(data) == 1 and next(iter(data.values()))["winner"] == rep.autotune["winner"]

    import jaxrw.rewrite.autotune as at

    def no_timing(*a, **k):
        raise AssertionError("a cached choice must not be re-timed")

    monkeypatch.setattr(at, "time_interleaved", no_timing)
    g = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, autotune=True)
    np.testing.assert_allclose(g(A, B, v), out, rtol=1e-3, atol=1e-2)
    assert g.report(A, B, v).autotune["cached"]


def test_corrupted_cache_is_ignored_with_a_warning(_cache_dir):
    (_cache_dir / "autotune.json").write_text("{not json")
    A, B, v = _args(1)
    f = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, autotune=True)
    with pytest.warns(UserWarning, match="ignoring corrupted autotune cache"):
        f(A, B, v)
    assert json.loads((_cache_dir / "autotune.json").read_text())  # rewritten, valid

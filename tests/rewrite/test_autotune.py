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


def test_the_cache_key_holds_what_changes_the_candidates(_cache_dir):
    # autotune_k, the hoisted arguments and the profile were not in the key: a winner timed among
    # 2 candidates was reused for autotune_k=4, and for another program (hoisted) and profile
    A, B, v = _args(2)
    fn = lambda A, B, v: (A @ B) @ v  # noqa: E731
    jaxrw.optimize(fn, autotune=True, autotune_k=1)(A, B, v)
    for opts in (
        {"autotune_k": 4},
        {"autotune_k": 1, "hoist_argnums": (1,)},
        {"autotune_k": 1, "profile": "h200"},
    ):
        g = jaxrw.optimize(fn, autotune=True, **opts)
        assert not g.report(A, B, v).autotune["cached"], opts
    assert jaxrw.optimize(fn, autotune=True, autotune_k=1).report(A, B, v).autotune["cached"]


def test_a_cache_that_cannot_be_written_keeps_the_measured_choice(tmp_path, monkeypatch):
    # the write raised past autotune: the measured winner was thrown away for jax.jit (strict raised)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(blocker / "jaxrw"))
    A, B, v = _args(3)
    f = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, autotune=True, strict=True)
    with pytest.warns(UserWarning, match="could not save the autotune choice"):
        out = f(A, B, v)
    np.testing.assert_allclose(out, (A @ B) @ v, rtol=1e-3, atol=1e-2)
    assert f.report(A, B, v).autotune["winner"]


@pytest.mark.parametrize("times", ["12", 5, {"original": "fast"}, {"original": float("nan")}])
def test_an_entry_with_malformed_times_is_not_trusted(_cache_dir, times):
    A, B, v = _args(4)
    fn = lambda A, B, v: (A @ B) @ v  # noqa: E731
    jaxrw.optimize(fn, autotune=True).report(A, B, v)
    path = _cache_dir / "autotune.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({k: e | {"times": times} for k, e in data.items()}))
    g = jaxrw.optimize(fn, autotune=True, strict=True)
    with pytest.warns(UserWarning, match="ignoring corrupted autotune cache"):
        rep = g.report(A, B, v)
    assert not rep.autotune["cached"] and repr(rep)


def test_the_measured_winner_must_beat_the_original_round_by_round():
    # the host was 10x slower in rounds 3-5 for both: the rewrite's median is lower, but it lost
    # three rounds of five to the original (it had been taken on its median alone)
    from jaxrw.rewrite.autotune import ORIGINAL, measured_winner
    from jaxrw.rewrite.measure import Timing

    drift = {ORIGINAL: Timing([1, 1, 10, 10, 10]), "r": Timing([2, 2, 9, 9, 11])}
    assert drift["r"].median < drift[ORIGINAL].median
    assert measured_winner(drift) == ORIGINAL
    faster = {ORIGINAL: Timing([1, 1, 10, 10, 10]), "r": Timing([0.9, 0.9, 9, 9, 11])}
    assert measured_winner(faster) == "r"
    assert measured_winner({ORIGINAL: Timing([1, 2, 3]), "r": Timing([2, 3, 4])}) == ORIGINAL


def test_rewrites_hoisting_past_the_bound_are_no_candidates(monkeypatch):
    # the model's choice passed max_hoist_bytes is refused by rewrite_jaxpr; autotune's runners-up
    # and a cached winner were not checked against it, so a winner could keep more than allowed
    import jax

    import jaxrw.rewrite.autotune as at
    from jaxrw.rewrite.profiles import get_profile
    from jaxrw.rewrite.run import rewrite_jaxpr

    A, B, x = _args(5)
    fn = lambda A, B, x: jnp.tanh((A @ B) @ x)  # noqa: E731 - A @ B depends on the slow leaves only
    closed = jax.make_jaxpr(fn)(A, B, x)
    result = rewrite_jaxpr(closed, profile=get_profile("h200"), force=True, slow=frozenset({0, 1}))
    assert result.fn.hoisted.nbytes > 0  # the model's choice keeps A @ B
    timed: list = []
    real = at.time_interleaved

    def spy(fns, args, **kw):
        timed.append({name: getattr(f, "__wrapped__", f) for name, f in fns.items()})
        return real(fns, args, **kw)

    monkeypatch.setattr(at, "time_interleaved", spy)
    original = jax.jit(lambda *xs: [fn(*xs)])
    choice = at.autotune(result, closed, original, [A, B, x], k=3, max_hoist_bytes=0)
    (candidates,) = timed
    for name, f in candidates.items():  # nothing that keeps a byte, but the original
        assert name == at.ORIGINAL or getattr(f, "hoisted", None) is None or f.hoisted.nbytes == 0
    assert choice.fn is None or getattr(choice.fn, "hoisted", None) is None or choice.fn.hoisted.nbytes == 0
    # a winner cached under a looser bound (the model's choice, which keeps A @ B) is not taken
    best = at._fp_hash(at.fingerprint(result.view, result.extraction.choice))
    monkeypatch.setattr(at, "_load", lambda path: {at.program_key(closed, "k"): {"winner": best}})
    assert at.autotune(result, closed, original, [A, B, x], k=3, key_extra="k").from_cache  # fits
    timed.clear()
    again = at.autotune(result, closed, original, [A, B, x], k=3, key_extra="k", max_hoist_bytes=0)
    assert not again.from_cache and timed and again.winner != best

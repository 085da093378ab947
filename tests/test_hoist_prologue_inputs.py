"""The prologue's cache is keyed by the slow leaves its values are computed from, not by every
hoisted array: a bias or a temperature that only the main program reads may change on every call
(fine-tuning the layers the merges leave alone, a sampling temperature) and the merged weights
are still reused. Such a leaf's weak reference is not watched by the cache's finalizers, so the
quick path asks whether it is alive (an id that matches may be a new array's)."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np

import jaxrw
from jaxrw import hoist
from jaxrw.prologue import HANDOFF_AFTER
from tests.test_hoist_call_class import _served
from tests.test_hoist_two_sets import refuse


def net(p, x):
    # A @ B is the prologue's value; b and t are read by the main program only, `unused` by none
    return jnp.tanh(x @ (p["A"] @ p["B"]) + p["b"]) * p["t"]


def _params(seed: int, d: int = 16) -> dict:
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32) for _ in range(2))
    return {"A": a, "B": b, "b": jnp.zeros(d), "t": jnp.float32(1.0), "unused": jnp.ones(3)}


def _reference(p: dict, x) -> np.ndarray:
    f64 = {k: np.asarray(v, np.float64) for k, v in p.items()}
    return np.tanh(np.asarray(x, np.float64) @ (f64["A"] @ f64["B"]) + f64["b"]) * f64["t"]


def _check(opt, p, x) -> None:
    np.testing.assert_allclose(np.asarray(opt(p, x)), _reference(p, x), rtol=1e-4, atol=1e-5)


def test_leaves_only_the_main_program_reads_change_without_rerunning_the_prologue():
    opt = jaxrw.optimize(net, hoist_argnums=0)
    p = _params(900)
    x = jnp.asarray(np.random.default_rng(901).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        _check(opt, p, x)
    (entry,) = opt._cache.values()
    h = entry.call
    names = sorted(p)  # the flat order of the dict's leaves
    assert [names[i] for i in h.slow] == ["A", "B"]  # the prologue's inputs alone
    for i in range(40):  # a new bias, temperature and unused array on every call
        b, t = jnp.full(16, i / 40, jnp.float32), jnp.float32(1 + i / 10)
        p = {**p, "b": b, "t": t, "unused": jnp.ones(3) * i}
        _check(opt, p, x)
    assert len(opt._cache) == 1 and h.prologue_runs == 1 and not entry.handed_off and _served(opt)
    p = {**p, "A": p["A"] * 2.0}  # a prologue input: its values are computed again
    for _ in range(2):
        _check(opt, p, x)
    assert h.prologue_runs == 2


def test_fine_tuning_the_bias_reuses_the_merged_weights_and_its_gradient_is_right(monkeypatch):
    # before, every hoisted array keyed the cache: a new bias on every step ran jax.jit's program
    # (the merges lost) and handed the signature off to jax.jit after HANDOFF_AFTER steps
    opt = jaxrw.optimize(net, hoist_argnums=0)
    p = _params(910)
    x = jnp.asarray(np.random.default_rng(911).standard_normal((3, 16)), jnp.float32)

    def loss(f, b):
        return jnp.sum(f({**p, "b": b}, x) ** 2)

    b = p["b"]
    _check(opt, p, x)
    monkeypatch.setattr(opt, "_run_direct", refuse)  # every step on the cached merged weights
    for _ in range(HANDOFF_AFTER + 4):  # a training loop of the bias alone, A and B frozen
        with monkeypatch.context() as class_call_only:  # one flattening: HotPath.lead_flattened
            class_call_only.setattr(hoist, "structure_hit", refuse)
            _check(opt, {**p, "b": b}, x)
        g, want = jax.grad(lambda b: loss(opt, b))(b), jax.grad(lambda b: loss(net, b))(b)
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-4, atol=1e-5)
        b = b - 0.1 * g
    (entry,) = opt._cache.values()
    assert entry.call.prologue_runs == 1 and not entry.handed_off


def test_a_dead_bias_is_not_read_through_its_reference():
    # the quick path passes the bias through a weak reference made when the values were cached;
    # the cache does not watch it, so its death must send the call to the current leaves
    opt = jaxrw.optimize(net, hoist_argnums=0)
    p = _params(920)
    x = jnp.asarray(np.random.default_rng(921).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        _check(opt, p, x)
    passed = opt._hot_path.passed
    assert passed.fragile and passed.get() is not None
    p["b"] = jnp.full(16, 0.5, jnp.float32)  # in place: the dict is the same object, the old bias dies
    gc.collect()
    assert passed.get() is None
    for i in range(200):  # new biases again and again: a dead one's id is taken now and then
        p["b"] = jnp.full(16, (i % 5) / 5, jnp.float32)
        _check(opt, p, x)
    (entry,) = opt._cache.values()
    assert entry.call.prologue_runs == 1


def shaped(p, x):
    # `like` is read for its shape and dtype alone: no variable of the program, in no key but the
    # signature's (a review's repros: its new kind was served the old one's program)
    y = jnp.tanh(x @ (p["A"] @ p["B"])).sum()
    return jnp.broadcast_to(y, p["like"].shape).astype(p["like"].dtype)


def test_a_leaf_read_for_its_shape_alone_is_of_the_signature_kind():
    p = _params(930)
    x = jnp.asarray(np.random.default_rng(931).standard_normal((3, 16)), jnp.float32)

    def second(x, p):  # the parameters second: HotPath.__call__'s flatten branch serves them
        return shaped(p, x)

    by_position = (jaxrw.optimize(second, hoist_argnums=1), lambda f, q: f(x, q))
    by_name = (jaxrw.optimize(shaped, hoist_argnames="p"), lambda f, q: f(p=q, x=x))
    for opt, run in (by_position, by_name):
        for _ in range(3):
            run(opt, {**p, "like": jnp.zeros(3)})
        for n, dtype in ((5, jnp.float32), (7, jnp.float16), (3, jnp.float32), (5, jnp.bfloat16)):
            q = {**p, "like": jnp.zeros(n, dtype)}
            got, want = run(opt, q), shaped(q, x)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2)


def test_a_shape_only_leaf_replaced_in_place_never_passes_for_a_dead_ones_id():
    # the usual layout's identity check compares ids; the leaf's death is asked of its weak
    # reference (no finalizer watches it): a new array of another shape may take the id
    opt = jaxrw.optimize(shaped, hoist_argnums=0)
    p = {**_params(940), "like": jnp.zeros(3)}
    x = jnp.asarray(np.random.default_rng(941).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        opt(p, x)
    for i in range(300):
        p["like"] = jnp.zeros(3 if i % 3 == 0 else 5)
        assert opt(p, x).shape == shaped(p, x).shape


def test_a_bias_set_once_and_reused_is_served_by_the_quick_path_again(monkeypatch):
    # the checks were taken for the old bias; without a prologue run nothing took them again,
    # so every later call went through the structure lookup (about twice the quick call's Python)
    for kw, call in (({"hoist_argnums": 0}, lambda f, q, x: f(q, x)), ({"hoist_argnames": "p"}, None)):
        opt = jaxrw.optimize(net, **kw)
        run = call or (lambda f, q, x: f(p=q, x=x))
        p = _params(950)
        x = jnp.asarray(np.random.default_rng(951).standard_normal((3, 16)), jnp.float32)
        for _ in range(3):
            run(opt, p, x)
        p["b"] = jnp.full(16, 0.25, jnp.float32)  # in place, then reused
        for _ in range(2):
            np.testing.assert_allclose(np.asarray(run(opt, p, x)), _reference(p, x), rtol=1e-4, atol=1e-5)
        with monkeypatch.context() as quick_only:
            quick_only.setattr(hoist, "structure_hit", refuse)
            quick_only.setattr(hoist, "avals_of", refuse)  # HotPath's flatten branch
            for i in range(3):
                np.testing.assert_allclose(
                    np.asarray(run(opt, p, x + i)), _reference(p, x + i), rtol=1e-4, atol=1e-5
                )
        assert next(iter(opt._cache.values())).call.prologue_runs == 1

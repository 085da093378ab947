"""Hoisting with several signatures of one optimized function (batch sizes, cache lengths, static
arguments): each signature's main program compiled once, prologue values shared where the
prologue is one program and kept apart where it is not, and the new-parameters policy applied
to the signature of the call."""

from __future__ import annotations

import gc
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.hoist import HANDOFF_AFTER
from tests.compiles import compiled_during
from tests.test_hoist import _params, _x, f


def test_another_signature_turns_the_hot_path_off_and_stays_right():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p = _params(42)
    small, big = _x(43, n=4), _x(44, n=7)
    opt(p, small)
    opt(p, small)
    assert opt._hot_path is not None
    for _ in range(2):  # alternating batch sizes: the hot path meets another shape once, then is off
        for x in (big, small):
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    assert opt._hot_path is None and opt._hot_path_off
    opt.clear_cache()
    assert not opt._hot_path_off


def test_batch_sizes_alternating_from_the_start_compile_each_main_program_once():
    # each signature's main program compiles once: a signature whose quick path another shape
    # turned off keeps running its first call's jit (three compilations before: that jit, then
    # the plain run's for the first shape again)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p = _params(47)
    small, big = _x(48, n=4), _x(49, n=7)
    opt.report(p, small)  # built (the prologue's and main programs' traces), not yet compiled
    opt.report(p, big)
    compiled = compiled_during(lambda: [opt(p, x) for _ in range(3) for x in (small, big)])
    assert opt._hot_path_off
    # the prologue once (the two signatures' prologues are one program: shared), each main once
    names = sorted(m.split()[4] for m in compiled)
    assert len(names) == 3 and names.count("jit(f_prologue)") == 1, compiled  # named as f (jit parity)
    calls = [e.call for e in opt._cache.values()]
    assert len(calls) == 2 and calls[0].values is calls[1].values
    assert calls[0].prologue_runs + calls[1].prologue_runs == 1
    for x in (small, big):
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    p2 = jax.tree_util.tree_map(lambda a: a * 0.5, p)
    for _ in range(2):  # new arrays reused: the prologue reruns; the results follow them
        for x in (small, big):
            np.testing.assert_allclose(opt(p2, x), f(p2, x), rtol=1e-4, atol=1e-5)


def test_signatures_with_one_prologue_share_its_values():
    # batch sizes (or cache lengths) that differ while the parameters do not: one set of merged
    # weights, computed once, kept once, following new parameters for every signature
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p = _params(50)
    small, big = _x(51, n=3), _x(52, n=9)
    for x in (small, big, small, big):
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    a, b = (e.call for e in opt._cache.values())
    assert a.prologue is b.prologue and a.values is b.values  # one jit, one set of values
    assert a.prologue_runs + b.prologue_runs == 1
    p2 = jax.tree_util.tree_map(lambda w: w * 0.5, p)
    for x in (big, big, small, small):  # reused on one signature: the prologue reruns, once
        np.testing.assert_allclose(opt(p2, x), f(p2, x), rtol=1e-4, atol=1e-5)
    assert a.prologue_runs + b.prologue_runs == 2
    # p (still alive) keeps the first slots; the big signature keeps p2 in a second slot, and
    # the small one shares those values in its own: no prologue run, no copy, and neither set
    # evicts the other
    ids = lambda q: tuple(map(id, jax.tree_util.tree_leaves(q)))  # noqa: E731
    assert a.ids == b.ids == ids(p) and a.values is b.values
    assert a.spare_slot(ids(p2)).values is b.spare_slot(ids(p2)).values
    np.testing.assert_allclose(opt(p, small), f(p, small), rtol=1e-4, atol=1e-5)  # old ones: right
    del p, p2
    gc.collect()
    kept = [s.values for c in (a, b) for s in c.slots]
    assert all(v is None for v in kept)  # gone with the arrays


def test_signatures_on_different_parameters_keep_their_own_values():
    # live and averaged weights evaluated in turn, each at its own batch size: each signature
    # keeps its set (one shared slot made every reuse rerun the other's prologue: a review)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    live, ema = _params(55), _params(56)
    a, b = _x(57, n=4), _x(58, n=9)
    for _ in range(6):
        for p, x in ((live, a), (live, a), (ema, b), (ema, b)):
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    calls = [e.call for e in opt._cache.values()]
    assert sum(c.prologue_runs for c in calls) == 2 and calls[0].values is not calls[1].values


def test_new_parameters_keep_each_main_program_compiled_once():
    # after the quick path is off (two shapes), new parameters refresh each signature's own path,
    # whose jit is the one already compiled (a review found the plain jit compiled again)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, p2 = _params(59), _params(60)
    small, big = _x(61, n=4), _x(62, n=7)
    for x in (small, big) * 3:
        opt(p, x)
    for params in (p2, p):
        compiled = compiled_during(
            lambda params=params: [opt(params, x) for _ in range(3) for x in (small, big)]
        )
        assert [m for m in compiled if "main" in m or "body" in m] == [], compiled
    for x in (small, big):
        np.testing.assert_allclose(opt(p2, x), f(p2, x), rtol=1e-4, atol=1e-5)


def test_prologues_that_differ_are_not_shared():
    # a static argument picks which product of the weights the prologue forms: two programs on
    # the same parameters, each with values of its own (one shared cache would serve A@B for B@A)
    def g(params, x, order):
        a, b = params["A"], params["B"]
        return jnp.tanh(x @ ((a @ b) if order == "ab" else (b @ a)))

    opt = jaxrw.optimize(g, hoist_argnums=0, static_argnums=2)
    p, x = _params(53), _x(54)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        for _ in range(2):
            for order in ("ab", "ba"):
                np.testing.assert_allclose(opt(p, x, order), g(p, x, order), rtol=1e-4, atol=1e-5)
    a, b = (e.call for e in opt._cache.values())
    assert a.cache is not b.cache and a.prologue_runs == b.prologue_runs == 1


def test_shared_prologue_keys_on_the_program_the_leaves_and_the_constants():
    from jaxrw.prologue import KeptValues, shared_prologue

    class Split:  # what shared_prologue reads of decode.Hoisted
        def __init__(self, prologue, slow=(0, 1)):
            self.prologue, self.slow = prologue, slow

    a, b = jnp.ones((4, 4)), jnp.ones((4, 4))
    c1, c2 = jnp.arange(4.0), jnp.arange(4.0) + 1.0
    registry = KeptValues()
    first = shared_prologue(registry, Split(lambda x, y: [x @ y]), [a, b])
    assert shared_prologue(registry, Split(lambda x, y: [x @ y]), [a, b]).group is first.group
    assert shared_prologue(registry, Split(lambda x, y: [x @ y * 2.0]), [a, b]).group is not first.group
    assert (
        shared_prologue(registry, Split(lambda x, y: [x @ y]), [a, b.astype(jnp.bfloat16)]).group
        is not first.group
    )
    with_c1 = shared_prologue(registry, Split(lambda x, y: [x @ y + c1]), [a, b])
    assert shared_prologue(registry, Split(lambda x, y: [x @ y + c1]), [a, b]).group is with_c1.group
    assert shared_prologue(registry, Split(lambda x, y: [x @ y + c2]), [a, b]).group is not with_c1.group
    # inside a jit of its own (as a control-flow body's constants are): the same
    in_jit = shared_prologue(registry, Split(lambda x, y: [jax.jit(lambda z: z + c1)(x @ y)]), [a, b])
    assert (
        shared_prologue(registry, Split(lambda x, y: [jax.jit(lambda z: z + c2)(x @ y)]), [a, b])
        is not in_jit
    )
    broken = shared_prologue(registry, Split(lambda x, y: [x @ y], slow=(0, 5)), [a, b])
    assert all(broken.group is not g for _, g in registry.groups.values())  # no key: a group of its own


def test_training_next_to_an_evaluation_hands_both_signatures_off():
    # each step calls the new parameters at two batch sizes (a training batch and an evaluation
    # batch): new on every step, so both signatures go to jax.jit's program; one signature's
    # call made the other look like "the same new arrays twice" before, so the prologue ran on
    # every step and nothing was handed off (a review: 1.15x of jax.jit's time)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    train, evaluate = _x(70, n=4), _x(71, n=9)
    for i in range(HANDOFF_AFTER + 3):
        p = _params(200 + i)
        for x in (train, evaluate):
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    entries = list(opt._cache.values())
    assert len(entries) == 2 and all(e.handed_off for e in entries)
    assert sum(e.call.prologue_runs for e in entries) <= 2


def test_the_handoff_goes_to_the_signature_that_is_called():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, small, big = _params(72), _x(73, n=4), _x(74, n=9)
    for x in (small, small, big, big):  # an evaluation at two sizes, then training at one
        opt(p, x)
    for i in range(HANDOFF_AFTER + 2):
        q = _params(300 + i)
        np.testing.assert_allclose(opt(q, small), f(q, small), rtol=1e-4, atol=1e-5)
    by_rows = {key[1][-1][0][0]: e for key, e in opt._cache.items()}  # x's leaf key: (shape, ...)
    assert by_rows[4].handed_off and not by_rows[9].handed_off
    for _ in range(2):  # the evaluation size still runs its hoisted program on cached values
        np.testing.assert_allclose(opt(p, big), f(p, big), rtol=1e-4, atol=1e-5)
    assert by_rows[9].call.direct_runs == 0


def test_clear_cache_and_dropping_the_function_free_the_merged_weights():
    # the parameters stay alive (the caller holds them); the values computed from them must not
    # (their finalizers held the cache, values included, for as long as the parameters lived)
    p, x = _params(75), _x(76)
    for drop in ("clear_cache", "del"):
        opt = jaxrw.optimize(f, hoist_argnums=0)
        opt(p, x)
        opt(p, x)
        (entry,) = opt._cache.values()
        kept = [weakref.ref(v) for v in entry.call.values]
        del entry
        if drop == "clear_cache":
            opt.clear_cache()
        else:
            del opt
        gc.collect()
        assert all(r() is None for r in kept), drop
    np.testing.assert_allclose(jaxrw.optimize(f, hoist_argnums=0)(p, x), f(p, x), rtol=1e-4, atol=1e-5)


def test_new_parameters_at_new_shapes_on_every_call_build_nothing_more():
    # a growing sequence with new parameters on each call: jax.jit's program runs the calls
    # whose shapes have no signature yet (building one per call cost 31 optimizations, a review)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    for n in range(2, 12):
        p, x = _params(400 + n), _x(500 + n, n=n)
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    assert len(opt._cache) <= 2


def test_verify_checks_every_call_with_new_parameters():
    # verify=True compares every concrete call with jax.jit's: no call is handed to jax.jit's
    # program instead (the policy does not apply under verify)
    opt = jaxrw.optimize(f, hoist_argnums=0, verify=True)
    x = _x(77)
    for i in range(HANDOFF_AFTER + 2):
        p = _params(600 + i)
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert not entry.handed_off and entry.call.direct_runs == 0
    assert entry.call.prologue_runs == HANDOFF_AFTER + 2


def test_many_batch_sizes_in_turn_skip_the_full_call_path(monkeypatch):
    # one parameter set at six batch sizes in turn (bucketed decode lengths): every call finds its
    # own signature by the shapes of its other arguments (hoist.HotStructure), with no signature
    # key, no run_proven and no compilation (a review of a list of the last four: five sizes in
    # turn always missed, 20% slower than remembering one)
    from jaxrw import hoist
    from tests.test_hoist_two_sets import refuse

    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, xs = _params(60), [_x(61 + n, n=n) for n in range(2, 8)]
    for _ in range(2):
        for x in xs:
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)

    monkeypatch.setattr(hoist, "run_proven", refuse)
    compiled = compiled_during(
        lambda: [np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5) for x in xs * 2]
    )
    assert not [m for m in compiled if "main" in m or "body" in m], compiled
    assert sum(e.call.prologue_runs for e in opt._cache.values()) == 1  # one program, shared


def test_parameters_made_anew_for_each_call_are_new_though_their_ids_recur():
    # arrays made for each call and dead after it hand their ids on to the next call's (CPython
    # reuses the memory): at two batch sizes each signature saw "the same arrays twice in a row"
    # and ran the prologue on most calls (18 of 20 each), never handing off to jax.jit's program
    opt = jaxrw.optimize(f, hoist_argnums=0)
    base = _params(500)
    recurring = set()
    for i in range(72):  # (the second size is built once the first is handed off, then hands off)
        p = {k: v * 1.0 for k, v in base.items()}
        recurring.add(tuple(map(id, jax.tree.leaves(p))))
        x = _x(501 + i, n=4 + 4 * (i % 2))
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
        del p
    calls = [e.call for e in opt._cache.values()]
    assert len(calls) == 2
    assert sum(c.prologue_runs for c in calls) <= 2  # the first calls' only
    assert all(e.handed_off for e in opt._cache.values())
    if len(recurring) >= 36:  # ids not recycled here: the test checked nothing new
        pytest.skip("this interpreter gave new ids to each call's arrays")


def test_models_of_six_shapes_in_turn_are_served_from_their_slots(monkeypatch):
    # the structure lookup kept one signature per shape of the other arguments: two of three
    # parameter shapes called with the same data took the full call path on every call
    # (1.54x of jax.jit's time on this CPU, bench/hoist_signatures_cpu.py shapes_in_turn); and
    # past four shapes in turn (the window of calls at unbuilt shapes) some were never built
    from tests.test_hoist_two_sets import _no_full_path

    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets = [_params(510 + k, r=8 * (k + 1)) for k in range(6)]
    x = _x(513)
    for _ in range(3):
        for p in sets:
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    _no_full_path(monkeypatch, opt)
    for i in range(3):
        for p in sets:
            np.testing.assert_allclose(opt(p, _x(514 + i)), f(p, _x(514 + i)), rtol=1e-4, atol=1e-5)
    # the same arrays in new containers: found by their ids, as well
    for p in sets:
        np.testing.assert_allclose(opt(dict(p), x), f(p, x), rtol=1e-4, atol=1e-5)

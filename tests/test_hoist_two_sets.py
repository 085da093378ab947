"""Fixed parameter sets called in turn on one hoisted signature (two checkpoints, a model and its
averaged weights at evaluation, ensemble members): a set that comes back after jax.jit's program
ran for it gets prologue values of its own (`HoistedCall.spares`) while the values fit
max_hoist_bytes that many times (at most MAX_SETS), and all are served by the quick path; a set
more than there is room for never makes the prologue run on every call, with one signature or
several."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

import jaxrw
from jaxrw import hoist
from jaxrw.prologue import EVICT_AFTER, MAX_SETS, HoistedCall
from tests.test_hoist import _call, _params, _x, f
from tests.test_hoist_call_class import _served


def _check(opt, p, x):
    np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)


def _in_turn(opt, seq, rounds: int, x) -> None:
    """`rounds` rounds of calls on the parameter sets `seq`, in order, each checked."""
    for _ in range(rounds):
        for p in seq:
            _check(opt, p, x)


def _room_for(sets: int) -> int:
    """max_hoist_bytes that keeps the values of `sets` parameter sets of `f`, not one more."""
    probe = jaxrw.optimize(f, hoist_argnums=0)
    probe(_params(299), _x(299))
    return (sets + 1) * _call(probe).nbytes - 1


def refuse(*args, **kwargs):
    """Stands in for a step of the full call path that must not run."""
    raise AssertionError("the full call path ran")


def _no_full_path(monkeypatch, opt):
    """From here on, a call that is not served from a slot's values fails the test."""
    monkeypatch.setattr(HoistedCall, "values_for", refuse)
    monkeypatch.setattr(HoistedCall, "wants_direct", refuse)
    monkeypatch.setattr(hoist, "run_direct", refuse)


def test_two_sets_in_turn_each_run_on_values_of_their_own(monkeypatch):
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b = _params(300), _params(301)
    for i in range(3):
        for p in (a, b):
            _check(opt, p, _x(302 + i))
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs) == (2, 1)  # b ran jax.jit's program once
    assert call.spares and call.spares[0].ids == tuple(map(id, call.pick_slow(jax.tree.leaves(b))))
    _no_full_path(monkeypatch, opt)
    for i in range(4):  # both from the quick path's one frame, each on its own values
        for p in (a, b):
            _check(opt, p, _x(310 + i))
            assert _served(opt)


def test_the_second_set_in_new_containers_is_still_recognized(monkeypatch):
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x = _params(320), _params(321), _x(322)
    for _ in range(2):
        for p in (a, b):
            _check(opt, p, x)
    _no_full_path(monkeypatch, opt)
    for _ in range(2):  # the same arrays in new dicts: flattened, then found in the second slot
        for p in (a, b):
            _check(opt, dict(p), x)


def test_parameters_after_the_data_use_the_general_quick_path(monkeypatch):
    def g(x, params):
        return f(params, x)

    opt = jaxrw.optimize(g, hoist_argnums=1)
    a, b, x = _params(330), _params(331), _x(332)
    for _ in range(3):
        for p in (a, b):
            np.testing.assert_allclose(opt(x, p), f(p, x), rtol=1e-4, atol=1e-5)
    assert _call(opt).prologue_runs == 2 and opt._hot_path.same_lead is None
    _no_full_path(monkeypatch, opt)
    for p in (a, b, a, b):
        np.testing.assert_allclose(opt(x, p), f(p, x), rtol=1e-4, atol=1e-5)


def test_without_room_for_two_sets_the_second_runs_jax_jit():
    a, b, x = _params(340), _params(341), _x(342)
    probe = jaxrw.optimize(f, hoist_argnums=0)
    probe(a, x)
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=_room_for(1))
    for _ in range(3):
        for p in (a, b):
            _check(opt, p, x)
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs, call.spares) == (1, 3, [])
    assert f"four times that for {MAX_SETS} parameter sets" in repr(probe.report(a, x))
    assert "that for" not in repr(opt.report(a, x))
    two = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=_room_for(2))
    assert "twice that for 2 parameter sets" in repr(two.report(a, x))


def test_a_set_coming_back_replaces_the_one_used_less_recently():
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=_room_for(2))
    a, b, c, x = _params(350), _params(351), _params(352), _x(353)
    for p in (a, b, a, b):  # a in the first slot, b in the second
        _check(opt, p, x)
    call = _call(opt)
    assert call.prologue_runs == 2
    for p in (c, b, c, b, c, b):  # a unused now: c takes its slot (c ran directly twice since a
        _check(opt, p, x)  # was last used), b keeps its own
    slow = lambda p: tuple(map(id, call.pick_slow(jax.tree.leaves(p))))  # noqa: E731
    assert (call.prologue_runs, call.ids, call.spares[0].ids) == (3, slow(c), slow(b))
    runs = call.prologue_runs
    for p in (c, b) * 3:
        _check(opt, p, x)
    assert call.prologue_runs == runs


@pytest.mark.parametrize("n", [3, MAX_SETS])
def test_sets_in_turn_each_run_on_values_of_their_own_while_they_fit(monkeypatch, n):
    # ensemble members or checkpoints called in a loop: each comes back after jax.jit's program
    # ran for it once, and takes a slot of its own (before, only the last set run directly
    # counted as coming back: the third and fourth of a rotation ran jax.jit's program behind
    # the hoisted call's Python on every call, 1.29x of jax.jit's time on this project's CPU)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = [_params(360 + i) for i in range(n)], _x(359)
    _in_turn(opt, sets, 2, x)
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs, len(call.spares)) == (n, n - 1, n - 1)
    _no_full_path(monkeypatch, opt)
    for i in range(3):
        for p in sets:
            _check(opt, p, x + i)
            assert _served(opt)


def test_more_sets_in_turn_than_slots_never_run_the_prologue_per_call():
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=_room_for(2))
    sets, x = [_params(365 + i) for i in range(3)], _x(368)
    for _ in range(5):
        for p in sets:
            _check(opt, p, x)
    call = _call(opt)
    # two sets hoisted; the third runs jax.jit's program, and takes no slot from the others
    assert (call.prologue_runs, call.direct_runs) == (2, 2 + 4)  # the third: once a round after the first
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets = [_params(370 + i) for i in range(MAX_SETS + 1)]
    for _ in range(5):
        for p in sets:
            _check(opt, p, x)
    call = _call(opt)
    # every slot filled in the second round by the first four; the fifth runs jax.jit's program
    # once a round and takes no slot: each is used every round (before the thirty-fifth session
    # it took one in the second round, and with six sets or more only one set stayed kept)
    assert (call.prologue_runs, call.direct_runs) == (MAX_SETS, MAX_SETS + 4)


def test_new_parameters_twice_in_a_row_still_replace_the_first_slot():
    # a training loop that evaluates its new parameters twice: they replace the cached set, as
    # before, and take no second slot
    opt = jaxrw.optimize(f, hoist_argnums=0)
    x = _x(371)
    for i in range(4):
        p = _params(372 + i)
        _check(opt, p, x)
        _check(opt, p, x + 1)
    call = _call(opt)
    assert call.prologue_runs == 4 and call.spares == []


def test_the_second_slot_dies_with_its_arrays_and_clear_cache_drops_it():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x = _params(380), _params(381), _x(382)
    for p in (a, b, a, b):
        _check(opt, p, x)
    call = _call(opt)
    assert call.spares[0].values is not None
    del b, p
    gc.collect()
    assert call.spares[0].values is None and call.spares[0].ids is None
    for i in range(3):  # new arrays (their ids may be the dead ones'): never the old values
        c = _params(383 + i)
        for p in (a, c, a, c):
            _check(opt, p, x)
    assert call.spares[0].values is not None
    opt.clear_cache()
    assert call.spares[0].values is None and call.values is None
    for p in (a, c):
        _check(opt, p, x)


@pytest.mark.parametrize("verify", [False, True])
def test_gradients_and_verify_with_two_sets(verify):
    opt = jaxrw.optimize(f, hoist_argnums=0, verify=verify)
    a, b, x = _params(390), _params(391), _x(392)
    loss = lambda p: opt(p, x).sum()  # noqa: E731
    for _ in range(2):
        for p in (a, b):
            _check(opt, p, x)
            want = jax.grad(lambda q: f(q, x).sum())(p)
            got = jax.grad(loss)(p)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_single_use_sets_at_recycled_ids_do_not_count_as_coming_back():
    # a new set per step, each called once between calls of a kept set and then dropped: a new
    # set often takes the dead one's ids, which must not look like a set coming back (found by a
    # review: the prologue ran for 11 of 12 single-use sets and the streak never built up)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, x = _params(400), _x(401)
    for _ in range(2):
        _check(opt, a, x)
    for i in range(12):
        p = jax.tree.map(lambda w, i=i: w + i, a)
        _check(opt, p, x)
        _check(opt, a, x)
        del p
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs) == (1, 12)
    # the same, whether or not the allocator recycled ids above: a set at the ids of a dead one
    p = jax.tree.map(lambda w: w * 3.0, a)
    _check(opt, p, x)
    _check(opt, a, x)
    dead = tuple(map(id, call.pick_slow(jax.tree.leaves(p))))
    del p
    gc.collect()
    fresh = call.pick_slow(jax.tree.leaves(jax.tree.map(lambda w: w * 4.0, a)))
    assert call.wants_direct(dead, fresh) and call.into is None


def test_a_third_set_joining_two_kept_ones_runs_jax_jit():
    # both slots in use by sets called lately: a third set in the rotation replaces neither
    # (found by a review: a prologue run every fourth call, for good)
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=_room_for(2))
    a, b, c, x = _params(410), _params(411), _params(412), _x(413)
    for p in (a, b, a, b):
        _check(opt, p, x)
    call = _call(opt)
    runs, direct = call.prologue_runs, call.direct_runs
    for _ in range(10):
        for p in (a, b, c):
            _check(opt, p, x)
    assert (call.prologue_runs - runs, call.direct_runs - direct) == (0, 10)


# -- with several signatures (batch sizes): found by a second review ------------------------------


def _fills(opt) -> int:
    """Times values were put in any slot of any signature (a prologue run or another's values)."""
    calls = [e.call for e in opt._cache.values() if isinstance(e.call, HoistedCall)]
    return sum(c.cache.fills + sum(s.fills for s in c.spares) for c in calls)


def test_sets_at_their_own_batch_sizes_in_turn_do_not_rebuild_the_quick_path(monkeypatch):
    # set a at batch 4 and set b at batch 8 in turn: each signature's quick path took the
    # instance's over on every call, a new class each time (13x jax.jit's time in the review)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x4, x8 = _params(420), _params(421), _x(422, n=4), _x(423, n=8)
    for _ in range(3):
        _check(opt, a, x4)
        _check(opt, b, x8)
    switches = []
    original = type(opt)._set_hot_path
    monkeypatch.setattr(
        type(opt), "_set_hot_path", lambda self, *a, **k: switches.append(1) or original(self, *a, **k)
    )
    runs = _runs(opt)
    for _ in range(5):
        _check(opt, a, x4)
        _check(opt, b, x8)
    assert switches == [] and _runs(opt) == runs


def test_two_sets_at_two_batch_sizes_settle_in_both_signatures():
    # each set at both sizes: the second signature took the other one's values into its first
    # slot on every call (no prologue run, but the full path each time); now it shares them
    # into its second slot once
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x4, x8 = _params(430), _params(431), _x(432, n=4), _x(433, n=8)
    for _ in range(3):
        for p, x in ((a, x4), (b, x4), (a, x8), (b, x8)):
            _check(opt, p, x)
    fills, runs = _fills(opt), _runs(opt)
    for _ in range(5):
        for p, x in ((a, x4), (b, x4), (a, x8), (b, x8)):
            _check(opt, p, x)
    assert (_fills(opt), _runs(opt)) == (fills, runs) and runs == 2


@pytest.mark.parametrize("rotation", ["CABCBC", "CCABCB", "ABACBC"])
def test_uneven_rotations_of_three_sets_settle(rotation):
    # two of three sets kept; a set that comes back replaces a kept one at most once per
    # EVICT_AFTER direct runs (a rotation C, A, B, C, B, C reran the prologue twice every six calls)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = {k: _params(440 + i) for i, k in enumerate("ABC")}, _x(443)
    for _ in range(3):
        for k in rotation:
            _check(opt, sets[k], x)
    runs = _runs(opt)
    for _ in range(12):
        for k in rotation:
            _check(opt, sets[k], x)
    assert _runs(opt) - runs <= 2


def test_new_sets_at_a_shape_with_no_signature_leave_the_signature_state_alone():
    # calls at batch 8 (no signature) asked the batch-4 signature's policy and moved its record
    # of the previous call: a, b at 8, b at 4, a at 8 ran the prologue every other call
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x4, x8 = {k: _params(450 + i) for i, k in enumerate("AB")}, _x(452, n=4), _x(453, n=8)
    pattern = [("A", x4), ("B", x8), ("B", x4), ("A", x8)]
    for _ in range(2):
        for k, x in pattern:
            _check(opt, sets[k], x)
    runs = _runs(opt)
    for _ in range(8):
        for k, x in pattern:
            _check(opt, sets[k], x)
    assert _runs(opt) - runs <= 1


def _runs(opt) -> int:
    return sum(e.call.prologue_runs for e in opt._cache.values() if isinstance(e.call, HoistedCall))


def test_a_set_reloaded_into_the_first_slot_is_kept_again():
    # the first slot's arrays die (a checkpoint reloaded): the reloaded set takes that slot once
    # it comes back (found by a review: the first slot stayed empty and the set ran jax.jit's
    # program on every call, as did every set reloaded after it)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = [_params(420 + i) for i in range(3)], _x(424)
    for _ in range(2):
        for p in sets:
            _check(opt, p, x)
    call = _call(opt)
    first = call.ids
    for k in range(3):
        sets[k] = jax.tree.map(lambda w: w * 1.5, sets[k])
        gc.collect()
        direct = call.direct_runs
        for _ in range(4):
            for p in sets:
                _check(opt, p, x)
        assert call.direct_runs - direct == 1  # once, then back in the slot that was freed
        assert all(s.values is not None for s in [call.cache, *call.spares])
    assert call.ids != first


def test_a_full_slot_is_taken_from_a_later_set_not_the_one_cached_first():
    # A called half the time, B to E once a round, four slots: E replaces a later slot, never A's
    # (found by a review: A's slot went to E, and A took it back, two prologue runs a cycle)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = {k: _params(430 + i) for i, k in enumerate("ABCDE")}, _x(436)
    for _ in range(20):
        for k in "AAAABCDE":
            _check(opt, sets[k], x)
    call = _call(opt)
    a = tuple(map(id, call.pick_slow(jax.tree.leaves(sets["A"]))))
    assert call.ids == a and call.cache.runs == 1  # A kept in the first slot from its first call
    # E and the set it displaced take turns in a later slot, at most once per EVICT_AFTER direct runs
    assert call.prologue_runs - MAX_SETS <= call.direct_runs // EVICT_AFTER + 1


@pytest.mark.parametrize("n", [2, 3])
def test_sets_at_two_batch_sizes_in_turn_skip_the_full_call_path(monkeypatch, n):
    # each set at both sizes, in turn: every call is served from a slot of its own signature
    # without the signature key and run_proven (the structure lookup remembered the last
    # signature only, so every call took the full path: 4x jax.jit's time for a 10 µs function
    # with two sets, 3.3x with five, on this project's CPU), and no main program compiles twice
    from jaxrw import hoist
    from tests.compiles import compiled_during

    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, sizes = [_params(440 + i) for i in range(n)], (_x(445, n=4), _x(446, n=8))
    for _ in range(2):
        for p in sets:
            for x in sizes:
                _check(opt, p, x)
    runs = _runs(opt)

    monkeypatch.setattr(hoist, "run_proven", refuse)
    monkeypatch.setattr(type(opt), "_build", refuse)
    compiled = compiled_during(lambda: [_check(opt, p, x + i) for i in range(3) for p in sets for x in sizes])
    assert _runs(opt) == runs and not [m for m in compiled if "main" in m or "body" in m]


@pytest.mark.parametrize("n", [6, 8])
def test_more_sets_in_turn_than_slots_keep_every_slot(n):
    # six sets or more in turn kept one: a set came back only if it was one of the last four
    # run directly, and a full slot went to a set coming back though every slot was used each
    # round (1.35-1.45x of jax.jit's time for six sets of 64 leaves on this CPU; now 0.97-1.19x)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = [_params(540 + i) for i in range(n)], _x(539)
    _in_turn(opt, sets, 10, x)
    call = _call(opt)
    kept = [s for s in call.slots if s.values is not None]
    assert len(kept) == MAX_SETS and call.prologue_runs == MAX_SETS
    assert call.direct_runs == (n - 1) + 9 * (n - MAX_SETS)  # the first round, then those left out


def test_a_new_group_of_sets_takes_the_slots_of_one_no_longer_called():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    old, new, x = [_params(560 + i) for i in range(4)], [_params(570 + i) for i in range(4)], _x(569)
    for _ in range(5):
        for p in old:
            _check(opt, p, x)
    call = _call(opt)
    for _ in range(6 * EVICT_AFTER):
        for p in new:
            _check(opt, p, x)
    slow = lambda p: tuple(map(id, call.pick_slow(jax.tree.leaves(p))))  # noqa: E731
    assert {s.ids for s in call.slots} == {slow(p) for p in new}
    direct = call.direct_runs
    for p in new:  # all four served from their slots now
        _check(opt, p, x)
    assert call.direct_runs == direct


def test_a_set_called_more_often_than_a_kept_one_takes_its_slot():
    # E is half of all calls, A to D once a round each: with slots taken only from sets unused
    # for EVICT_AFTER direct runs, E ran jax.jit's program on every call (a review)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = {k: _params(580 + i) for i, k in enumerate("ABCDE")}, _x(579)
    _in_turn(opt, [sets[k] for k in "ABCD"], 2, x)
    _in_turn(opt, [sets[k] for k in "EAEBECED"], 10, x)
    call = _call(opt)
    direct = call.direct_runs
    _in_turn(opt, [sets[k] for k in "EAEBECED"], 4, x)
    assert call.direct_runs - direct <= 4  # one set left out, once a round; E kept
    assert call.prologue_runs <= MAX_SETS + 2


def test_five_sets_each_called_twice_in_turn_do_not_rerun_the_prologue():
    # the second call in a row of a set with no slot took the first slot from a kept set, and
    # that set took it back on its own second call: prologue runs every round (a review)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets, x = {k: _params(590 + i) for i, k in enumerate("ABCDE")}, _x(589)
    _in_turn(opt, [sets[k] for k in "ABCDEEDCBA"], 5, x)
    call = _call(opt)
    runs = call.prologue_runs
    _in_turn(opt, [sets[k] for k in "ABCDEEDCBA"], 10, x)
    assert call.prologue_runs == runs


def test_a_python_scalar_among_the_parameters_keeps_the_slots_in_use_stamped():
    # the quick path's flattened check stamped the set by the ids of every hoisted leaf, which
    # match no slot where one is a Python float: slots looked unused and were given up
    def g(params, x):
        return f(params, x) * params["s"]

    opt = jaxrw.optimize(g, hoist_argnums=0)
    sets, x = [{**_params(600 + i), "s": 0.5} for i in range(6)], _x(599)
    for _ in range(12):
        for p in sets:
            np.testing.assert_allclose(opt(p, x), g(p, x), rtol=1e-4, atol=1e-5)
    assert _call(opt).prologue_runs == MAX_SETS

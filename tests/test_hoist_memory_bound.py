"""max_hoist_bytes bounds every prologue value an optimized function keeps at once, over all its
signatures (`prologue.KeptValues`), not only each signature's own slots: parameters at two shapes
(two models, or a model and its pruned copy) do not keep twice the bound. A set that would pass it
runs jax.jit's program, said once, until kept values are freed (their arrays die, clear_cache)."""

from __future__ import annotations

import contextlib
import gc
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.prologue import HoistedCall
from tests.test_hoist import _params, _x, f

ONE_SET = 64 * 64 * 4  # f's prologue value: the (64, 64) float32 product of the two weights


def _check(opt, p, x):
    np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def _unsaid():
    """No refusal is said inside (an "error" filter would not do: jaxrw's fallback catches it)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        yield
    assert not [w for w in said if "max_hoist_bytes" in str(w.message)]


def _calls(opt) -> list[HoistedCall]:
    return [e.call for e in opt._cache.values() if isinstance(e.call, HoistedCall)]


def _by_shape(opt, p) -> HoistedCall:
    """The hoisted signature built for parameters shaped as `p`."""
    shape = str(p["A"].shape)
    found = [e.call for k, e in opt._cache.items() if isinstance(e.call, HoistedCall) and shape in str(k)]
    assert len(found) == 1, found
    return found[0]


def _second_refused(seed: int, calls: int, **opts):
    """An instance with room for one set: `a` kept (two calls), then `b`, at other shapes, called
    `calls` times and refused (said); returns (opt, a, b, x)."""
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=ONE_SET, **opts)
    a, b, x = _params(seed), _params(seed + 1, r=32), _x(seed + 2)
    for _ in range(2):
        _check(opt, a, x)
    with pytest.warns(UserWarning, match="max_hoist_bytes"):
        for _ in range(calls):
            _check(opt, b, x)
    return opt, a, b, x


def test_parameters_at_a_second_shape_are_not_kept_past_the_bound():
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=ONE_SET)  # room for one set in all
    a, b, x = _params(400), _params(401, r=32), _x(402)  # two prologue programs, values of one size
    for _ in range(2):
        _check(opt, a, x)
    first = _by_shape(opt, a)
    assert first.values is not None and first.prologue_runs == 1
    with pytest.warns(UserWarning, match="max_hoist_bytes") as said:
        for i in range(4):
            _check(opt, b, _x(403 + i))
    assert len([w for w in said if "max_hoist_bytes" in str(w.message)]) == 1  # said once
    second = _by_shape(opt, b)
    assert second.values is None and second.prologue_runs <= 1  # its first call's, not kept
    assert opt._prologues.held() <= ONE_SET
    with _unsaid():  # not said again
        _check(opt, b, x)
        _check(opt, a, x)  # the first set is still kept and served
    assert first.prologue_runs == 1 and first.values is not None


def test_values_freed_when_their_arrays_die_make_room():
    opt, a, b, x = _second_refused(410, calls=3)
    second = _by_shape(opt, b)
    assert second.values is None
    del a
    gc.collect()  # the first set's arrays die: its values go, and with them the bytes held
    assert opt._prologues.held() == 0
    for _ in range(2):
        _check(opt, b, x)
    assert second.values is not None and opt._prologues.held() == ONE_SET


def test_values_shared_by_two_batch_sizes_count_once():
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=ONE_SET)
    p = _params(420)
    with _unsaid():  # nothing passes the bound: one set, held by both
        for _ in range(3):
            for n in (4, 8):
                _check(opt, p, _x(421, n=n))
    calls = _calls(opt)
    assert len(calls) == 2 and all(c.values is not None for c in calls)
    assert calls[0].values is calls[1].values
    assert sum(c.prologue_runs for c in calls) == 1
    assert opt._prologues.held() == ONE_SET


def test_clear_cache_drops_every_kept_value():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x = _params(430), _params(431, r=32), _x(432)
    for _ in range(2):
        for p in (a, b):
            _check(opt, p, x)
    assert opt._prologues.held() == 2 * ONE_SET  # the default bound holds both
    opt.clear_cache()
    assert opt._prologues.held() == 0
    _check(opt, a, x)


def test_a_set_in_turn_gets_no_slot_past_the_bound():
    # room for two sets in one signature (Hoisted.fit), but a signature at other shapes holds one:
    # a second set called in turn stays on jax.jit's program rather than pass the bound
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=2 * ONE_SET)
    a, b, c, x = _params(440), _params(441), _params(442, r=32), _x(443)
    for _ in range(2):
        _check(opt, c, x)
    with pytest.warns(UserWarning, match="max_hoist_bytes"):
        for i in range(4):
            for p in (a, b):
                _check(opt, p, _x(444 + i))
    call = _by_shape(opt, a)
    assert call.sets == 2 and not any(s.values is not None for s in call.spares)
    assert opt._prologues.held() == 2 * ONE_SET


def test_a_refused_set_reused_is_hoisted_once_room_is_freed():
    # refusals counted toward the handoff: a set reused while refused was handed to jax.jit's
    # program for good after 16 calls, so freeing kept values never brought hoisting back
    opt, a, b, x = _second_refused(450, calls=20)
    assert not any(e.handed_off for e in opt._cache.values())
    del a
    gc.collect()
    for _ in range(2):
        _check(opt, b, x)
    assert _by_shape(opt, b).values is not None


def test_parameters_of_two_shapes_in_turn_are_each_decided_by_their_own_signature(monkeypatch):
    # one signature's quick path asked its own policy about the other shape's arrays (the data
    # the same): "a set come back" wanted a spare slot there, a second copy of values its own
    # signature held, which the bound refused, and each call of it ran jax.jit's program
    from jaxrw import hoist

    direct: list = []
    real = hoist.run_direct
    monkeypatch.setattr(hoist, "run_direct", lambda o, e, a, k: direct.append(a[0]) or real(o, e, a, k))
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=2 * ONE_SET)
    a, b, x = _params(460), _params(461, r=32), _x(462)
    with _unsaid():  # both fit: nothing is refused
        for _ in range(20):
            for p in (a, b):
                _check(opt, p, x)
    assert sum(p is a for p in direct) == 0 and sum(p is b for p in direct) <= 1
    assert opt._prologues.held() == 2 * ONE_SET


def test_three_shapes_in_turn_each_get_a_signature():
    # calls at shapes not built yet were sent to jax.jit's program unless the previous such call
    # had the same arrays: two such shapes in turn were never built
    opt = jaxrw.optimize(f, hoist_argnums=0)
    sets = [(_params(470), _x(471)), (_params(472, r=32), _x(471)), (_params(473, d=32), _x(474, d=32))]
    for _ in range(10):
        for p, x in sets:
            _check(opt, p, x)
    calls = _calls(opt)
    assert len(calls) == 3 and all(c.values is not None for c in calls)
    assert sum(c.direct_runs for c in calls) <= 4


def test_values_another_signature_holds_are_no_new_bytes_at_a_first_call():
    # a first call at a new batch size counted values it would share as new bytes: a false
    # refusal, said instead of a real one later
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=ONE_SET)
    p, x = _params(480), _x(481)
    for _ in range(2):
        _check(opt, p, x)
    for i in range(20):  # a training loop at that size: handed to jax.jit's program
        _check(opt, _params(500 + i), x)
    with _unsaid():
        for _ in range(3):  # (the first call runs in the handed-off jit; the second builds)
            _check(opt, p, _x(482, n=8))
    b = _params(483, r=32)
    with pytest.warns(UserWarning, match="max_hoist_bytes"):  # a real refusal is said
        for _ in range(2):
            _check(opt, b, x)


def test_verify_runs_a_refused_set_on_jax_jit_without_its_prologue():
    opt, _a, b, _x2 = _second_refused(490, calls=6, verify=True)
    assert _by_shape(opt, b).prologue_runs <= 1


def test_a_training_loop_whose_first_set_was_refused_is_handed_off():
    # refusals did not count toward the handoff: a signature whose first set was refused read
    # every later call as refused, new arrays or not, and ran jax.jit's program behind jaxrw's
    # Python for good (40 µs a call against jax.jit's 8 µs on this CPU, from a review)
    opt, _a, b, x = _second_refused(520, calls=2)
    for _ in range(20):  # b trained: new arrays on every call
        b = {k: v * 0.999 for k, v in b.items()}
        _check(opt, b, x)
    assert _by_shape(opt, b).direct_runs >= 16
    assert any(e.handed_off and e.call is _by_shape(opt, b) for e in opt._cache.values())


def test_report_of_a_refused_set_says_its_calls_run_jax_jit():
    # report() read "hoisted ... kept between calls" for arguments whose values the bound
    # refused, while their calls ran jax.jit's program (a helper's static-argument case below)
    opt, a, b, x = _second_refused(530, calls=2)
    with _unsaid():  # a question, not a call: nothing more is said
        refused, kept = opt.report(b, x), opt.report(a, x)
    rows, kept_rows = dict(refused.rows()), dict(kept.rows())
    assert "not kept for these arguments" in rows["hoisted"] and "max_hoist_bytes" in rows["hoisted"]
    assert rows["predicted"].endswith("(not run for these arguments)")
    assert refused.to_dict()["not_kept"] == refused.not_kept
    assert kept.not_kept == "" and "kept between calls" in kept_rows["hoisted"]
    assert _by_shape(opt, b).values is None  # report ran no prologue and kept nothing


def test_report_of_a_second_static_value_past_the_bound_says_so():
    def g(p, x, k):  # the static value is in the hoisted work: a prologue program per value
        return jnp.tanh(x @ ((k * p["A"]) @ p["B"]))

    opt = jaxrw.optimize(g, hoist_argnums=0, static_argnums=2, max_hoist_bytes=ONE_SET)
    p, x = _params(540), _x(541)
    for _ in range(2):
        np.testing.assert_allclose(opt(p, x, 1.0), f(p, x), rtol=1e-4, atol=1e-5)
    with pytest.warns(UserWarning, match="max_hoist_bytes"):
        for _ in range(2):
            np.testing.assert_allclose(opt(p, x, 2.0), g(p, x, 2.0), rtol=1e-4, atol=1e-5)
    assert opt.report(p, x, 1.0).not_kept == ""
    assert "not kept for these arguments" in opt.report(p, x, 2.0).not_kept

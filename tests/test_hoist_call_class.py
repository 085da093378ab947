"""The quickest hoisted call: while one hoisted signature is served from its cache, the instance's
class is one whose `__call__` checks the parameters and runs the main program in one Python frame
(`HotPath.call_class`); every other call goes through `Optimized.__call__` as before."""

from __future__ import annotations

import dataclasses
import gc
import warnings
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.api import Optimized


def _params(seed, d=32):
    rng = np.random.default_rng(seed)
    w = [jnp.asarray(rng.standard_normal((d, d)).astype(np.float32) / 6) for _ in range(3)]
    return {"w": w, "u": [jnp.asarray(rng.standard_normal((d, d)).astype(np.float32) / 6)]}


def _x(seed, n=4, d=32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


def cell(params, x):
    # three products of one input (merged on weights concatenated in the prologue) and a fourth
    h = sum(jnp.tanh(x @ w) for w in params["w"])
    return h @ params["u"][0]


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _served(opt) -> bool:
    """Whether the instance's class is a quick call's (not Optimized itself nor state "jit"'s)."""
    return getattr(type(opt).__dict__.get("__call__"), "__name__", "") == "hot_call"


def _hoisted_opt():
    opt = jaxrw.optimize(cell, hoist_argnums=0)
    p, x = _params(0), _x(1)
    for i in range(2):
        _close(opt(p, x + i), cell(p, x + i))
    return opt, p, x


def test_cached_calls_take_the_class_call_and_match_jax_jit():
    opt, p, x = _hoisted_opt()
    assert _served(opt) and isinstance(opt, Optimized)
    (entry,) = opt._cache.values()
    h = entry.call
    runs = h.prologue_runs
    for i in range(4):
        _close(opt(p, x * i), jax.jit(cell)(p, x * i))
    # a new dict of the very same lists' arrays: the same prologue inputs, nothing recomputed
    _close(opt({"w": list(p["w"]), "u": list(p["u"])}, x), cell(p, x))
    assert h.prologue_runs == runs and h.seen == h.ids


def test_changed_parameters_leave_the_class_call_and_come_back_after_the_prologue():
    opt, p, x = _hoisted_opt()
    (entry,) = opt._cache.values()
    h = entry.call
    p["w"][1] = p["w"][1] * 2.0  # in place: the same dict and list, one new array
    for _ in range(2):  # new arrays twice in a row: the prologue reruns for them
        _close(opt(p, x), cell(p, x))
    assert h.prologue_runs == 2 and _served(opt)
    _close(opt(p, x + 1.0), cell(p, x + 1.0))
    q = {"w": p["w"][:2], "u": p["u"]}  # a shorter list: another signature, built and right
    _close(opt(q, x), cell(q, x))


def test_other_shapes_turn_the_class_call_off():
    opt, p, x = _hoisted_opt()
    big = _x(2, n=9)
    _close(opt(p, big), cell(p, big))  # the quick call's jit meets another shape: off for good
    assert not _served(opt) and opt._hot_path is None and opt._hot_path_off
    for y in (x, big, x):
        _close(opt(p, y), cell(p, y))
    opt.clear_cache()
    assert type(opt) is Optimized and not opt._hot_path_off


def test_traced_calls_go_through_the_full_path():
    opt, p, x = _hoisted_opt()
    # parameters closed over, the input traced: the quick call runs its jit inside this trace
    _close(jax.jit(lambda y: opt(p, y))(x), cell(p, x))
    # the parameters traced (a gradient with respect to them): the prologue is traced through
    loss = lambda q: jnp.sum(opt(q, x) ** 2)  # noqa: E731
    want = jax.grad(lambda q: jnp.sum(cell(q, x) ** 2))(p)
    got = jax.tree_util.tree_leaves(jax.grad(loss)(p))
    for g, w in zip(got, jax.tree_util.tree_leaves(want), strict=True):
        _close(g, w)
    assert _served(opt)  # still serving the cached parameters
    _close(opt(p, x), cell(p, x))


def test_dropped_parameters_are_not_kept_alive_by_the_class_call():
    opt, p, x = _hoisted_opt()
    (entry,) = opt._cache.values()
    refs = [weakref.ref(leaf) for leaf in jax.tree.leaves(p)]
    del p
    gc.collect()
    assert all(r() is None for r in refs) and entry.call.values is None
    p2 = _params(5)
    for _ in range(3):
        _close(opt(p2, x), cell(p2, x))
    assert entry.call.prologue_runs == 2 and _served(opt)


def test_a_copy_made_by_dataclasses_replace_is_a_plain_optimized():
    opt, p, x = _hoisted_opt()
    twin = dataclasses.replace(opt, verify=True)
    assert type(twin) is Optimized
    _close(twin(p, x), cell(p, x))
    assert _served(opt)


def test_a_cached_call_restarts_the_run_of_new_parameters_even_after_they_die():
    # new parameters on a few calls, one call on the cached ones (the class call), then the cached
    # ones dropped: the next new parameters start a run of one, not one more than before
    from jaxrw.hoist import HANDOFF_AFTER

    opt, p, x = _hoisted_opt()
    (entry,) = opt._cache.values()
    h = entry.call
    for i in range(HANDOFF_AFTER - 2):
        q = _params(10 + i)
        _close(opt(q, x), cell(q, x))
    assert h.streak == HANDOFF_AFTER - 2 and _served(opt)
    _close(opt(p, x), cell(p, x))  # served by the class call
    del p, q
    gc.collect()
    assert h.ids is None  # the cached parameters are gone
    q = _params(99)
    _close(opt(q, x), cell(q, x))
    assert h.streak == 1 and not entry.handed_off


def test_a_tracer_among_the_parameters_never_reads_the_cached_values():
    # under an outer jit, parameters that are partly traced (one weight an argument of the trace,
    # the others the cached arrays) run the prologue in the trace on every call: the cache holds
    # the concrete weights' values
    opt, p, x = _hoisted_opt()

    def calls(w):
        q = {"w": [p["w"][0], w, p["w"][2]], "u": p["u"]}
        return jnp.stack([opt(q, x) - cell(q, x) for _ in range(4)])

    np.testing.assert_allclose(jax.jit(calls)(2.0 * p["w"][1]), 0.0, atol=1e-5)
    grad = jax.grad(
        lambda w: jnp.sum(calls(w) ** 2) + jnp.sum(opt({"w": [p["w"][0], w, p["w"][2]], "u": p["u"]}, x))
    )
    want = jax.grad(lambda w: jnp.sum(cell({"w": [p["w"][0], w, p["w"][2]], "u": p["u"]}, x)))
    _close(grad(2.0 * p["w"][1]), want(2.0 * p["w"][1]))
    _close(opt(p, x), cell(p, x))  # the concrete parameters' cache is intact


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="needs the donated array to outlive the call")
def test_a_donated_hoisted_argument_is_read_as_passed_not_through_a_weak_reference():
    # a donated leaf is not cached (no finalizer clears the cache when it dies), so a new array
    # that takes its id after it died must not be mistaken for it (XLA's CPU backend does not
    # use donated buffers, so the array stays valid after each call); the donated argument is no
    # hoisted one at all: each call passes it as given, the others stay cached
    def fn(p, b, x):
        return cell(p, x) + b

    opt = jaxrw.optimize(fn, hoist_argnums=(0, 1), donate_argnums=1)
    p, x = _params(0), _x(1)
    bufs = [np.full(32, i, np.float32) for i in range(200)]
    b = jax.device_put(bufs[0])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Some donated buffers were not usable")
        for _ in range(2):
            _close(opt(p, b, x), fn(p, b, x))
        hot = opt._hot_path
        assert hot is not None and hot.layout.pos == (0,) and hot.same_hoisted is not None
        old = id(b)
        del b
        for i in range(1, len(bufs)):  # a new array at the old one's id, where the allocator allows
            b = jax.device_put(bufs[i])
            if id(b) == old:
                break
        want = fn(p, b, x)
        _close(opt(p, b, x), want)


def test_parameters_captured_by_an_outer_trace_are_traced_through_never_cached():
    # concrete parameters closed over by a jitted step or a scan body: inside that trace the
    # prologue's values are tracers, which a later plain call must not find in the cache
    opt = jaxrw.optimize(cell, hoist_argnums=0)
    p, x = _params(0), _x(1)
    _close(jax.jit(lambda x: opt(p, x))(x), cell(p, x))
    _close(opt(p, x), cell(p, x))
    p2 = jax.tree_util.tree_map(lambda a: a * 0.5, p)
    for _ in range(2):  # new parameters, met first inside an eager scan body
        ys = jax.lax.scan(lambda c, xi: (c, opt(p2, xi)), 0.0, x[None])[1]
        _close(ys[0], cell(p2, x))
    _close(opt(p2, x), cell(p2, x))
    _close(opt(p, x), cell(p, x))


def test_numpy_parameters_changed_in_place_are_never_served_from_the_cache():
    # built on jax arrays, then called with NumPy arrays of the same shapes (one signature key):
    # the values were cached by the NumPy arrays' ids, and an in-place update was not seen
    # (the third call was 22.7 off jax.jit's result)
    p = _params(20)
    x = _x(21)
    f = jaxrw.optimize(cell, hoist_argnums=0)
    _close(f(p, x), jax.jit(cell)(p, x))
    pn = jax.tree.map(np.array, p)
    rng = np.random.default_rng(22)
    for _ in range(4):
        pn["w"][0][...] = rng.standard_normal((32, 32)).astype(np.float32) / 6
        _close(f(pn, x), jax.jit(cell)(pn, x))


def test_verify_with_a_donated_argument():
    # the program donated the buffer and verify's jax.jit run then read it: "Array has been deleted"
    p, x = _params(23), _x(24)
    want = jax.jit(cell)(p, x)
    f = jaxrw.optimize(cell, donate_argnums=1, verify=True)
    _close(f(p, jnp.array(x, copy=True)), want)


def test_dropping_old_parameters_keeps_the_current_values():
    # each prologue run registered a finalizer on its leaves that was never detached: dropping the
    # previous parameters cleared the current ones' cached values, and the prologue ran again
    f = jaxrw.optimize(cell, hoist_argnums=0)
    x = _x(25)
    p1, p2 = _params(26), _params(27)
    f(p1, x)
    f(p2, x)
    f(p2, x)  # the same new arrays twice in a row: the prologue runs and caches them
    runs = next(iter(f._cache.values())).call.prologue_runs
    del p1
    gc.collect()
    _close(f(p2, x), jax.jit(cell)(p2, x))
    assert next(iter(f._cache.values())).call.prologue_runs == runs


class _Cell(NamedTuple):  # parameters as a namedtuple of a list and a list
    w: list
    u: list


def test_namedtuple_parameters_take_the_class_call_and_follow_new_arrays():
    # a namedtuple was no container the identity check knew: every call flattened (1.1x jax.jit's
    # time on this CPU for a 10 µs function, against 0.8x for the same parameters in a dict)
    def g(params, x):
        w, u = params  # a namedtuple or a plain tuple
        return cell({"w": w, "u": u}, x)

    opt = jaxrw.optimize(g, hoist_argnums=0)
    a, b, x = _Cell(**_params(20)), _Cell(**_params(21)), _x(22)
    for p in (a, a, a):
        _close(opt(p, x), g(p, x))
    assert _served(opt)
    (entry,) = opt._cache.values()
    runs = entry.call.prologue_runs
    _close(opt(_Cell(list(a.w), list(a.u)), x), g(a, x))  # new containers, the same arrays
    assert entry.call.prologue_runs == runs
    for p in (b, b, a, _Cell(a.w[:2] + [b.w[2]], a.u)):  # new arrays, and one leaf replaced
        _close(opt(p, x), g(p, x))
    _close(opt(tuple(a), x), g(_Cell(*a), x))  # a plain tuple: another pytree, right all the same

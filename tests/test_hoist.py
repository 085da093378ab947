"""Hoisting parameter-only work out of the hot call (hoist_argnums / hoist_argnames)."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxrw
from jaxrw.hoist import HoistedCall


def _params(seed, d=64, r=64):
    rng = np.random.default_rng(seed)
    return {
        "A": jnp.asarray(rng.standard_normal((d, r)).astype(np.float32) / 8),
        "B": jnp.asarray(rng.standard_normal((r, d)).astype(np.float32) / 8),
    }


def _x(seed, n=4, d=64):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


def f(params, x):
    # the product of the two weights depends on the parameters only: hoistable
    return jnp.tanh(x @ (params["A"] @ params["B"]))


def _call(opt) -> HoistedCall:
    (entry,) = opt._cache.values()
    assert isinstance(entry.call, HoistedCall)
    return entry.call


def test_prologue_runs_once_per_parameter_set():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(0), _x(1)
    for i in range(3):
        np.testing.assert_allclose(opt(p, x + i), f(p, x + i), rtol=1e-4, atol=1e-5)
    call = _call(opt)
    assert call.prologue_runs == 1
    rep = opt.report(p, x)
    assert rep.rewritten and rep.hoisted_bytes == 64 * 64 * 4
    p2 = jax.tree_util.tree_map(lambda a: a * 1.5, p)  # an optimizer step: new arrays
    np.testing.assert_allclose(opt(p2, x), f(p2, x), rtol=1e-4, atol=1e-5)
    assert (call.prologue_runs, call.direct_runs) == (1, 1)  # new arrays, once: jax.jit's program
    np.testing.assert_allclose(opt(p2, x + 1), f(p2, x + 1), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == 2  # the same new arrays again: they are reused, hoist them
    opt(p2, x)
    assert (call.prologue_runs, call.direct_runs) == (2, 1)


def test_parameters_new_on_every_call_run_jax_jit_programs():
    # a training loop: hoisting would concatenate weights on every step, so after the first
    # call jaxrw runs jax.jit's program (never slower than jax.jit) and results stay right
    opt = jaxrw.optimize(f, hoist_argnums=0)
    x = _x(11)
    for step in range(4):
        p = _params(20 + step)
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs) == (1, 3)


def test_hot_call_passes_only_the_leaves_main_reads():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(12), _x(13)
    opt(p, x)
    call = _call(opt)
    assert call.used == (2,)  # x only: A and B reach main through the cached product
    np.testing.assert_allclose(opt(p, x * 2), f(p, x * 2), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == 1


def test_hoist_argnames_and_weak_references():
    def g(x, *, params):
        return f(params, x)

    opt = jaxrw.optimize(g, hoist_argnames="params")
    p, x = _params(2), _x(3)
    np.testing.assert_allclose(opt(x, params=p), f(p, x), rtol=1e-4, atol=1e-5)
    call = _call(opt)
    refs = [weakref.ref(leaf) for leaf in jax.tree.leaves(p)]
    assert call.values is not None and all(f.alive for f in call.cache.finalizers)
    del p
    gc.collect()
    assert all(r() is None for r in refs)  # nothing kept alive that the user dropped
    assert call.values is None  # the cached values died with the arrays they came from
    p3 = _params(4)
    for _ in range(2):  # new arrays run jax.jit's program once, then are hoisted
        np.testing.assert_allclose(opt(x, params=p3), f(p3, x), rtol=1e-4, atol=1e-5)
    assert (call.prologue_runs, call.direct_runs) == (2, 1)


def test_memory_bound_disables_hoisting_and_says_so():
    opt = jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=1024)
    p, x = _params(5), _x(6)
    with pytest.warns(UserWarning, match="not hoisted: 16384 bytes > max_hoist_bytes 1024"):
        out = opt(p, x)
    np.testing.assert_allclose(out, f(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert not isinstance(entry.call, HoistedCall)
    assert "not hoisted" in opt.report(p, x).hoist_note


def test_gradients_through_hoisted_arguments_are_correct():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(7), _x(8)
    opt(p, x)  # populate the cache with concrete values first

    def loss(fn):
        return lambda p, x: jnp.sum(fn(p, x) ** 2)

    g_opt = jax.grad(loss(opt))(p, x)
    g_ref = jax.grad(loss(f))(p, x)
    for k in p:
        np.testing.assert_allclose(g_opt[k], g_ref[k], rtol=1e-3, atol=1e-5)
    # a gradient step gives new arrays; the next call recomputes the prologue once
    p_new = jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, g_opt)
    np.testing.assert_allclose(opt(p_new, x), f(p_new, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jax.jit(opt)(p_new, x), f(p_new, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        jax.vmap(opt, in_axes=(None, 0))(p_new, jnp.stack([x, 2 * x])),
        jax.vmap(f, in_axes=(None, 0))(p_new, jnp.stack([x, 2 * x])),
        rtol=1e-4,
        atol=1e-5,
    )


def test_donated_slow_arguments_are_not_hoisted():
    with pytest.warns(UserWarning, match=r"jaxrw: f: \['params'\] are donated, so not hoisted"):
        opt = jaxrw.optimize(f, hoist_argnums=0, donate_argnums=0)
    p, x = _params(9), _x(10)
    want = f(p, x)
    np.testing.assert_allclose(opt(p, x), want, rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert not isinstance(entry.call, HoistedCall)


def test_without_hoisting_the_product_of_weights_stays_in_the_call():
    opt = jaxrw.optimize(f)
    p, x = _params(11), _x(12)
    np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert not isinstance(entry.call, HoistedCall)


def test_alternating_parameter_sets_are_both_hoisted_once_the_second_comes_back():
    # two parameter sets in turn (say live and averaged weights): the second runs jax.jit's
    # program once; when it comes back it gets prologue values of its own (tests/test_hoist_two_sets.py)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    a, b, x = _params(30), _params(31), _x(32)
    for _ in range(3):
        for p in (a, b):
            np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    call = _call(opt)
    assert (call.prologue_runs, call.direct_runs) == (2, 1)


def test_bind_fixes_the_hoisted_arguments_and_calls_through_one_jit():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(40), _x(41)
    step = opt.bind(p, x)
    call = _call(opt)
    runs = call.prologue_runs
    for i in range(3):
        np.testing.assert_allclose(step(x + i), f(p, x + i), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == runs  # the prologue ran at bind time only
    np.testing.assert_allclose(
        jax.grad(lambda x: step(x).sum())(x), jax.grad(lambda x: f(p, x).sum())(x), rtol=1e-4
    )
    with pytest.raises(jaxrw.InvalidOptionError, match="another structure, shape or dtype"):
        step(_x(42, n=5))
    # what differs is named (a new user's try found only the shape case said so)
    with pytest.raises(
        jaxrw.InvalidOptionError,
        match=r"called with 0 positional argument\(s\) and keywords "
        r"\['x'\] besides the hoisted ones, bound with 1 and \[\]",
    ):
        step(x=x)
    with pytest.raises(jaxrw.InvalidOptionError, match=r"\(another pytree structure\)"):
        step((x,))


def test_bind_with_keyword_hoisting_and_bad_uses():
    def g(x, *, params):
        return f(params, x)

    opt = jaxrw.optimize(g, hoist_argnames="params")
    p, x = _params(43), _x(44)
    np.testing.assert_allclose(opt.bind(x, params=p)(x * 3), f(p, x * 3), rtol=1e-4, atol=1e-5)
    with pytest.raises(jaxrw.InvalidOptionError, match="not given"):
        opt.bind(x)
    with pytest.raises(jaxrw.InvalidOptionError, match="needs hoist_argnums"):
        jaxrw.optimize(f).bind(p, x)


def test_hoisting_with_nothing_to_hoist_keeps_the_fast_call_path():
    # nothing depends on the parameters alone and the guard keeps g: calls go to jax.jit(g) (C++
    # dispatch) like optimize() without hoisting; a hoisting program takes the Python path that
    # checks the parameters' identity
    def g(params, x):
        return jnp.tanh(x @ params["A"]) @ params["B"]

    p, x = _params(0), _x(1)
    plain = jaxrw.optimize(g, hoist_argnums=0)
    for i in range(3):
        np.testing.assert_allclose(plain(p, x + i), g(p, x + i), rtol=1e-4, atol=1e-5)
    (entry,) = plain._cache.values()
    assert not isinstance(entry.call, HoistedCall) and plain._fast_state == "jit"
    hoisting = jaxrw.optimize(f, hoist_argnums=0)
    for i in range(3):
        np.testing.assert_allclose(hoisting(p, x + i), f(p, x + i), rtol=1e-4, atol=1e-5)
    assert _call(hoisting).prologue_runs == 1 and hoisting._fast_state == "off"


def _count_runs(call: HoistedCall) -> list[int]:
    """Counts Python-level runs of the main program (the hot path runs it only when tracing)."""
    runs, run = [0], call.run

    def counted(*a, **kw):
        runs[0] += 1
        return run(*a, **kw)

    call.run = counted
    return runs


def test_cached_calls_take_the_hot_path_through_one_jit():
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(40), _x(41)
    opt.report(p, x)  # built, not yet called
    call = _call(opt)
    runs = _count_runs(call)
    for i in range(6):
        np.testing.assert_allclose(opt(p, x + i), f(p, x + i), rtol=1e-4, atol=1e-5)
    # traced once, by the hot path's jit at the first call, then jax's C++ dispatch: the first
    # call ran the main program through its own jit as well (a second compilation) before
    assert opt._hot_path is not None and runs[0] == 1
    p2 = jax.tree_util.tree_map(lambda a: a * 0.5, p)
    for _ in range(3):  # new arrays twice in a row: the prologue reruns; the hot path follows it
        np.testing.assert_allclose(opt(p2, x), f(p2, x), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == 2 and opt._hot_path is not None
    # the old arrays, alive, keep their slot (p2 took a second one): no jax.jit run for them
    np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    assert call.direct_runs == 1 and len(call.spares) == 1


def test_a_hot_path_failing_at_the_first_call_falls_back_and_is_not_kept(monkeypatch):
    import jaxrw.hoist

    def failing_jit(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(jaxrw.hoist, "without_frame", lambda jitted: (failing_jit, None))
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(45), _x(46)
    with pytest.warns(UserWarning, match="compile stage failed.*injected"):
        out = opt(p, x)
    want = jax.jit(f)(p, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    assert opt._hot_path is None and not opt._hot  # nothing of the failed path serves a call
    for _ in range(2):  # the cached arrays again: jax.jit's program, no error
        np.testing.assert_array_equal(np.asarray(opt(p, x)), np.asarray(want))
    assert opt.report(p, x).fallback


def test_hot_path_with_static_arguments():
    def g(params, x, scale):
        return f(params, x) * scale

    opt = jaxrw.optimize(g, hoist_argnums=0, static_argnums=2)
    p, x = _params(45), _x(46)
    for scale in (2, 2, 3, 2):
        np.testing.assert_allclose(opt(p, x, scale), g(p, x, scale), rtol=1e-4, atol=1e-5)


def test_parameters_new_on_every_call_hand_the_signature_to_jax_jit():
    # a training loop calling the function outside jit: after HANDOFF_AFTER calls in a row with
    # new parameters the signature runs jax.jit's program: jax.jit(f) itself once no other
    # signature needs more (state "jit": a jax.jit of f as the class's __call__, jax's C++
    # dispatch with no Python of jaxrw's); clear_cache() hoists again
    from jaxrw.hoist import HANDOFF_AFTER

    opt = jaxrw.optimize(f, hoist_argnums=0)
    x = _x(50)
    sets = [_params(60 + i) for i in range(HANDOFF_AFTER + 2)]
    for p in sets:
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert entry.handed_off and opt._fast_state == "jit"
    rows = dict(opt.report(sets[-1], x).rows())  # it read "rewritten" with the hoisted bytes kept
    assert (
        rows["result"].startswith("rewritten, then handed off to jax.jit's program") and "hoisted" not in rows
    )
    call = entry.call
    runs = (call.prologue_runs, call.direct_runs)
    for _ in range(3):  # the same arrays again: still jax.jit's program, still right
        np.testing.assert_allclose(opt(sets[0], x), f(sets[0], x), rtol=1e-4, atol=1e-5)
    assert (call.prologue_runs, call.direct_runs) == runs  # no Python of jaxrw's ran
    g = jax.grad(lambda p: opt(p, x).sum())(sets[1])  # transformations trace jax.jit's program
    want = jax.grad(lambda p: f(p, x).sum())(sets[1])
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    opt.clear_cache()
    opt(sets[0], x)
    opt(sets[0], x)
    assert _call(opt).prologue_runs == 1 and not next(iter(opt._cache.values())).handed_off


def test_a_hot_parameter_set_between_new_ones_resets_the_handoff_count():
    from jaxrw.hoist import HANDOFF_AFTER

    opt = jaxrw.optimize(f, hoist_argnums=0)
    x, cached = _x(51), _params(70)
    opt(cached, x)
    for i in range(2 * HANDOFF_AFTER):  # new sets, with the cached one every few calls
        p = cached if i % 4 == 0 else _params(80 + i)
        np.testing.assert_allclose(opt(p, x), f(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert not entry.handed_off and entry.call.streak < HANDOFF_AFTER


def test_the_hot_call_passes_only_what_the_main_program_reads():
    # the hot path leaves out hoisted leaves the main program does not read (A and B: their
    # product is a prologue value); hoisted leaves main reads itself still come from each call:
    # a numpy bias is mutable (not cached by identity) and a later in-place change must show
    def g(x, *, params):
        return jnp.tanh(x @ (params["A"] @ params["B"])) + params["bias"] * params["c"]

    opt = jaxrw.optimize(g, hoist_argnames="params")
    p, x = {**_params(90), "bias": np.ones(64, np.float32), "c": jnp.float32(2.0)}, _x(91)
    for i in range(3):
        np.testing.assert_allclose(opt(x + i, params=p), g(x + i, params=p), rtol=1e-4, atol=1e-5)
    assert opt._hot_path is not None
    layout = opt._hot_path.layout
    assert len(layout.full_index) == 4 and len(layout.passed) == 2  # bias and c, not A and B
    runs = _count_runs(_call(opt))
    p["bias"][:] = 3.0  # the same numpy array, changed in place
    np.testing.assert_allclose(opt(x, params=p), g(x, params=p), rtol=1e-4, atol=1e-5)
    assert runs[0] == 0  # still the hot path's jit, no retrace
    bound = opt.bind(x, params=p)
    np.testing.assert_allclose(bound(x + 1), g(x + 1, params=p), rtol=1e-4, atol=1e-5)


def test_hot_path_with_a_static_argument_before_the_hoisted_one_and_a_donated_input():
    # positions shift twice in the hot call's jit (hoisted arguments left out, values first):
    # statics and donations must still name the right arguments
    def g(x, scale, params):
        return f(params, x) * scale

    opt = jaxrw.optimize(g, static_argnums=1, hoist_argnums=2, donate_argnums=0)
    p = _params(95)
    for i in range(4):
        x = _x(96 + i)
        want = g(x, 2, p)
        np.testing.assert_allclose(opt(x, 2, p), want, rtol=1e-4, atol=1e-5)
    hot = opt._hot_path
    assert hot is not None and hot.layout.shifted((0, 1)) == (2, 3)
    runs = _count_runs(_call(opt))
    x = _x(100)
    want = g(x, 2, p)
    np.testing.assert_allclose(opt(x, 2, p), want, rtol=1e-4, atol=1e-5)
    assert runs[0] == 0 and x.is_deleted()  # the hot call's jit (no retrace) donated x
    x = _x(101)
    np.testing.assert_allclose(opt(x, 3, p), g(_x(101), 3, p), rtol=1e-4, atol=1e-5)  # another static


@st.composite
def _call_layouts(draw):
    """Where the hoisted parameters, a static scale and the activations sit in a call."""
    order = draw(st.permutations(["params", "x", "scale"]))
    by_name = draw(st.booleans())  # the parameters passed as a keyword (hoist_argnames)
    donate_x = draw(st.booleans())
    return order, by_name, donate_x


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_call_layouts())
def test_hot_calls_match_jax_jit_wherever_the_hoisted_arguments_sit(layout):
    order, by_name, donate_x = layout
    positional = [a for a in order if not (by_name and a == "params")]

    def g(*args, **kwargs):
        named = dict(zip(positional, args, strict=True)) | kwargs
        return f(named["params"], named["x"]) * named["scale"]

    opts = {"static_argnums": positional.index("scale")}
    if by_name:
        opts["hoist_argnames"] = "params"
    else:
        opts["hoist_argnums"] = positional.index("params")
    if donate_x:
        opts["donate_argnums"] = positional.index("x")
    opt = jaxrw.optimize(g, **opts)
    p = _params(110)

    def call(fn, x):
        values = {"params": p, "x": x, "scale": 3}
        kw = {"params": p} if by_name else {}
        return fn(*[values[a] for a in positional], **kw)

    for i in range(4):
        want = call(jax.jit(g, static_argnums=opts["static_argnums"]), _x(111 + i))
        np.testing.assert_allclose(call(opt, _x(111 + i)), want, rtol=1e-4, atol=1e-5)
    assert opt._hot_path is not None  # the later calls took the hot path


def test_bound_functions_called_with_too_few_arguments_say_so():
    def g(x, params):
        return f(params, x)

    p, x = _params(120), _x(121)
    for opts in ({"hoist_argnums": 1}, {"hoist_argnums": 1, "max_hoist_bytes": 0}):  # hoisted, or not
        bound = jaxrw.optimize(g, **opts).bind(x, p)
        np.testing.assert_allclose(bound(x), g(x, p), rtol=1e-4, atol=1e-5)
        with pytest.raises(jaxrw.JaxrwError):
            bound()


# -- the hot path's identity check without flattening (hoist.snapshot / hoist.unchanged) -------------


def _leaf(i):
    return jnp.full((2,), float(i), jnp.float32)


def _trees(draw_leaf):
    """Nested dicts (string keys), lists, tuples and None around jax arrays."""
    return st.recursive(
        st.one_of(st.just(None), draw_leaf),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4),
            st.lists(kids, max_size=4).map(tuple),
            st.dictionaries(st.sampled_from("abcde"), kids, max_size=4),
        ),
        max_leaves=12,
    )


def _rebuilt(tree, change):
    """A copy of `tree` with fresh containers; `change(leaf_index, leaf)` picks each leaf."""
    count = iter(range(1 << 30))

    def go(t):
        if isinstance(t, jax.Array):
            return change(next(count), t)
        if isinstance(t, dict):
            return {k: go(v) for k, v in t.items()}
        if isinstance(t, (list, tuple)):
            return type(t)(go(v) for v in t)
        return t

    return go(tree)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_trees(st.integers(0, 9).map(_leaf)), replace=st.integers(-1, 11), seed=st.integers(0, 3))
def test_unchanged_means_flattening_would_give_the_same_leaves(tree, replace, seed):
    from jaxrw.identity import checker, snapshot

    snap = snapshot(tree)
    assert snap is not None  # plain containers of jax arrays are always snapshotted
    unchanged = checker(snap)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    same = _rebuilt(tree, lambda i, x: x)  # new containers, the same arrays: still unchanged
    assert unchanged(same)
    other = _rebuilt(tree, lambda i, x: _leaf(seed) if i == replace else x)  # one array replaced
    now, now_def = jax.tree_util.tree_flatten(other)
    if unchanged(other):
        assert now_def == treedef and all(a is b for a, b in zip(now, leaves, strict=True))
    else:
        assert 0 <= replace < len(leaves)


def test_unchanged_notices_changed_containers_and_refuses_other_nodes():
    from jaxrw.identity import checker, snapshot

    a, b = _leaf(1), _leaf(2)
    unchanged = checker(snapshot({"p": [a, {"q": b}], "r": (a,)}))
    assert unchanged({"p": [a, {"q": b}], "r": (a,)})
    assert not unchanged({"p": [a, {"q": a}], "r": (a,)})  # a leaf replaced deep inside
    assert not unchanged({"p": [a, {"s": b}], "r": (a,)})  # a key renamed
    assert not unchanged({"r": (a,), "p": [a, {"q": b}]})  # another key order: checked again
    assert not unchanged({"p": (a, {"q": b}), "r": (a,)})  # a list became a tuple
    assert not unchanged({"p": [a, {"q": b}], "r": (a, b)})  # a leaf added
    assert not unchanged({"p": [a, {"q": b}]})
    assert not unchanged({"p": [a, {"q": b}, a], "r": (a,)})  # a list longer than it was
    assert not unchanged({"p": [a], "r": (a,)})  # or shorter
    assert not unchanged({"p": [b, {"q": a}], "r": (a,)})  # the same leaves in other places
    assert not unchanged({"p": [None, {"q": b}], "r": (a,)})  # a leaf became None
    assert not unchanged(type("D", (dict,), {})({"p": [a, {"q": b}], "r": (a,)}))  # a dict subclass
    # numpy arrays (mutable in place), other keys and pytree classes: flattened (Python scalars are
    # compared by value: tests/test_identity.py)
    assert snapshot({"w": np.ones(2)}) is None and snapshot({1: a}) is None
    assert snapshot(jax.tree_util.Partial(jnp.add, a)) is None


def test_the_hot_path_with_nested_parameters_follows_in_place_dict_changes():
    # a parameter dict changed in place (a leaf replaced) is a new parameter set: checked without
    # flattening while unchanged, and noticed as soon as one leaf is another array
    def g(params, x):
        return jnp.tanh(x @ (params["layers"][0]["A"] @ params["layers"][0]["B"])) + params["bias"]

    p0 = _params(95)
    p = {"layers": [{"A": p0["A"], "B": p0["B"]}], "bias": jnp.ones(64, jnp.float32)}
    x = _x(96)
    opt = jaxrw.optimize(g, hoist_argnums=0)
    for i in range(3):
        np.testing.assert_allclose(opt(p, x + i), g(p, x + i), rtol=1e-4, atol=1e-5)
    hot = opt._hot_path
    assert hot is not None and hot.same_hoisted is not None and len(hot.passed) == 1  # bias, read by main
    p["layers"][0]["A"] = p["layers"][0]["A"] * 2.0  # in place: the same dicts, a new array
    for _ in range(2):
        np.testing.assert_allclose(opt(p, x), g(p, x), rtol=1e-4, atol=1e-5)
    p["bias"] = p["bias"] + 1.0  # a leaf the main program reads itself
    np.testing.assert_allclose(opt(p, x), g(p, x), rtol=1e-4, atol=1e-5)


def test_the_quick_check_of_the_parameters_alone_first():
    # hoist_argnums=0 and nothing else hoisted: the hot path checks args[0] itself (`lead`)
    opt = jaxrw.optimize(f, hoist_argnums=0)
    p, x = _params(97), _x(98)
    for i in range(3):
        np.testing.assert_allclose(opt(p, x + i), f(p, x + i), rtol=1e-4, atol=1e-5)
    hot, call = opt._hot_path, next(iter(opt._cache.values())).call
    assert hot is not None and hot.same_lead is not None and call.prologue_runs == 1
    # another dict holding the very same arrays: the same prologue inputs, nothing recomputed
    np.testing.assert_allclose(opt(dict(p), x), f(p, x), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == 1
    # by keyword, the quick check does not apply; the general one serves the call
    np.testing.assert_allclose(opt(params=p, x=x), f(p, x), rtol=1e-4, atol=1e-5)
    # one array replaced: the quick check fails, and the prologue runs for the new arrays
    q = {**p, "B": p["B"] * 3.0}
    for _ in range(2):
        np.testing.assert_allclose(opt(q, x), f(q, x), rtol=1e-4, atol=1e-5)
    assert call.prologue_runs == 2


def test_the_quick_check_is_off_where_the_parameters_are_not_first():
    def g(x, params):
        return f(params, x)

    opt = jaxrw.optimize(g, hoist_argnums=1)
    p, x = _params(99), _x(100)
    for i in range(3):
        np.testing.assert_allclose(opt(x + i, p), g(x + i, p), rtol=1e-4, atol=1e-5)
    assert opt._hot_path is not None and opt._hot_path.same_lead is None
    q = {**p, "A": p["A"] + 1.0}
    for _ in range(2):
        np.testing.assert_allclose(opt(x, q), g(x, q), rtol=1e-4, atol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outer=st.sampled_from(["dict", "list", "tuple"]),
    inner=st.sampled_from(["list", "tuple", "dict"]),
    shape=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    replace=st.integers(-1, 11),
    rekey=st.booleans(),
)
def test_two_level_parameters_unchanged_means_the_same_leaves(outer, inner, shape, replace, rekey):
    from jaxrw.identity import checker, snapshot

    count = iter(range(100))
    keys = "pqr"  # dict children share their keys

    def child(n):
        leaves = [_leaf(next(count)) for _ in range(n)]
        if inner == "dict":
            return dict(zip(keys, leaves, strict=False))
        return leaves if inner == "list" else tuple(leaves)

    kids = [child(max(shape) if inner == "dict" else k) for k in shape]
    tree = (
        dict(zip("abcdef", kids, strict=False))
        if outer == "dict"
        else kids
        if outer == "list"
        else tuple(kids)
    )
    unchanged = checker(snapshot(tree))
    assert unchanged(_rebuilt(tree, lambda i, x: x))
    other = _rebuilt(tree, lambda i, x: _leaf(50) if i == replace else x)
    if rekey and inner == "dict":  # the first child's first key renamed, the same arrays
        first = next(iter(other.values())) if outer == "dict" else other[0]
        first["z"] = first.pop("p")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    now, now_def = jax.tree_util.tree_flatten(other)
    if unchanged(other):
        assert now_def == treedef and all(a is b for a, b in zip(now, leaves, strict=True))
    else:
        assert 0 <= replace < len(leaves) or (rekey and inner == "dict")

"""Parameters in dataclasses registered with `jax.tree_util.register_dataclass` (scientific codes'
`Params(w=..., b=..., n_layers=3)`): the hoisted quick path checks them as their data fields (by
identity) and meta fields (by equality, as jax compares aux data) instead of flattening them on
every call. "Unchanged" must still mean that flattening gives the same leaves and treedef; other
registrations of a dataclass flatten as before."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxrw
from jaxrw import compat, hoist
from jaxrw.identity import LONG, checker, snapshot
from tests.test_hoist_call_class import _served
from tests.test_hoist_two_sets import _no_full_path, refuse
from tests.test_identity import _leaves, _same_leaves


@functools.cache
def _dataclass(n: int, meta: int, frozen: bool) -> type:
    """A registered dataclass of `n` array fields and `meta` static int fields."""
    fields = [(f"w{i:03d}", object) for i in range(n)]
    fields += [(f"m{i}", int, dataclasses.field(default=i, metadata={"static": True})) for i in range(meta)]
    cls = dataclasses.make_dataclass(f"P{n}_{meta}_{frozen}", fields, frozen=frozen)
    return jax.tree_util.register_dataclass(cls)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.sampled_from([1, 2, 5, LONG, 2 * LONG]),
    meta=st.integers(0, 2),
    frozen=st.booleans(),
    change=st.sampled_from(["none", "first", "last", "meta", "equal_meta", "in_place", "class", "dict"]),
)
def test_registered_dataclasses_unchanged_means_the_same_leaves_and_treedef(n, meta, frozen, change):
    cls = _dataclass(n, meta, frozen)
    leaves = _leaves(n)
    tree = {"params": cls(*leaves), "other": [leaves[0]]}
    unchanged = checker(snapshot(tree))
    assert unchanged({"params": cls(*leaves), "other": [leaves[0]]})  # a new object, the same arrays
    params = cls(*leaves)
    if change in ("first", "last"):
        name = f"w{0 if change == 'first' else n - 1:03d}"
        params = dataclasses.replace(params, **{name: _leaves(1, 99)[0]})
    elif change == "meta" and meta:
        params = dataclasses.replace(params, m0=7)
    elif change == "equal_meta" and meta:
        params = dataclasses.replace(params, m0=0.0)  # 0 == 0.0: jax's treedefs compare them equal too
    elif change == "in_place":
        object.__setattr__(params, "w000", _leaves(1, 50)[0])  # even a frozen one, as equinox does
    elif change == "class":
        params = _dataclass(n, meta, not frozen)(*leaves)
    elif change == "dict":
        params = {f"w{i:03d}": x for i, x in enumerate(leaves)}
    other = {"params": params, "other": [leaves[0]]}
    said = unchanged(other)
    # two dataclasses' treedefs compare equal (==) in jax 0.12 when their fields do, whatever the
    # classes; their hashes differ, and jax.jit keys by both (compat.same_treedef): another class
    # is another tree (test_two_dataclasses_of_the_same_fields_are_two_programs below)
    assert said == _same_leaves(tree, other) or (change == "class" and not said)
    assert said == (change in ("none", "equal_meta") or (change == "meta" and not meta))


@dataclasses.dataclass
class _Layer:
    w: jax.Array
    b: jax.Array
    act: str = dataclasses.field(default="tanh", metadata={"static": True})
    cache: object = None  # dropped: jax never flattens it


jax.tree_util.register_dataclass(_Layer, ["w", "b"], ["act"], drop_fields=["cache"])


@dataclasses.dataclass
class _OwnFlatten:  # a dataclass registered with a flatten function of its own: not checked here
    w: jax.Array
    scale: float


jax.tree_util.register_pytree_node(
    _OwnFlatten, lambda t: ((t.w,), t.scale), lambda s, kids: _OwnFlatten(kids[0], s)
)


@dataclasses.dataclass(frozen=True)
class _Meta:
    tag: object


jax.tree_util.register_dataclass(_Meta, [], ["tag"])


class _Loud:
    """A meta value whose comparison with another raises (Python compares a tuple's items by
    identity first, as jax's treedefs do, so the same object never asks)."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        raise RuntimeError("no comparing me")


def test_only_jax_registered_dataclasses_are_checked_and_a_raising_meta_reads_as_changed():
    w, b = _leaves(2)
    assert compat.dataclass_fields(_Layer) == (("w", "b"), ("act",))
    assert compat.dataclass_fields(_OwnFlatten) is None and compat.dataclass_fields(dict) is None
    assert snapshot(_OwnFlatten(w, 0.5)) is None and snapshot({"p": _OwnFlatten(w, 0.5)}) is None
    assert snapshot(_Meta([1])) is None  # unhashable: jax could not key a trace by it either
    layer = _Layer(w, b, cache=w)
    unchanged = checker(snapshot(layer))
    assert unchanged(_Layer(w, b)) and _same_leaves(layer, _Layer(w, b))  # the dropped field: unread
    assert not unchanged(_Layer(w, b, act="relu")) and not unchanged(_Layer(b, w))
    loud = _Loud()
    same = checker(snapshot(_Meta(loud)))
    assert same(_Meta(loud)) and not same(_Meta(_Loud()))  # raised inside: "changed", so it flattens


def net(params, x):
    # the merged product A @ B is hoisted; the activation, a meta field, picks the main program
    h = x @ (params.A @ params.B) + params.b
    return jnp.tanh(h) if params.act == "tanh" else jax.nn.relu(h)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Net:
    A: jax.Array
    B: jax.Array
    b: jax.Array
    act: str = dataclasses.field(default="tanh", metadata={"static": True})


def _net(seed: int) -> _Net:
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(s) / 4 for s in ((16, 8), (8, 16), (16,)))
    return _Net(*(jnp.asarray(v, jnp.float32) for v in (a, b, c)))


def _reference(p: _Net, x) -> np.ndarray:
    h = np.asarray(x, np.float64) @ (np.asarray(p.A, np.float64) @ np.asarray(p.B, np.float64))
    h = h + np.asarray(p.b, np.float64)
    return np.tanh(h) if p.act == "tanh" else np.maximum(h, 0.0)


def _check(opt, p, x) -> None:
    np.testing.assert_allclose(np.asarray(opt(p, x)), _reference(p, x), rtol=1e-4, atol=1e-5)


def test_dataclass_parameters_take_the_quick_path_and_follow_new_fields(monkeypatch):
    opt = jaxrw.optimize(net, hoist_argnums=0)
    p = _net(800)
    x = jnp.asarray(np.random.default_rng(801).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        _check(opt, p, x)
    (entry,) = opt._cache.values()
    runs = entry.call.prologue_runs
    assert _served(opt)  # the class call: a check of the fields, no flattening (1.1x faster here)
    with monkeypatch.context() as quick_only:  # cached calls: no full path
        _no_full_path(quick_only, opt)
        quick_only.setattr(hoist, "structure_hit", refuse)
        quick_only.setattr(hoist, "run_proven", refuse)
        for i in range(3):
            _check(opt, _Net(p.A, p.B, p.b), x + i)  # a new object of the same arrays
    assert entry.call.prologue_runs == runs
    # another activation (meta), a replaced field, a field set in place: never the stale program
    _check(opt, dataclasses.replace(p, act="relu"), x)
    q = dataclasses.replace(p, B=p.B * 2.0)
    for _ in range(3):
        _check(opt, q, x)
    q.A = q.A + 1.0  # in place: the same object
    _check(opt, q, x)
    _check(opt, p, x)


def test_gradients_with_respect_to_dataclass_parameters_are_right():
    opt = jaxrw.optimize(net, hoist_argnums=0)
    p = _net(810)
    x = jnp.asarray(np.random.default_rng(811).standard_normal((3, 16)), jnp.float32)
    for _ in range(3):
        opt(p, x)  # cached first: the gradient must not read the cache

    def loss(f):
        return lambda q: jnp.sum(f(q, x) ** 2)

    got, want = jax.grad(loss(opt))(p), jax.grad(loss(net))(p)
    for name in ("A", "B", "b"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Relu(_Net):
    pass


def net_by_class(params, x):
    h = x @ (params.A @ params.B) + params.b
    return jax.nn.relu(h) if isinstance(params, _Relu) else jnp.tanh(h)


def test_two_dataclasses_of_the_same_fields_are_two_programs():
    # a review's repro: jax 0.12's treedef == ignores a registered dataclass's class, and the
    # hoisted call's flattened branch compared treedefs by == alone: a second class of the same
    # fields was served the first class's program (where the quick path's class check sent it)
    p = _net(820)
    x = jnp.asarray(np.random.default_rng(821).standard_normal((3, 16)), jnp.float32)
    relu = _Relu(p.A, p.B, p.b)
    want = {_Net: _reference(p, x), _Relu: _reference(dataclasses.replace(p, act="relu"), x)}
    for kw, call in (
        ({"hoist_argnums": 0}, lambda f, q: f(q, x)),
        ({"hoist_argnames": "params"}, lambda f, q: f(params=q, x=x)),
        ({"hoist_argnums": 1}, lambda f, q: f(x, q)),
    ):
        fn = net_by_class if "hoist_argnums" not in kw or kw["hoist_argnums"] == 0 else _swapped
        opt = jaxrw.optimize(fn, **kw)
        for q in (p, p, p, relu, relu, p, relu):
            np.testing.assert_allclose(np.asarray(call(opt, q)), want[type(q)], rtol=1e-4, atol=1e-5)


def _swapped(x, params):
    return net_by_class(params, x)


def test_a_field_name_with_a_dot_is_flattened_and_the_guards_ask_jax(monkeypatch):
    # a review's repro: attrgetter reads "B.w" as `t.B.w`, so a check could read another array
    class Holder:
        pass

    w, v = _leaves(2)
    odd = Holder()
    odd.A, odd.B = w, Holder()
    setattr(odd, "B.w", v)
    odd.B.w = v
    jax.tree_util.register_dataclass(Holder, data_fields=["A", "B.w"], meta_fields=[])
    assert compat.dataclass_fields(Holder) == (("A", "B.w"), ()) and snapshot(odd) is None
    # names the registry might give wrongly are checked against jax's own flattening
    layer = _Layer(w, v)
    for wrong in ((("w",), ("b", "act")), (("w", "b"), ()), (("b", "w"), ("act",))):
        monkeypatch.setattr(compat, "dataclass_fields", lambda cls, wrong=wrong: wrong)
        assert snapshot(layer) is None, wrong
    monkeypatch.undo()
    assert snapshot(layer) is not None


@functools.partial(jax.tree_util.register_dataclass, drop_fields=["AB"])
@dataclasses.dataclass
class _Checked:
    A: jax.Array
    B: jax.Array
    AB: jax.Array = dataclasses.field(init=False)

    def __post_init__(self):  # checks and combines its fields, as jax.jit's unflattening runs it
        if self.A.shape[1] != self.B.shape[0]:
            raise ValueError("A and B do not chain")
        self.AB = self.A @ self.B


def test_a_dataclass_whose_post_init_reads_its_fields_is_hoisted_not_refused():
    # a review's find: the main program's jit rebuilt the hoisted arguments of placeholder objects,
    # so a __post_init__ reading its fields raised there, and every such call fell back to jax.jit
    p = _net(830)
    params = _Checked(p.A, p.B)
    x = jnp.asarray(np.random.default_rng(831).standard_normal((3, 16)), jnp.float32)
    opt = jaxrw.optimize(lambda q, x: jnp.tanh(x @ q.AB), hoist_argnums=0, strict=True)
    want = np.tanh(np.asarray(x, np.float64) @ (np.asarray(p.A, np.float64) @ np.asarray(p.B, np.float64)))
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(opt(params, x)), want, rtol=1e-4, atol=1e-5)
    assert _served(opt)

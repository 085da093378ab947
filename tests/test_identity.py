"""The hoisted quick path's identity checks (`jaxrw.identity`): long containers, whose checks
compare the first leaf before the rest (`identity.LONG`), Python scalars compared by value,
namedtuples, and the stand-ins for passed leaves. "Unchanged" must still mean that flattening
gives the same leaves and structure, whatever was replaced, added, dropped or renamed."""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrw.identity import LONG, checker, snapshot, stand_in


def _leaves(n: int, start: int = 0) -> list:
    return [jnp.full((2,), float(start + i)) for i in range(n)]


@functools.cache
def _namedtuple(n: int) -> type:
    return collections.namedtuple(f"Params{n}", [f"w{i}" for i in range(n)])


def _same_leaves(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and len(la) == len(lb) and all(x is y for x, y in zip(la, lb, strict=True))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["dict", "list", "tuple", "namedtuple"]),
    n=st.integers(LONG - 2, 3 * LONG),
    change=st.sampled_from(["none", "first", "last", "middle", "drop", "add", "rekey", "empty", "type"]),
)
def test_long_containers_unchanged_means_the_same_leaves(kind, n, change):
    leaves = _leaves(n)
    keys = [f"w{i:03d}" for i in range(n)]
    make = {"dict": lambda xs, ks: dict(zip(ks, xs, strict=True)), "list": lambda xs, ks: list(xs)}
    make["tuple"] = lambda xs, ks: tuple(xs)
    make["namedtuple"] = lambda xs, ks: _namedtuple(len(xs))(*xs)
    tree = make[kind](leaves, keys)
    unchanged = checker(snapshot(tree))
    assert unchanged(make[kind](list(leaves), list(keys)))  # new containers, the same arrays
    xs, ks = list(leaves), list(keys)
    if change in ("first", "last", "middle"):
        xs[{"first": 0, "last": n - 1, "middle": n // 2}[change]] = _leaves(1, 1000)[0]
    elif change == "drop":
        xs, ks = xs[1:], ks[1:]
    elif change == "add":
        xs, ks = [*xs, _leaves(1, 2000)[0]], [*ks, "zzz"]
    elif change == "rekey":
        ks[0] = "a_renamed"
    elif change == "empty":
        xs, ks = [], []
    retyped = tuple(xs) if kind in ("list", "namedtuple") else list(xs)
    other = make[kind](xs, ks) if change != "type" else retyped
    said = unchanged(other)
    assert said == _same_leaves(tree, other)
    assert said == (change == "none" or (change == "rekey" and kind != "dict"))


def test_python_scalars_are_the_same_when_type_value_and_sign_are():
    # a scalar's type sets its traced dtype (2, 2.0, True and 2+0j compare equal in Python), and
    # 0.0 == -0.0 though 1/x tells them apart: either difference is another leaf
    a = _leaves(1)[0]
    unchanged = checker(snapshot({"w": a, "scale": 0.5, "n": 2, "flag": True, "z": complex(0.0, -0.0)}))
    same = {"w": a, "scale": float("0.5"), "n": int("2"), "flag": True, "z": complex(0.0, -0.0)}
    assert unchanged(same)
    for key, other in [("scale", 0.25), ("scale", 1), ("n", 2.0), ("n", True), ("flag", 1), ("flag", False)]:
        assert not unchanged({**same, key: other}), (key, other)
    assert not unchanged({**same, "z": complex(0.0, 0.0)}) and not unchanged({**same, "z": 0.0})
    signed = checker(snapshot([0.0]))
    assert signed([float("0.0")]) and not signed([-0.0])
    nan = float("nan")
    assert not checker(snapshot([nan]))([float("nan")])  # NaN: never the same (flattened instead)
    assert snapshot([np.float32(1.0)]) is None  # numpy scalars are not Python's: flattened


def test_stand_ins_hold_arrays_weakly_and_scalars_converted_once():
    import gc

    a = _leaves(1)[0]
    ref = stand_in(a)
    assert ref() is a
    del a
    gc.collect()
    assert ref() is None  # the stand-in does not keep the array alive
    for scalar in (0.5, 3, True, complex(1, 2)):
        held = stand_in(scalar)
        assert held() is held() and held().shape == ()
        assert held().dtype == jax.jit(lambda s: s)(scalar).dtype  # as jax.jit would convert it
        assert held().weak_type == jax.jit(lambda s: s)(scalar).weak_type
    assert stand_in(2**40) is None  # past int32: no stand-in (the call flattens; jax.jit raises)


def test_a_stand_in_made_inside_a_trace_is_a_concrete_array():
    # made while another jit traces (an optimized call inside it), a converted scalar must not be
    # that trace's tracer: later calls would meet a leaked tracer
    made = []
    jax.jit(lambda x: made.append(stand_in(0.5)) or x)(1.0)
    assert isinstance(made[0](), jax.Array) and not isinstance(made[0](), jax.core.Tracer)


class _Params(NamedTuple):
    w: jax.Array
    b: jax.Array | None


class _Registered(NamedTuple):  # a pytree of its own: `b` is not a child
    w: jax.Array
    b: float


jax.tree_util.register_pytree_node(
    _Registered, lambda t: ((t.w,), t.b), lambda b, kids: _Registered(kids[0], b)
)


class _Scaled(collections.namedtuple("_Base", "w b")):  # a subclass with aux data of its own
    pass


jax.tree_util.register_pytree_node(
    _Scaled, lambda t: ((t.w, t.b), t.__dict__.get("scale")), lambda aux, kids: _Scaled(*kids)
)


class _TwoOfThree(NamedTuple):  # iterates over two of its three fields; jax flattens all three
    w: jax.Array
    b: jax.Array
    scale: jax.Array

    def __iter__(self):
        return iter((self.w, self.b))


def test_namedtuples_registered_or_iterating_otherwise_are_flattened():
    # a review's repros: each was checked as its fields, and served a changed scale stale values
    w, b = _leaves(2)
    scaled = _Scaled(w, b)
    scaled.scale = 2.0  # aux data, in the instance: unseen by a check of the fields
    assert snapshot(scaled) is None and snapshot({"p": scaled}) is None
    assert snapshot(_TwoOfThree(w, b, b)) is None and snapshot([_TwoOfThree(w, b, w)]) is None


def test_namedtuples_are_checked_as_their_fields_unless_registered_otherwise():
    w, b = _leaves(2)
    unchanged = checker(snapshot({"layer": _Params(w, b), "out": _Params(w, None)}))
    assert unchanged({"layer": _Params(w, b), "out": _Params(w, None)})  # new containers, same arrays
    assert not unchanged({"layer": _Params(w, w), "out": _Params(w, None)})
    assert not unchanged({"layer": (w, b), "out": _Params(w, None)})  # a plain tuple: another tree
    assert not unchanged({"layer": _namedtuple(2)(w, b), "out": _Params(w, None)})  # another class
    assert not unchanged({"layer": _Params(w, b), "out": _Params(w, b)})
    # a namedtuple class registered as a pytree of its own flattens as it says: not checked here
    assert snapshot(_Registered(w, 0.5)) is None and snapshot([_Registered(w, 0.5)]) is None

"""The hoisted quick path's identity checks (`jaxrw.identity`) on long containers, whose checks
compare the first leaf before the rest (`identity.LONG`): "unchanged" must still mean that
flattening gives the same leaves and structure, whatever was replaced, added, dropped or renamed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrw.identity import LONG, checker, snapshot


def _leaves(n: int, start: int = 0) -> list:
    return [jnp.full((2,), float(start + i)) for i in range(n)]


def _same_leaves(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and len(la) == len(lb) and all(x is y for x, y in zip(la, lb, strict=True))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["dict", "list", "tuple"]),
    n=st.integers(LONG - 2, 3 * LONG),
    change=st.sampled_from(["none", "first", "last", "middle", "drop", "add", "rekey", "empty", "type"]),
)
def test_long_containers_unchanged_means_the_same_leaves(kind, n, change):
    leaves = _leaves(n)
    keys = [f"w{i:03d}" for i in range(n)]
    make = {"dict": lambda xs, ks: dict(zip(ks, xs, strict=True)), "list": lambda xs, ks: list(xs)}
    make["tuple"] = lambda xs, ks: tuple(xs)
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
    other = make[kind](xs, ks) if change != "type" else (tuple(xs) if kind == "list" else list(xs))
    said = unchanged(other)
    assert said == _same_leaves(tree, other)
    assert said == (change == "none" or (change == "rekey" and kind != "dict"))

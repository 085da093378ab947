"""The roofline model's pricing of concat chains: with `Profile.concat_chains` set (the default),
as decode emits a left-nested same-axis chain, one n-ary concatenate; unset, link by link."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite import profiles
from jaxrw.rewrite.profiles import H200
from jaxrw.rewrite.run import rewrite_jaxpr

CHAINS = H200
LINKS = dataclasses.replace(H200, name="h200-links", concat_chains=False)


def _cost(fn, shapes, profile):
    """The model's price of `fn` as written (before any rewrite)."""
    closed = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, np.float32) for s in shapes))
    return rewrite_jaxpr(closed, profile=profile).report.cost_before


def _stack_of(k):
    return lambda *xs: jnp.concatenate([jnp.tanh(x) for x in xs], axis=0)  # inputs computed, not folded


@pytest.mark.parametrize("k", [4, 8, 32])
def test_a_chain_costs_what_one_concatenate_of_the_same_bytes_does(k):
    rows = 128
    chain = _cost(_stack_of(k), [(rows, 1024)] * k, CHAINS)
    one = _cost(_stack_of(2), [(rows * k // 2, 1024)] * 2, CHAINS)  # the same bytes in two parts
    assert chain == pytest.approx(one, rel=1e-6)
    # priced link by link, each link reads and writes the whole prefix and launches a kernel
    linked = _cost(_stack_of(k), [(rows, 1024)] * k, LINKS)
    assert linked > chain + (k - 2) * LINKS.launch_s


def test_links_along_other_axes_are_not_a_chain():
    shapes = [(512, 512)] * 3
    two_axes = lambda a, b, c: jnp.concatenate(  # noqa: E731
        [jnp.concatenate([jnp.tanh(a), jnp.tanh(b)], 0), jnp.concatenate([jnp.tanh(c), jnp.tanh(c)], 0)], 1
    )
    assert _cost(two_axes, shapes, CHAINS) == pytest.approx(_cost(two_axes, shapes, LINKS), rel=1e-6)


def test_the_setting_is_saved_and_loaded(tmp_path):
    path = profiles.save_profile(LINKS, tmp_path / "p.json")
    assert profiles.load_profile(path).concat_chains is False
    data = json.loads(path.read_text())
    del data["concat_chains"]  # a profile written before the field: the default, on
    path.write_text(json.dumps(data))
    assert profiles.load_profile(path).concat_chains is True
    assert H200.concat_chains is True and profiles.CPU.concat_chains is True

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
from jaxrw.rewrite.run import Limits, rewrite_jaxpr

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


def test_a_link_whose_chosen_left_operand_is_no_concat_is_priced_as_a_concatenate():
    # a@W1 and a@W2 (closed-over W) merge into a@[W1|W2], whose class also holds the concat of
    # the two products: the outer concatenate was priced as a chain link (no launch, only `b`
    # copied) though the extractor chose the merged dot. The rewrite was predicted 21% faster
    # than the program as written, and its decoded program cost exactly the same.
    rng = np.random.default_rng(0)
    W1, W2 = (jnp.asarray(rng.standard_normal((1024, 1024)), jnp.float32) for _ in range(2))

    def f(a, b):
        return jnp.concatenate([a @ W1, a @ W2, b], axis=1)

    specs = [jax.ShapeDtypeStruct((4096, 1024), jnp.float32)] * 2
    res = rewrite_jaxpr(jax.make_jaxpr(f)(*specs), profile=CHAINS, limits=Limits(min_gain=0.0))
    decoded = rewrite_jaxpr(jax.make_jaxpr(res.fn)(*specs), profile=CHAINS, rules=[])
    assert res.report.cost_after == pytest.approx(decoded.report.cost_before, rel=1e-6)
    assert not rewrite_jaxpr(jax.make_jaxpr(f)(*specs), profile=CHAINS).report.rewritten  # no gain

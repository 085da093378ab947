"""Rules that can never match a program are not registered (reach.py). Dropping them must not
change what saturation derives: checked on every rule's example with the whole registry."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite.encode import encode
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.rules import RULES, select_rules
from jaxrw.rewrite.run import Limits, RewriteReport, saturate
from jaxrw.rewrite.terms import analysis

from .rules.harness import flat_jaxpr

select_rules(None)  # load every family


def _saturate(fn, args, filtered: bool):
    closed, _ = flat_jaxpr(fn, args)
    program = encode(closed)
    if not filtered:
        program = dataclasses.replace(program, symbols=frozenset())  # empty: register every rule
    program.egraph.run(analysis.saturate())
    report = RewriteReport()
    saturate(program, select_rules(None), Limits(iterations=4, nodes=20_000), report)
    view = EGraphView.from_egraph(program.egraph)
    return report, view


def test_an_elementwise_program_registers_no_dot_rules():
    report, _ = _saturate(lambda x, y: jnp.tanh(x * y + x), (jnp.ones((3, 4)), jnp.ones((3, 4))), True)
    assert report.rewrites_skipped > 0
    assert not any(name.startswith(("dot.", "merge.", "batch.")) for name in report.rules_fired)


@pytest.mark.parametrize("name", sorted(RULES))
def test_dropping_rules_that_cannot_match_changes_nothing(name):
    fn, args = RULES[name].example(np.random.default_rng(0), "float32")
    got, view = _saturate(fn, args, True)
    want, full = _saturate(fn, args, False)
    assert want.rewrites_skipped == 0
    assert got.rules_fired == want.rules_fired
    assert got.stop_reason == want.stop_reason
    assert (view.n_nodes, view.n_classes) == (full.n_nodes, full.n_classes)

"""run._register adds a ruleset's rules to egglog in one batch (egglog-python's first run sends one
batch per rule, and each batch costs more the more global names the e-graph holds). It reaches
into egglog-python's internals, so: the rewrite it gives is the one egglog-python's own way gives."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite import run
from jaxrw.rewrite.rules import RULES, select_rules

select_rules(None)


def _programs():
    rng = np.random.default_rng(0)
    a, b, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((48, 48), (48, 48), (48,)))
    yield "chain", (lambda a, b, v: jnp.tanh(a @ b @ v) + (a @ b).sum(0)), (a, b, v)
    yield "diagonal", (lambda a, b, v: jnp.diagonal(a @ b) + v @ a @ b), (a, b, v)
    for name in ("batch.stack_dots", "merge.concat_dots", "reduce.sum_dot"):
        fn, args = RULES[name].example(np.random.default_rng(1), "float32")
        yield name, fn, args


def _decisions(fn, args):
    r = jaxrw.optimize(fn).report(*args)
    return r.rules_fired, r.egraph_nodes, r.egraph_classes, r.stop_reason, r.cost_after


@pytest.mark.parametrize("name,fn,args", list(_programs()), ids=[p[0] for p in _programs()])
def test_one_batch_derives_what_one_batch_per_rule_derives(monkeypatch, name, fn, args):
    batched = _decisions(fn, args)
    monkeypatch.setattr(run, "_register", lambda eg, rs: None)  # egglog-python's own registration
    assert _decisions(fn, args) == batched
    assert batched[0], name  # rules fired: the comparison is not between two empty runs


def test_the_ruleset_is_registered_once(monkeypatch):
    added = []
    real = run._register

    def spy(eg, rs):
        before = set(eg._state.rulesets)
        real(eg, rs)
        added.append(set(eg._state.rulesets) - before)

    monkeypatch.setattr(run, "_register", spy)
    x = jnp.ones((8, 8))
    jaxrw.optimize(lambda a, b: a @ b @ b).report(x, x)
    assert added and all(len(new) == 1 for new in added), added


@pytest.mark.parametrize("name,fn,args", list(_programs()), ids=[p[0] for p in _programs()])
def test_runs_read_without_egglogs_report_decide_as_with_it(monkeypatch, name, fn, args):
    # run._run reads egglog's run report by rule name: egglog-python's RunReport hashed every
    # rule's declaration for every iteration (0.6 of a 3.5 s rewrite). Its public report must
    # give the same decisions
    direct = _decisions(fn, args)
    monkeypatch.setattr(run, "_run", run._run_public)
    assert _decisions(fn, args) == direct
    assert direct[0], name

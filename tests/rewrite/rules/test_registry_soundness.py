"""Every registered rule, alone, on its own example: it fires, and every program the e-graph then
holds (each alternative node of every class) computes what the float64 reference computes.
New rules are checked automatically: this file is parametrized over the registry."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrw.rewrite.rules import RULES, select_rules

from .harness import check_choices, reference, run_rules

select_rules(None)  # load every family
# Rules that only match terms other rules create run with those rules.
PREREQUISITES = {
    "dot.adopt_cfg": ["reduce.weighted_sum"],
    "structured.diag_sides": ["structured.select_eye", "structured.bcast_compose", "structured.pad_noop"],
}
SEEDS = (0, 1)  # float32; bfloat16 and int32 use the first
CASES = [
    pytest.param(name, dt, seed, id=f"{name}-{dt}-{seed}")
    for name in sorted(RULES)
    for dt in RULES[name].dtypes
    for seed in (SEEDS if dt == "float32" else SEEDS[:1])
]


@pytest.mark.parametrize("name,dtype,seed", CASES)
def test_rule_is_sound(name, dtype, seed):
    rule = RULES[name]
    assert rule.example is not None, f"{name} has no example"
    rng = np.random.default_rng(seed)
    fn, args = rule.example(rng, dtype)
    sat = run_rules(fn, args, [name, *PREREQUISITES.get(name, [])])
    assert sat.report.rules_fired.get(name, 0) > 0, f"{name} did not fire on its example"
    grew = sat.view.n_nodes > sat.before.n_nodes or sat.view.n_classes < sat.before.n_classes
    assert grew, f"{name} fired but changed nothing"
    ran = check_choices(sat, reference(fn, args), dtype)
    assert ran >= 1


def test_every_rule_is_described():
    for name, rule in RULES.items():
        assert name.startswith(rule.family + "."), name
        assert rule.identity and rule.conditions, name
        assert isinstance(rule.exact, bool)


def test_fast_only_rules_are_inexact_and_registered():
    from jaxrw.rewrite.rules._util import FAST_ONLY

    assert FAST_ONLY <= set(RULES)
    assert not any(RULES[n].exact for n in FAST_ONLY)

"""Under numerics="default", values an inexact rule changed can join a saturating op's cone after
the change (a union the guard in the e-graph cannot see). The program is then rewritten again
without the rules that changed them (each guarded rule marks its own bit: nonfinite.rule_bit),
so the other inexact rewrites stay; where that run has such values too, with exact rules only."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.rewrite import run
from jaxrw.rewrite.nonfinite import rule_bit, rules_of_marks
from tests.test_bad_input import FORCE, _poisoned


def chain_and_factor(a, b, c, x, y, z):
    """(a@b)@c as an output and a@(b@c) under tanh: reassociating the first joins the second's
    cone. x@y + x@z, elsewhere, factors with no saturating op in sight."""
    return (a @ b) @ c, jnp.tanh(a @ (b @ c)), x @ y + x @ z


SHAPES = [(8, 8), (8, 8), (8, 3), (6, 8), (8, 5), (8, 5)]


@pytest.mark.parametrize("poison", [np.inf, -np.inf, np.nan])
def test_only_the_rules_that_reached_the_cone_are_left_out(poison):
    opt = jaxrw.optimize(chain_and_factor, strict=True, limits=FORCE)
    args = _poisoned(SHAPES, poison, 2)
    for got, want in zip(opt(*args), jax.jit(chain_and_factor)(*args), strict=True):
        np.testing.assert_array_equal(np.isfinite(np.asarray(got)), np.isfinite(np.asarray(want)))
    report = opt.report(*args)
    assert "rewritten again without dot.assoc" in report.nonfinite_note, report.nonfinite_note
    assert "dot.factor_left" not in report.nonfinite_note
    # the factoring, an inexact rule the first run's unsafe values did not come from, still runs
    assert report.rules_fired.get("dot.factor_left"), report.rules_fired
    assert not any(name.startswith("dot.assoc") for name in report.rules_fired)


def test_a_second_run_with_such_values_takes_exact_rules_only(monkeypatch):
    # the first run's changed values all counted unsafe (rerun without their rules), the second
    # run's too (a class of no rule's marks): the third has exact rules only
    runs = []

    def unsafe_twice(view, roots=()):
        runs.append(dict(view.touched))
        return set(view.touched) if len(runs) == 1 else {"c0"}

    monkeypatch.setattr(run, "unsafe_classes", unsafe_twice)
    args = _poisoned(SHAPES, 1.0, 3)
    report = jaxrw.optimize(chain_and_factor, limits=FORCE).report(*args)
    assert len(runs) == 2 and runs[0], runs  # the third run, "strict", has no guard to check
    assert "exact rules only" in report.nonfinite_note, report.nonfinite_note
    assert all(jaxrw.rewrite.rules.RULES[n].exact for n in report.rules_fired), report.rules_fired


def test_marks_name_their_rules():
    bits = {name: rule_bit(name) for name in ("dot.assoc_left", "dot.factor_left", "ghost.scale")}
    assert len(set(bits.values())) == 3
    assert rules_of_marks([1 << bits["dot.assoc_left"], 1 << bits["ghost.scale"]]) >= {
        "dot.assoc_left",
        "ghost.scale",
    }
    assert "dot.factor_left" not in rules_of_marks([1 << bits["dot.assoc_left"]])
    assert rules_of_marks([0]) == set()


def test_the_rerun_keeps_the_users_rules_and_their_note(monkeypatch):
    # a review: the rerun was given every kept rule by name, so the report's rules_note lost the
    # user's dot.zero ("needs numerics='fast'") and, after a third run, named ~30 inexact rules
    # as asked for by name
    args = _poisoned(SHAPES, 1.0, 4)
    named = jaxrw.optimize(chain_and_factor, limits=FORCE, rules=["dot", "batch", "dot.zero"])
    report = named.report(*args)
    assert "rewritten again without" in report.nonfinite_note
    assert report.rules_note == "left out under numerics='default': dot.zero needs numerics='fast'"
    runs = []

    def unsafe_twice(view, roots=()):
        runs.append(1)
        return set(view.touched) if len(runs) == 1 else {"c0"}

    monkeypatch.setattr(run, "unsafe_classes", unsafe_twice)
    report = jaxrw.optimize(chain_and_factor, limits=FORCE).report(*args)
    assert "exact rules only" in report.nonfinite_note and report.rules_note == ""

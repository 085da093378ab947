"""Every registered rule, alone, on its own example: it fires, and every program the e-graph then
holds (each alternative node of every class) computes what the float64 reference computes.
New rules are checked automatically: this file is parametrized over the registry."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrw.rewrite.decode import decode
from jaxrw.rewrite.rules import RULES, select_rules
from jaxrw.rewrite.rules._util import NONFINITE_SAFE

from .harness import alternatives, check_choices, reference, run_rules

select_rules(None)  # load every family
# Rules that only match terms other rules create run with those rules.
PREREQUISITES = {
    "dot.adopt_cfg": ["reduce.weighted_sum"],
    "structured.diag_sides": ["structured.select_eye", "structured.bcast_compose", "structured.pad_noop"],
    # the outer products' facts (outer_of) are written by outer.product's seed
    **{f"outer.{n}": ["outer.product"] for n in ("sum", "norm", "batch_sum", "transpose", "scale")},
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


COMPLEX = sorted(n for n in RULES if "float32" in RULES[n].dtypes)


@pytest.mark.parametrize("name", COMPLEX)
def test_rule_is_sound_on_complex(name):
    # rules fire on complex64 too (a targeted fuzz run saw dot.factor_*, reduce.sum_dot, merge.*),
    # while their examples were checked in float32 and bfloat16 only. A rule whose conditions
    # exclude complex (float_dtype) need not fire; every program the e-graph holds must be right.
    rule = RULES[name]
    fn, args = rule.example(np.random.default_rng(0), "complex64")
    assert any(np.iscomplexobj(a) for a in jax.tree_util.tree_leaves(args))
    sat = run_rules(fn, args, [name, *PREREQUISITES.get(name, [])])
    assert check_choices(sat, reference(fn, args), "complex64") >= 1


def test_most_rules_fire_on_complex():
    fired = 0
    for name in COMPLEX:
        fn, args = RULES[name].example(np.random.default_rng(0), "complex64")
        fired += run_rules(fn, args, [name, *PREREQUISITES.get(name, [])]).report.rules_fired.get(name, 0) > 0
    assert fired >= len(COMPLEX) * 3 // 4, fired  # 53 of 61 when written: the complex test has teeth


def test_every_rule_is_described():
    for name, rule in RULES.items():
        assert name.startswith(rule.family + "."), name
        assert rule.identity and rule.conditions, name
        assert isinstance(rule.exact, bool)


def test_fast_only_rules_are_inexact_and_registered():
    from jaxrw.rewrite.rules._util import FAST_ONLY

    assert FAST_ONLY <= set(RULES)
    assert not any(RULES[n].exact for n in FAST_ONLY)


def _every_choice(sat, limit: int = 60):
    """The greedy program and one program per other node of every class it builds."""
    from jaxrw.rewrite.extract import reachable

    programs, base = alternatives(sat, 1)
    for c in reachable(sat.view, base, sat.view.outputs):
        for nid in sat.view.classes[c]:
            if nid != base[c] and len(programs) < limit:
                choice = {**base, c: nid}
                try:
                    reachable(sat.view, choice, sat.view.outputs)
                except (ValueError, KeyError):  # a cycle, or a class greedy did not price
                    continue
                programs.append(choice)
    return programs


def _finiteness_of_every_choice(sat, leaves):
    return [
        [np.isnan(np.asarray(o)) * 1 + np.isinf(np.asarray(o)) * 2 for o in jax.jit(decoded)(*leaves)]
        for decoded in (decode(sat.program, sat.view, c, sat.original) for c in _every_choice(sat))
    ]


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", sorted(NONFINITE_SAFE))
def test_nonfinite_safe_rules_keep_every_nan_and_inf_in_place(name, poison):
    """The rules numerics="default" does not guard (rewrite/nonfinite.py): with a NaN or an Inf in
    each input, every program the e-graph holds has NaN and Inf exactly where jax.jit has them."""
    rule = RULES[name]
    assert not rule.exact and rule.nonfinite_safe
    rng = np.random.default_rng(5)
    fn, args = rule.example(rng, "float32")
    sat = run_rules(fn, args, [name, *PREREQUISITES.get(name, [])])
    assert sat.report.rules_fired.get(name, 0) > 0
    leaves = []
    for x in sat.leaves:
        x = np.array(x)
        if x.dtype.kind == "f" and x.size:
            x[tuple(rng.integers(0, s) for s in x.shape)] = poison
        leaves.append(x)
    treedef = jax.tree_util.tree_structure(args)
    flat = jax.jit(lambda *xs: jax.tree_util.tree_leaves(fn(*jax.tree_util.tree_unflatten(treedef, xs))))
    want = [np.isnan(np.asarray(w)) * 1 + np.isinf(np.asarray(w)) * 2 for w in flat(*leaves)]
    for got in _finiteness_of_every_choice(sat, leaves):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_factoring_can_swap_nan_and_inf_so_default_numerics_guards_it():
    """Negative: a@b + a@c with an Inf in a and products of opposite signs is NaN where the
    factored a@(b + c) is +-Inf. So dot.factor_left is not NONFINITE_SAFE."""
    assert "dot.factor_left" not in NONFINITE_SAFE
    a = np.array([[np.inf, 1.0]], np.float32)
    b = np.array([[2.0], [1.0]], np.float32)
    c = np.array([[-1.0], [1.0]], np.float32)
    sat = run_rules(lambda a, b, c: a @ b + a @ c, (a, b, c), ["dot.factor_left"])
    kinds = {tuple(np.ravel(k[0])) for k in _finiteness_of_every_choice(sat, [a, b, c])}
    assert kinds == {(1,), (2,)}  # NaN as written, Inf factored

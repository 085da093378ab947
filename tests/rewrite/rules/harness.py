"""Shared checks for the rule tests: run one rule on a program, decode every alternative it made,
compare each with a float64 reference; and `optimize`-level FLOP counts through XLA."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxrw.rewrite.cost import FlopsBytes
from jaxrw.rewrite.decode import decode
from jaxrw.rewrite.encode import Program, encode
from jaxrw.rewrite.extract import greedy_dag, node_costs, reachable
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.rules import RULES, select_rules
from jaxrw.rewrite.run import Limits, RewriteReport, original_classes, saturate
from jaxrw.rewrite.terms import analysis

SMALL = Limits(iterations=6, nodes=20_000, time_s=20.0)


def tolerance(dtype: Any) -> float:
    """Norm-wise relative error allowed against the float64 reference."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return 0.0
    if str(dt) in ("bfloat16", "float16"):
        return 4e-2
    return 1e-4


def rel_err(got: Any, want: Any) -> float:
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    den = np.linalg.norm(w)
    return float(np.linalg.norm(g - w) / (den if den > 0 else 1.0))


@dataclass
class Saturated:
    program: Program
    before: EGraphView
    view: EGraphView
    report: RewriteReport
    leaves: list[Any]
    original: frozenset[str]


def flat_jaxpr(fn, args):
    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat(*xs):
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    return jax.make_jaxpr(flat)(*leaves), leaves


def run_rules(fn, args, rules, limits: Limits = SMALL) -> Saturated:
    closed, leaves = flat_jaxpr(fn, args)
    program = encode(closed)
    program.egraph.run(analysis.saturate())
    before = EGraphView.from_egraph(program.egraph)
    report = RewriteReport()
    chosen = [RULES[r] for r in rules] if rules is not None else select_rules(None)
    saturate(program, chosen, limits, report)
    view = EGraphView.from_egraph(program.egraph)
    return Saturated(program, before, view, report, leaves, frozenset(original_classes(before, view)))


def reference(fn, args) -> list[np.ndarray]:
    """The program evaluated in float64 (int64 for integer inputs) with NumPy-backed jax."""

    def wide(x):
        x = np.asarray(x)
        if x.dtype.kind in "iu":
            return x.astype(np.int64)
        return np.asarray(x, dtype=np.float32).astype(np.float64)

    with jax.enable_x64(True):
        out = fn(*jax.tree_util.tree_map(wide, args))
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]


def alternatives(sat: Saturated, limit: int = 60) -> list[dict[str, str]]:
    """The greedy program, then one program per other node of every class with several nodes
    (each differs from greedy in that one class; choices that would close a cycle are skipped)."""
    view = sat.view
    costs = node_costs(view, FlopsBytes())
    base = greedy_dag(view, costs)
    out = [base]
    for c, nids in sorted(view.classes.items()):
        if len(nids) < 2:
            continue
        for nid in nids:
            if nid == base.get(c) or len(out) >= limit:
                continue
            choice = dict(base)
            choice[c] = nid
            try:
                order = reachable(view, choice, view.outputs)
            except (ValueError, KeyError):
                continue
            if c in order:
                out.append(choice)
    return out


def check_choices(sat: Saturated, ref: list[np.ndarray], dtype: Any, limit: int = 60) -> int:
    """Decode every alternative, compare each output with the reference; return how many ran."""
    tol = tolerance(dtype)
    n = 0
    for choice in alternatives(sat, limit):
        fn = decode(sat.program, sat.view, choice, sat.original)
        outs = fn(*sat.leaves)
        assert len(outs) == len(ref)
        for i, (g, w, aval) in enumerate(zip(outs, ref, sat.program.out_avals, strict=True)):
            assert g.shape == aval.shape and g.dtype == aval.dtype, (i, g.shape, g.dtype, aval)
            err = rel_err(g, w)
            live = reachable(sat.view, choice, sat.view.outputs)
            used = sorted({sat.view.nodes[choice[c]].op for c in live})
            assert err <= tol, f"output {i}: relative error {err:.3g} > {tol:.3g} (ops {used})"
        n += 1
    return n


def xla_flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0]
    return float(cost.get("flops", 0.0))


def count_prims(fn, *args, name="dot_general") -> int:
    jaxpr = jax.make_jaxpr(fn)(*args)
    return sum(1 for e in jaxpr.jaxpr.eqns if e.primitive.name == name)


def within(value: float, target: float, frac: float = 0.05) -> bool:
    return math.isclose(value, target, rel_tol=frac) or value <= target

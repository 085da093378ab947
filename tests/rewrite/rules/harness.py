"""Shared checks for the rule tests: run one rule on a program, decode every alternative it made,
compare each with a float64 reference; and `optimize`-level FLOP counts through XLA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxrw.rewrite.cost import FlopsBytes
from jaxrw.rewrite.decode import DECODERS, _Ctx, decode
from jaxrw.rewrite.encode import Program, encode
from jaxrw.rewrite.extract import greedy_dag, node_costs, reachable
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.rules import RULES, select_rules
from jaxrw.rewrite.run import Limits, RewriteReport, original_classes, saturate
from jaxrw.rewrite.terms import analysis

SMALL = Limits(iterations=6, nodes=20_000, time_s=20.0)
# The checks compile many small programs once each: XLA's backend optimizations are not worth
# their compile time there (10x faster to compile, same numbers for these sizes).
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def run_once(fn, *args):
    """fn(*args) through one quickly compiled XLA program."""
    return jax.jit(fn).lower(*args).compile(FAST_COMPILE)(*args)


def tolerance(dtype: Any) -> float:
    """Norm-wise relative error allowed against the float64 reference."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return 0.0
    if str(dt) in ("bfloat16", "float16"):
        return 4e-2
    return 1e-4


def rel_err(got: Any, want: Any) -> float:
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64
    g = np.asarray(got).astype(wide)  # complex kept whole: float64 would drop the imaginary part
    w = np.asarray(want).astype(wide)
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
    """The program evaluated in float64 (int64 for integer inputs, complex128 for complex) with
    NumPy-backed jax."""

    def wide(x):
        x = np.asarray(x)
        if x.dtype.kind in "iu":
            return x.astype(np.int64)
        if x.dtype.kind == "c":
            return x.astype(np.complex128)
        return np.asarray(x, dtype=np.float32).astype(np.float64)

    with jax.enable_x64(True):
        wide_args = jax.tree_util.tree_map(wide, args)
        out = run_once(fn, *wide_args)
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]


def alternatives(sat: Saturated, limit: int = 40) -> list[dict[str, str]]:
    """The greedy program, then one program per other node of each output class (each differs
    from greedy in that one class; choices that would close a cycle are skipped)."""
    view = sat.view
    costs = node_costs(view, FlopsBytes())
    base = greedy_dag(view, costs)
    out = [base]
    for c in dict.fromkeys(view.outputs):
        for nid in view.classes[c]:
            if nid == base.get(c) or len(out) >= limit:
                continue
            choice = dict(base)
            choice[c] = nid
            try:
                reachable(view, choice, view.outputs)
            except (ValueError, KeyError):
                continue
            out.append(choice)
    return out, base


def check_choices(sat: Saturated, ref: list[np.ndarray], dtype: Any, limit: int = 40) -> int:
    """Decode the greedy program and every alternative of the output classes and compare each
    output with the float64 reference; check every other e-node locally: evaluated on the values
    the greedy program gives its children, it must equal its class's greedy value (so each class
    is one value, by induction). All of it runs as one compiled program. Returns the count of
    programs and nodes checked."""
    tol = tolerance(dtype)
    view = sat.view
    choices, base = alternatives(sat, limit)
    programs = [decode(sat.program, view, choice, sat.original) for choice in choices]
    greedy_classes = reachable(view, base, list(base))  # every class greedy builds, children first
    built = set(greedy_classes)
    pairs: list[tuple[str, str]] = []  # (class, node) checked against the class's greedy value
    for c, nids in view.classes.items():
        if len(nids) >= 2 and c in built:
            pairs += [(c, nid) for nid in nids if nid != base[c] and set(view.nodes[nid].children) <= built]

    def evaluate(*leaves):
        ctx = _Ctx(sat.program, view, list(leaves), sat.original)
        value: dict[str, Any] = {}
        for c in greedy_classes:
            node = view.nodes[base[c]]
            value[c] = DECODERS[node.op](ctx, node, [value[ch] for ch in node.children])
        local = []
        for c, nid in pairs:
            node = view.nodes[nid]
            local.append((DECODERS[node.op](ctx, node, [value[ch] for ch in node.children]), value[c]))
        return [p(*leaves) for p in programs], local

    outs_per_program, local = run_once(evaluate, *sat.leaves)
    for choice, outs in zip(choices, outs_per_program, strict=True):
        assert len(outs) == len(ref)
        for i, (g, w, aval) in enumerate(zip(outs, ref, sat.program.out_avals, strict=True)):
            assert g.shape == aval.shape and g.dtype == aval.dtype, (i, g.shape, g.dtype, aval)
            err = rel_err(g, w)
            used = sorted({view.nodes[choice[c]].op for c in reachable(view, choice, view.outputs)})
            assert err <= tol, f"output {i}: relative error {err:.3g} > {tol:.3g} (ops {used})"
    for (c, nid), (got, want) in zip(pairs, local, strict=True):
        node = view.nodes[nid]
        assert np.shape(got) == np.shape(want) and got.dtype == want.dtype, (node, np.shape(got))
        err = rel_err(got, want)
        assert err <= 2 * tol, f"node {node.op}{node.attrs} differs from its class {c}: {err:.3g}"
    return len(choices) + len(pairs)


def xla_flops(fn, *args) -> float:
    """FLOPs of fn compiled by XLA for these arguments (cost_analysis)."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0]
    return float(cost.get("flops", 0.0))


def count_prims(fn, *args, name="dot_general") -> int:
    jaxpr = jax.make_jaxpr(fn)(*args)
    return sum(1 for e in jaxpr.jaxpr.eqns if e.primitive.name == name)


class PureFlops:
    """A cost model counting arithmetic only (the classic matrix-chain objective)."""

    name = "pure-flops"

    def node_cost(self, node, view) -> float:
        from jaxrw.rewrite.cost import node_flops

        return node_flops(node, view)


@dataclass
class Optimized:
    fn: Any  # the rewritten program (flat inputs -> flat outputs), or the original
    report: RewriteReport
    flops: float  # XLA's count for it
    dots: int  # dot_general equations in it


def optimized(f, args, cost_model: Any = "roofline", extractor: str = "greedy", **kw) -> Optimized:
    """Rewrite f for these arguments as `jaxrw.optimize` does on this CPU (profile jaxrw CPU) and
    measure the program it would run: XLA FLOPs and its dot count."""
    from jaxrw.rewrite.profiles import CPU
    from jaxrw.rewrite.run import rewrite_jaxpr

    closed, leaves = flat_jaxpr(f, args)
    res = rewrite_jaxpr(closed, **{"profile": CPU, **kw}, cost_model=cost_model, extractor=extractor)
    if res.fn is not None:
        fn = res.fn
    else:
        tree = jax.tree_util.tree_structure(args)

        def fn(*xs):
            return jax.tree_util.tree_leaves(f(*jax.tree_util.tree_unflatten(tree, xs)))

    return Optimized(fn, res.report, xla_flops(fn, *leaves), count_prims(fn, *leaves))


def reaches(f, best, args, **kw) -> Optimized:
    """Assert the optimized f is within 5% of the hand-written best's FLOPs and still correct."""
    opt = optimized(f, args, **kw)
    leaves = jax.tree_util.tree_leaves(args)
    want = xla_flops(best, *args)
    assert opt.flops <= want * 1.05, f"{opt.flops:.4g} FLOPs vs best {want:.4g}\n{opt.report!r}"
    got = opt.fn(*leaves)
    ref = jax.tree_util.tree_leaves(jax.jit(f)(*args))
    for g, w in zip(got, ref, strict=True):
        assert rel_err(g, w) <= 2 * tolerance(w.dtype) + 1e-6, rel_err(g, w)
    return opt


def intermediate_shapes(fn, args) -> set[tuple[int, ...]]:
    """Every intermediate shape of the program `fn` runs for `args` (nested jaxprs too): what a
    rewrite no longer forms."""
    import jax.extend

    def walk(jaxpr):
        for e in jaxpr.eqns:
            yield from (tuple(v.aval.shape) for v in e.outvars)
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                yield from walk(sub)

    return set(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def optimize_without_fallback(fn, args, **options):
    """(jaxrw.optimize(fn, **options), its result for args), failing where it fell back to
    jax.jit: a fallback's warning would hide a failure of the rewrite under test."""
    import warnings

    import jaxrw

    opt = jaxrw.optimize(fn, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = opt(*args)
    return opt, out

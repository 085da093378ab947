"""`explain`: what jaxrw did to a program, where, and why it believes the result is faster.

`explain(fn, *args)` runs the same pipeline as `optimize(fn)(*args)` on a private copy (so the
caller's cache is untouched) and returns an `Explanation`: the rules that fired and the original
equations they matched (with source lines), the original and optimized jaxprs, the predicted cost
per region before and after, measured times (`measure=True`), e-graph size, iterations, stop
reason and phase timings. Its repr is a table; `.to_json()` round-trips; in notebooks it renders
as HTML; `.graph("before"|"after")` and `.render(dir)` draw the dataflow graphs with graphviz.

Regions. A *region* is a connected group of original equations that the optimized program no
longer computes as written (rewritten or removed), joined along the program's dataflow; the new
e-nodes that replace them belong to the region they were reached from. Everything else is the
`unchanged` row. Predicted costs per region sum (with that row) to the report's totals.

Where rules fired. egglog reports match counts per rule, not locations. For each rule that fired,
explain re-encodes the original program, runs that rule alone for one iteration and records the
equations whose e-class it grew: the rule's matches in the program as written. A rule that only
matched terms created by other rules has no such sites and is listed as "on rewritten terms".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

from . import compat, signature
from .errors import InvalidArgumentError
from .explain_render import ExplanationViews
from .logs import fn_name
from .options import POSITIONAL_KINDS, signature_of
from .rewrite.cost import speedup

__all__ = ["explain", "Explanation", "EquationInfo", "RuleSite", "Region"]

log = logging.getLogger("jaxrw")

# Options of explain itself (everything else is passed to optimize, or to the function when
# explaining an Optimized).
EXPLAIN_OPTIONS = ("measure", "sites", "samples")
DISABLED_NOTE = "JAXRW_DISABLE is set: calls run jax.jit; shown is what jaxrw would do"


@dataclass
class EquationInfo:
    """One equation of the original program (calls inlined), in program order."""

    index: int
    primitive: str
    text: str  # operand and result types
    source: str  # file:line (function), or "" where jax recorded none
    status: str  # kept | rewritten | removed | shared | unused
    region: int | None = None


@dataclass
class RuleSite:
    """A rule that fired: how often, and which original equations it matched."""

    name: str
    family: str
    identity: str
    exact: bool
    matches: int
    sites: list[int] | None  # equation indices; None when locating failed
    # some site lies in a region the extracted program changed. Not that this rule's rewrite was
    # taken there: a rule matching where another's was (factor_right beside the factor_left
    # taken) reads the same; e-nodes keep no record of the rule that made them
    at_change: bool = False


@dataclass
class Region:
    """A connected group of changed equations and the new nodes that replace them."""

    id: int
    equations: list[int]
    rules: list[str]  # rules matched at its equations (RuleSite.at_change: not all were taken)
    cost_before: float
    cost_after: float
    before_ops: dict[str, int]  # primitive -> count in the original
    after_ops: dict[str, int]  # op -> count of new e-nodes
    sources: list[str]

    @property
    def predicted_speedup(self) -> float:
        return speedup(self.cost_before, self.cost_after)


@dataclass(repr=False)  # the repr is the table of ExplanationViews
class Explanation(ExplanationViews):
    """The report `explain` returns. Plain data: `to_json()`/`from_json()` round-trip it."""

    name: str
    signature: list[str]
    options: dict[str, Any]
    status: str  # rewritten | kept | fallback
    note: str
    report: dict[str, Any] | None
    phases: dict[str, float]
    equations: list[EquationInfo] = field(default_factory=list)
    rules: list[RuleSite] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    unchanged_cost: tuple[float, float] = (0.0, 0.0)
    jaxpr_before: str = ""
    jaxpr_after: str | None = None
    measured: dict[str, dict[str, float]] | None = None
    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)
    bodies: list[Explanation] = field(default_factory=list)  # control-flow bodies, each explained
    where: str = ""  # for a body: its equation and the user's line ("scan body @ model.py:12 (f)")
    result: Any = field(default=None, repr=False, compare=False)  # the RewriteResult (not serialized)

    @property
    def cost_before(self) -> float:
        return self.report["cost_before"] if self.report else 0.0

    @property
    def cost_after(self) -> float:
        return self.report["cost_after"] if self.report else 0.0

    @property
    def predicted_speedup(self) -> float:
        return speedup(self.cost_before, self.cost_after)

    @property
    def measured_speedup(self) -> float | None:
        m = self.measured
        if not m or "jax.jit" not in m or "jaxrw" not in m:
            return None
        return m["jax.jit"]["median_s"] / m["jaxrw"]["median_s"]

    def to_dict(self) -> dict[str, Any]:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("result", "bodies")
        }
        d = json.loads(json.dumps(d, default=_jsonable))  # nested dataclasses -> plain data
        d["unchanged_cost"] = list(self.unchanged_cost)
        d["bodies"] = [b.to_dict() for b in self.bodies]
        return d

    def to_json(self, **kw: Any) -> str:
        """This explanation as JSON (`json.dumps` options in `kw`); `from_json` reads it back."""
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Explanation:
        d = dict(d)
        d["equations"] = [EquationInfo(**e) for e in d.get("equations", [])]
        d["rules"] = [RuleSite(**r) for r in d.get("rules", [])]
        d["regions"] = [Region(**r) for r in d.get("regions", [])]
        d["unchanged_cost"] = tuple(d.get("unchanged_cost", (0.0, 0.0)))
        d["bodies"] = [cls.from_dict(b) for b in d.get("bodies", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Explanation:
        """The explanation `to_json` wrote."""
        return cls.from_dict(json.loads(text))


# --- entry point -----------------------------------------------------------------------------


def explain(
    fn: Callable, *args: Any, measure: bool = False, sites: bool = True, samples: int = 7, **opts: Any
) -> Explanation:
    """Explain how jaxrw rewrites `fn` for these arguments.

    `fn` is a plain function (then `opts` are `optimize` options) or an `Optimized` (then `opts`
    are keyword arguments of the function, except those named in EXPLAIN_OPTIONS, which are
    explain's). Arguments may be jax.ShapeDtypeStructs, unless `measure=True`, which times jax.jit
    against jaxrw on these arguments (`samples` interleaved samples, on copies of the functions
    that donate nothing); `sites=False` skips locating each rule's matches.
    """
    from .api import Optimized, optimize

    if isinstance(fn, Optimized):
        opt, call_kw = fn, opts
    else:
        opt, call_kw = optimize(fn, **opts), {}
    if measure and signature.abstract(args, call_kw):
        raise InvalidArgumentError(
            "explain(measure=True) times the function on arrays, and these arguments hold a "
            "jax.ShapeDtypeStruct; valid: arrays, or measure=False to explain from shapes alone"
        )
    clone = dataclasses.replace(opt, _cache={}, _keep=True)
    clone._split_note = opt._split_note  # a tensor-parallel first call keeps every signature as written
    clone._fast_state = "disabled" if opt._is_disabled() else "off"  # JAXRW_DISABLE as opt's calls read it
    t0 = time.perf_counter()
    report = clone.report(*args, **call_kw)
    total_build = time.perf_counter() - t0
    (entry,) = clone._cache.values()
    t0 = time.perf_counter()
    ex = _build(opt, entry, report, sites)
    sig = signature_of(opt.fn, follow_wrapped=False)  # the function called, not what it wraps
    params = [p for p in (sig.parameters.values() if sig else ()) if p.kind in POSITIONAL_KINDS]
    named = {i: p.name for i, p in enumerate(params)}
    static = set(opt.static_argnums)
    positional = [named.get(i, f"args[{i}]") for i in range(len(args)) if i not in static]
    ex.signature = _named(ex.signature, clone._split(args, call_kw)[0], positional)
    if entry.trace is not None:
        ex.phases["trace"] = max(0.0, total_build - sum(report.phase_s.values()) if report else 0.0)
    if measure:
        t = time.perf_counter()
        ex.measured = _measure(opt, args, call_kw, samples)
        ex.phases["measure"] = time.perf_counter() - t
    ex.phases["explain"] = time.perf_counter() - t0 - ex.phases.get("measure", 0.0)
    log.debug("explain %s: %d regions, %d rules", ex.name, len(ex.regions), len(ex.rules))
    return ex


def _build(opt: Any, entry: Any, report: Any, sites: bool) -> Explanation:
    from .rewrite.cost import get_cost_model

    options = {
        k: _plain(getattr(opt, k)) for k in ("rules", "cost_model", "extractor", "numerics", "autotune")
    }
    options["limits"] = dataclasses.asdict(opt.limits)
    off = opt._is_disabled()
    if off:
        options["JAXRW_DISABLE"] = os.environ.get("JAXRW_DISABLE", "1")
    name = fn_name(opt.fn)
    if entry.trace is None:
        return Explanation(name, [], options, "fallback", entry.fallback or "", None, {})
    closed, result, profile = entry.trace
    signature = [a.str_short() for a in closed.in_avals]
    if result is None:  # optimize fell back to jax.jit
        return Explanation(
            name, signature, options, "fallback", entry.fallback or "", None, {}, jaxpr_before=_pretty(closed)
        )
    model = get_cost_model(opt.cost_model, profile)
    return _explained(name, closed, result, model, options, sites, DISABLED_NOTE if off else "", report)


def _explained(
    name: str,
    closed: Any,
    result: Any,
    model: Any,
    options: dict,
    sites: bool,
    note: str = "",
    report: Any = None,
    where: str = "",
) -> Explanation:
    """The explanation of one program (`closed`, rewritten as `result`; `report`: the one its
    caller was given, default the result's; `where`: a body's place in the user's code), and of
    the control-flow bodies rewritten within it, each an explanation of its own
    (`Explanation.bodies`)."""
    from .rewrite.run import bodies_row

    report = result.report if report is None else report
    notes = [note, report.guard_note]
    if any(b.rewritten for b in report.bodies):  # each has a table of its own: ex.bodies
        notes.append(bodies_row(report.bodies))
    if report.autotune:
        notes.append(f"autotune winner: {report.autotune.get('winner')}")
    ex = Explanation(
        name,
        [a.str_short() for a in closed.in_avals],
        options,
        "rewritten" if report.rewritten else "kept",
        "; ".join(n for n in notes if n),
        report.to_dict(),
        dict(report.phase_s),
        jaxpr_before=_pretty(closed),
        where=where,
        result=result,
    )
    wheres = _distinct([w for w, _ in result.bodies])
    ex.bodies = [
        _explained(
            f"{name} / {w}", b.closed if b.written is None else b.written, b, model, options, sites, where=w
        )
        for w, (_, b) in zip(wheres, result.bodies, strict=True)
    ]
    if result.fn is not None:
        try:
            specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.in_avals]
            ex.jaxpr_after = _pretty(jax.make_jaxpr(result.fn)(*specs))
        except Exception as e:  # noqa: BLE001 - the explanation still stands without it
            ex.jaxpr_after = f"(could not trace the optimized program: {type(e).__name__}: {e})"
    if result.view is None:  # never encoded (zero-size values, over the limits): the report says why
        return ex
    try:
        _analyze(ex, closed, result, model, report, sites)
    except Exception as e:  # noqa: BLE001 - a partial explanation beats none
        log.warning("explain %s: equation mapping failed: %s: %s", name, type(e).__name__, e)
        ex.note = (ex.note + "; " if ex.note else "") + f"equation mapping failed ({type(e).__name__}: {e})"
    return ex


def _distinct(names: list[str]) -> list[str]:
    """Names made distinct by numbering repeats ("scan body @ f.py:3 (f) #2"): bodies made on one
    source line (a loop of scans) named one file in `render()` and one title in the tables."""
    total, seen = Counter(names), Counter()
    out = []
    for n in names:
        seen[n] += 1
        out.append(f"{n} #{seen[n]}" if total[n] > 1 else n)
    return out


def _named(signature: list[str], dyn: tuple, positional: list[str]) -> list[str]:
    """Leaves labelled where the flat types alone do not say whose they are: a keyword's with its
    name (`scale=float32[]`; flat, keywords come sorted, after the positional ones), and the leaves
    of a positional container with the parameter's name and their path (`params['w']=f32[4,4]`;
    an NNX state of dozens of leaves read as a row of bare shapes). A lone array stays a type."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(dyn)[0]]
    if len(paths) != len(signature):
        return signature
    out = []
    for path, text in zip(paths, signature, strict=True):
        keyword = path[0].idx == 1 and isinstance(path[1], jax.tree_util.DictKey)
        if keyword:
            out.append(f"{path[1].key}{jax.tree_util.keystr(path[2:])}={text}")
        elif len(path) > 2 and path[1].idx < len(positional):  # a leaf inside a positional container
            out.append(f"{positional[path[1].idx]}{jax.tree_util.keystr(path[2:])}={text}")
        else:
            out.append(text)
    return out


def _pretty(closed: Any) -> str:
    """The jaxpr as text without terminal colors (jax 0.11/0.12 color it when it thinks it may)."""
    try:
        return closed.pretty_print(use_color=False)
    except TypeError:  # pragma: no cover - a jax without the keyword
        return str(closed)


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    raise TypeError(f"not JSON-serializable: {type(v).__name__}")


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return getattr(v, "name", None) or type(v).__name__


def _measure(opt: Any, args: tuple, kw: dict, samples: int) -> dict[str, dict[str, float]]:
    """Time jax.jit and jaxrw the way a caller runs them (jaxrw on its fast path), on copies that
    donate nothing: every sample reuses `args`, which are the caller's and stay theirs."""
    from .rewrite.measure import time_interleaved

    timed = dataclasses.replace(opt, _cache={}, donate_argnums=(), donate_argnames=(), _keep=False)
    fns = {"jax.jit": lambda: timed._jitted(*args, **kw), "jaxrw": lambda: timed(*args, **kw)}
    timings = time_interleaved(fns, (), samples=samples)
    return {k: {"median_s": t.median, "spread": t.spread} for k, t in timings.items()}


# --- analysis --------------------------------------------------------------------------------


def _eqn_text(eqn: Any) -> str:
    ins = ", ".join(v.aval.str_short() if hasattr(v, "aval") else str(v) for v in eqn.invars)
    outs = ", ".join(v.aval.str_short() for v in eqn.outvars)
    return f"{ins} -> {outs}"


def _node_map(src: Any, dst: Any) -> dict[str, str]:
    """Each class of the unrewritten view `src` -> the id of the same e-node in `dst` (an e-graph
    grown from it: its original nodes are still there, under canonical children)."""
    from .rewrite.extract import reachable

    index = {(n.op, n.attrs, n.children): nid for nid, n in dst.nodes.items()}
    only = {c: nids[0] for c, nids in src.classes.items()}
    out: dict[str, str] = {}
    for c in reachable(src, only, list(src.classes)):
        n = src.nodes[only[c]]
        kids = tuple(dst.nodes[out[ch]].eclass if ch in out else None for ch in n.children)
        nid = index.get((n.op, n.attrs, kids))
        if nid is not None:
            out[c] = nid
    return out


def _rule_sites(program: Any, before: Any, rule: Any) -> set[str]:
    """Classes of `before` whose e-class grows when `rule` runs once on the program as written
    (`program`: its unrewritten encoding, restored afterwards with egglog's push/pop)."""
    from .rewrite.graph import EGraphView
    from .rewrite.run import Limits, RewriteReport, saturate

    program.egraph.push()
    try:
        saturate(program, [rule], Limits(iterations=1), RewriteReport())
        view = EGraphView.from_egraph(program.egraph)
    finally:
        program.egraph.pop()
    nmap = _node_map(before, view)
    owner = {nid: c for c, nid in nmap.items()}
    sites = set()
    for c, nid in nmap.items():
        members = view.classes[view.nodes[nid].eclass]
        if any(m not in owner for m in members) or len({owner[m] for m in members if m in owner}) > 1:
            sites.add(c)
    return sites


def _analyze(ex: Explanation, closed: Any, result: Any, model: Any, report: Any, want_sites: bool) -> None:
    """Fill equations, rules, regions, costs and graphs of `ex`."""
    from .rewrite.effects import encoded_positions
    from .rewrite.encode import encode, encoded_equations
    from .rewrite.extract import node_costs, reachable
    from .rewrite.graph import EGraphView, components
    from .rewrite.rules import RULES, select_rules
    from .rewrite.terms import analysis

    encoded = closed if result.closed is None else result.closed  # without jax.debug calls (effects.py)
    eqns, eqns_encoded = list(encoded_equations(closed.jaxpr)), list(encoded_equations(encoded.jaxpr))
    at = encoded_positions(eqns, eqns_encoded)  # numbered as the user's program has them
    eqns, at = (eqns, at) if at is not None else (eqns_encoded, range(len(eqns_encoded)))
    program = encode(encoded)
    program.egraph.run(analysis.saturate())
    before = EGraphView.from_egraph(program.egraph)
    eqn_of = {c: at[i - 1] for c, i in before.order.items()}  # before class -> equation
    classes_of: dict[int, list[str]] = {}
    for c, i in eqn_of.items():
        classes_of.setdefault(i, []).append(c)
    only = {c: nids[0] for c, nids in before.classes.items()}
    live_before = reachable(before, only, before.outputs)
    live_before_set = set(live_before)
    bcosts = node_costs(before, model)

    if report.rewritten:
        view, choice, costs = result.view, result.extraction.choice, result.costs
        nmap = _node_map(before, view)
    else:  # the guard or autotune kept the program as written: that is the "after" side
        view, choice, costs = before, only, bcosts
        nmap = dict(only)
    live_after = reachable(view, choice, view.outputs)
    live_after_set = set(live_after)
    original_nodes = set(nmap.values())

    # status of each equation
    infos = []
    for i, eqn in enumerate(eqns):
        cs = classes_of.get(i, [])
        if not cs:
            status = "shared"
        elif not any(c in live_before_set for c in cs):
            status = "unused"
        elif any(c not in nmap for c in cs):
            status = "unknown"
        else:  # by the outputs that were used: one unused as written (eigh's vectors) says nothing
            used = [(nmap[c], view.nodes[nmap[c]].eclass) for c in cs if c in live_before_set]
            gone = [fc not in live_after_set for _, fc in used]
            if all(gone):
                status = "removed"
            elif any(gone) or any(choice[fc] != nid for nid, fc in used if fc in live_after_set):
                status = "rewritten"
            else:
                status = "kept"
        if eqn.effects:  # made as written: a call, or a loop kept by a hidden output (bound once)
            status = "kept"
        infos.append(EquationInfo(i, eqn.primitive.name, _eqn_text(eqn), compat.source_line(eqn), status))
    ex.equations = infos

    # regions: connected groups of changed equations along the original dataflow
    changed = [e.index for e in infos if e.status in ("rewritten", "removed")]
    in_changed = set(changed)
    links = (
        (i, j)
        for i in changed
        for c in classes_of[i]
        for ch in before.nodes[only[c]].children
        if (j := eqn_of.get(ch)) is not None and j in in_changed
    )
    group = components(changed, links)
    roots = sorted(set(group.values()))
    rid = {r: k for k, r in enumerate(roots)}
    for i in changed:
        infos[i].region = rid[group[i]]

    # new nodes of the extraction, assigned to the region they are reached from
    region_of: dict[str, int] = {}
    for i in changed:
        for c in classes_of[i]:
            fc = view.nodes[nmap[c]].eclass
            if fc in live_after_set and choice[fc] not in original_nodes:
                region_of.setdefault(fc, infos[i].region)
    for fc in reversed(live_after):
        if fc not in region_of:
            continue
        for ch in view.nodes[choice[fc]].children:
            if choice[ch] not in original_nodes:
                region_of.setdefault(ch, region_of[fc])
    regions = [Region(k, [], [], 0.0, 0.0, {}, {}, []) for k in range(len(roots))]
    other = Region(len(roots), [], [], 0.0, 0.0, {}, {}, [])
    unchanged_before = unchanged_after = 0.0
    for c in live_before:
        i = eqn_of.get(c)
        cost = bcosts[only[c]]
        if i is not None and infos[i].region is not None:
            regions[infos[i].region].cost_before += cost
        else:
            unchanged_before += cost
    for fc in live_after:
        nid = choice[fc]
        if nid in original_nodes:
            unchanged_after += costs[nid]
            continue
        r = regions[region_of[fc]] if fc in region_of else other
        r.cost_after += costs[nid]
        op = _op_label(view.nodes[nid])
        r.after_ops[op] = r.after_ops.get(op, 0) + 1
    for i in changed:
        r = regions[infos[i].region]
        r.equations.append(i)
        r.before_ops[infos[i].primitive] = r.before_ops.get(infos[i].primitive, 0) + 1
        if infos[i].source and infos[i].source not in r.sources:
            r.sources.append(infos[i].source)
    if other.after_ops:
        regions.append(other)
    ex.unchanged_cost = (unchanged_before, unchanged_after)

    # rules: counts from the run, sites from one-rule runs on the program as written
    select_rules(None)  # loads every family into RULES
    known = RULES
    for name, n in sorted(report.rules_fired.items(), key=lambda kv: -kv[1]):
        rule = known.get(name)
        site_eqns: list[int] | None = None
        if want_sites and rule is not None:
            try:
                site_eqns = sorted({eqn_of[c] for c in _rule_sites(program, before, rule) if c in eqn_of})
            except Exception as e:  # noqa: BLE001 - sites are best effort
                log.debug("explain: locating %s failed: %s", name, e)
        rs = RuleSite(
            name,
            rule.family if rule else "",
            rule.identity if rule else "",
            bool(rule and rule.exact),
            int(n),
            site_eqns,
        )
        rs.at_change = bool(site_eqns) and any(infos[i].region is not None for i in site_eqns)
        ex.rules.append(rs)
        for i in site_eqns or []:
            reg = infos[i].region
            if reg is not None and name not in regions[reg].rules:
                regions[reg].rules.append(name)
    ex.regions = regions
    ex.graphs = {
        "before": _graph(before, only, live_before, lambda c: eqn_of.get(c), infos, set()),
        "after": _graph(view, choice, live_after, lambda c: None, infos, original_nodes, region_of),
    }


def _op_label(node: Any) -> str:
    if node.op in ("unary", "binary", "op") and node.attrs and isinstance(node.attrs[0], str):
        return node.attrs[0]
    return node.op


def _graph(
    view: Any,
    choice: dict,
    live: list[str],
    eqn_at: Callable,
    infos: list[EquationInfo],
    original: set[str],
    region_of: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Plain-data dataflow graph of one program: nodes (id, label, kind, region) and edges."""
    nodes, edges = [], []
    outs = {c: k for k, c in reversed(list(enumerate(view.outputs)))}
    for c in live:
        n = view.nodes[choice[c]]
        shape = "x".join(str(d) for d in view.shapes.get(c, ())) or "scalar"
        label = f"{_op_label(n)}\n{view.dtypes.get(c, '')}[{shape}]"
        if n.op in ("var", "const"):
            label = f"{n.op} {n.attrs[0]}\n{view.dtypes.get(c, '')}[{shape}]"
            kind, region = "input", None
        elif region_of is None:  # the original program
            i = eqn_at(c)
            info = infos[i] if i is not None else None
            kind = info.status if info else "kept"
            region = info.region if info else None
            if info:
                label = f"#{i} {label}"
        else:
            kind = "kept" if choice[c] in original else "new"
            region = region_of.get(c)
        if c in outs:
            label += f"\n→ out {outs[c]}"
        nodes.append({"id": c, "label": label, "kind": kind, "region": region})
        edges.extend([ch, c] for ch in dict.fromkeys(n.children))
    return {"nodes": nodes, "edges": edges}

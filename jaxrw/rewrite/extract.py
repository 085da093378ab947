"""Extractors: pick one e-node per needed e-class so the program's cost is lowest.

Registered by name (`register_extractor`): `greedy` (DAG-aware: a class's cost is the set of
distinct nodes below it, so shared subterms count once; tree costs above a size limit), `ilp`
(exact, HiGHS; falls back to greedy past its size or time limit and says so) and `tree` (plain
bottom-up sums, the classic egg extractor). Every result reports which extractor actually ran.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidOptionError
from .cost import CostModel, check_plugin
from .graph import EGraphView

__all__ = [
    "Extraction",
    "EXTRACTORS",
    "register_extractor",
    "get_extractor",
    "dag_cost",
    "reachable",
    "find_cycle",
    "greedy_dag",
    "share",
    "tree",
    "ilp",
    "alternatives",
    "fingerprint",
]

GREEDY_DAG_MAX_CLASSES = 4000
ILP_MAX_NODES = 20_000
ILP_TIME_LIMIT_S = 5.0
ILP_GAP = 1e-4  # relative optimality gap at which HiGHS stops
ILP_SCALE = 1e6  # greedy's program's cost in the ILP's units, far above HiGHS's absolute tolerances
# work `share` may spend improving a greedy choice, in steps of its own (a class tried, a reader
# visited, a count updated, a kept switch's re-pricing): a count, not seconds, so that one program
# extracts the same on a busy machine as on an idle one (a time budget of 1 s kept an unrolled
# RNN as written under load and rewrote it idle). 250k steps: ~2 s on this project's 2-core host,
# about twice what that RNN needs (133k)
SHARE_BUDGET_STEPS = 250_000


@dataclass
class Extraction:
    choice: dict[str, str]  # e-class -> node id
    cost: float
    extractor: str  # which one ran
    note: str = ""


def node_costs(view: EGraphView, model: CostModel) -> dict[str, float]:
    costs = {}
    for nid, n in view.nodes.items():
        c = float(model.node_cost(n, view))
        if not c >= 0 or math.isinf(c):
            raise ValueError(
                f"cost model {model.name!r} gave {c!r} for {n.op}; costs must be finite and >= 0"
            )
        costs[nid] = c
    return costs


def _walk(view: EGraphView, choice: dict[str, str], roots: list[str]) -> tuple[list[str], list[str] | None]:
    """Depth-first over the chosen nodes: (classes needed, children before parents; the classes of
    the first cycle met, or None)."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in roots:
        if state.get(root):
            continue
        path = [root]
        state[root] = 1
        iters = [iter(view.nodes[choice[root]].children)]
        while iters:
            ch = next(iters[-1], None)
            if ch is None:
                iters.pop()
                c = path.pop()
                state[c] = 2
                order.append(c)
                continue
            s = state.get(ch, 0)
            if s == 1:
                return order, path[path.index(ch) :]
            if s == 0:
                state[ch] = 1
                path.append(ch)
                iters.append(iter(view.nodes[choice[ch]].children))
    return order, None


def reachable(view: EGraphView, choice: dict[str, str], roots: list[str]) -> list[str]:
    """Classes the choice needs, children before parents; raises on a cycle."""
    order, cycle = _walk(view, choice, roots)
    if cycle is not None:
        raise ValueError(f"extracted program has a cycle through e-class {cycle[0]}")
    return order


def find_cycle(view: EGraphView, choice: dict[str, str], roots: list[str]) -> list[str] | None:
    """The classes of a cycle in the chosen program, or None when it is a DAG."""
    return _walk(view, choice, roots)[1]


def dag_cost(view: EGraphView, choice: dict[str, str], costs: dict[str, float]) -> float:
    return math.fsum(costs[choice[c]] for c in reachable(view, choice, view.outputs))


def _worklist(view: EGraphView) -> tuple[dict[str, list[str]], deque[str], set[str]]:
    """For bottom-up extraction: the nodes reading each class, and a queue of the leaf nodes."""
    parents: dict[str, list[str]] = {}
    for nid, n in view.nodes.items():
        for ch in set(n.children):
            parents.setdefault(ch, []).append(nid)
    queue = deque(nid for nid, n in view.nodes.items() if not n.children)
    return parents, queue, set(queue)


def tree(view: EGraphView, costs: dict[str, float]) -> dict[str, str]:
    """Bottom-up fixpoint on tree costs (shared subterms counted at every use), worklist-driven:
    a node is revisited only when a child class got cheaper (full passes until nothing changes
    took O(depth) passes: minutes for a 20,000-equation program)."""
    parents, queue, queued = _worklist(view)
    best: dict[str, tuple[float, str]] = {}
    while queue:
        nid = queue.popleft()
        queued.discard(nid)
        n = view.nodes[nid]
        if not all(ch in best for ch in n.children):
            continue
        c = n.eclass
        total = costs[nid] + sum(best[ch][0] for ch in n.children)
        if c not in best or total < best[c][0] - 1e-18:
            best[c] = (total, nid)
            for p in parents.get(c, ()):
                if p not in queued:
                    queued.add(p)
                    queue.append(p)
    return {c: nid for c, (_, nid) in best.items()}


def greedy_dag(view: EGraphView, costs: dict[str, float]) -> dict[str, str]:
    """Bottom-up, worklist-driven: a class's cost is the sum over the distinct classes below it.

    Each candidate node starts from the largest child set (copied in C) and adds only what the
    other children bring, so a chain of n nodes costs O(n) Python steps per node at most."""
    parents, queue, queued = _worklist(view)
    best: dict[str, tuple[float, frozenset[str], str]] = {}
    own: dict[str, float] = {}  # cost of the node currently chosen for each class
    while queue:
        nid = queue.popleft()
        queued.discard(nid)
        n = view.nodes[nid]
        c = n.eclass
        kids = set(n.children)
        if not all(k in best for k in kids):
            continue
        if kids:  # sorted: ties go the same way in every process (str hashes are salted)
            base = max(sorted(kids), key=lambda k: len(best[k][1]))
            total, below = best[base][0], set(best[base][1])
            for k in kids:
                if k != base:
                    extra = best[k][1] - below
                    if extra:
                        below |= extra
                        total += math.fsum(own[x] for x in extra)  # exact: no order to depend on
        else:
            total, below = 0.0, set()
        if c in below:
            continue  # would close a cycle
        total += costs[nid]
        if c not in best or total < best[c][0] - 1e-18:
            below.add(c)
            best[c] = (total, frozenset(below), nid)
            own[c] = costs[nid]
            for p in parents.get(c, ()):
                if p not in queued:
                    queued.add(p)
                    queue.append(p)
    return {c: nid for c, (_, _, nid) in best.items()}


class _Usage:
    """The chosen program as reference counts (how many chosen nodes, or outputs, read each
    class) and its DAG cost, updated under switches and undone from a log: a trial costs what it
    touches instead of a walk over the whole program."""

    def __init__(self, view: EGraphView, choice: dict[str, str], costs: dict[str, float]):
        self.view, self.choice, self.costs = view, dict(choice), costs
        self.refs: dict[str, int] = {}
        self.cost = 0.0
        self.log: list[tuple[str, int]] = []  # (class, +1/-1) since the last `commit`
        self.changed: dict[str, str] = {}  # class -> its node before the trial
        for root in view.outputs:
            self._add(root, +1)
        self.log.clear()

    def selected(self, c: str) -> bool:
        return self.refs.get(c, 0) > 0

    def _add(self, c: str, d: int) -> None:
        """Count one more (d=+1) or one fewer (d=-1) reader of `c`; a class that gains its first
        reader or loses its last brings in or releases its chosen node's children."""
        stack = [c]
        while stack:
            c = stack.pop()
            n = self.refs.get(c, 0) + d
            self.refs[c] = n
            self.log.append((c, d))
            if n == (1 if d > 0 else 0):
                nid = self.choice[c]  # KeyError: a class greedy left without a choice
                self.cost += d * self.costs[nid]
                stack.extend(self.view.nodes[nid].children)

    def switch(self, c: str, nid: str) -> None:
        """Compute class `c` with node `nid` instead."""
        old = self.choice[c]
        self.changed.setdefault(c, old)
        self.choice[c] = nid
        if self.selected(c):
            self.cost += self.costs[nid] - self.costs[old]
            for ch in self.view.nodes[nid].children:  # add first: shared children stay counted
                self._add(ch, +1)
            for ch in self.view.nodes[old].children:
                self._add(ch, -1)

    def undo(self, cost: float) -> None:
        for c, d in reversed(self.log):
            self.refs[c] -= d
        self.choice.update(self.changed)
        self.cost = cost
        self.commit()

    def commit(self) -> None:
        self.log.clear()
        self.changed.clear()


def _sharing_switch(
    view: EGraphView, readers: dict[str, list[str]], use: _Usage, costs: dict[str, float], x: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The switches that make the program read class `x` wherever it can: (classes not computed
    now, to be computed by their node reading x; computed classes, switched to their node reading
    x or reading one of the former). The second level finds sharing two steps away, such as the
    row blocks of one product (batch.index_rows) that slices of each step's merged product read:
    no single-level switch reaches it once each step computes its own product."""
    inner: dict[str, str] = {}
    switch: dict[str, str] = {}

    def offer(p: str, nid: str, into: dict[str, str]) -> None:
        if use.choice.get(p) != nid and (p not in into or costs[nid] < costs[into[p]]):
            into[p] = nid

    for nid in readers.get(x, ()):
        p = view.nodes[nid].eclass
        if p == x:
            continue  # a node of x reading x (X[0:n] where that is all of X) would be a cycle
        if use.selected(p):
            offer(p, nid, switch)
        elif p in use.choice:
            outer = [r for r in readers.get(p, ()) if use.selected(view.nodes[r].eclass)]
            if outer:
                offer(p, nid, inner)
                for r in outer:
                    offer(view.nodes[r].eclass, r, switch)
    for p in set(inner) & set(switch):  # a class computed already keeps its direct switch
        del inner[p]
    return inner, switch


def share(
    view: EGraphView, costs: dict[str, float], choice: dict[str, str], budget: int = SHARE_BUDGET_STEPS
) -> dict[str, str]:
    """Improve a choice by sharing: for a class X, switch every chosen class that has a node
    reading X to that node, so X is computed once for all of them; keep the switch when the whole
    program gets cheaper. Per-class greedy cannot see this (each of A@B, A@C alone is cheaper than
    a slice of A@[B|C]; together they may not be). First improvement, passes until none is left
    or `budget` steps are spent (SHARE_BUDGET_STEPS). Trials are priced incrementally
    (`_Usage`); a kept switch is checked for cycles and re-priced from scratch."""
    readers = _worklist(view)[0]
    use = _Usage(view, choice, costs)
    steps = 0
    improved = True
    while improved:
        improved = False
        for x in sorted(readers):
            if steps >= budget:
                return use.choice
            inner, switch = _sharing_switch(view, readers, use, costs, x)
            steps += 1 + len(readers[x]) + len(inner) + len(switch)
            # one reader alone switching to a class not yet computed is what greedy already
            # weighed for that reader; only sharing (two or more readers, or a class the
            # program computes anyway) can pay
            if not switch or (len(switch) < 2 and not use.selected(x)):
                continue
            before = use.cost
            try:
                for p, nid in (*inner.items(), *switch.items()):  # inner first: not yet read
                    use.switch(p, nid)
            except KeyError:  # a class greedy left without a choice
                use.undo(before)
                continue
            steps += len(use.log)
            if use.cost < before * (1 - 1e-9) and find_cycle(view, use.choice, view.outputs) is None:
                use = _Usage(view, use.choice, costs)  # exact again (a dropped cycle may linger in counts)
                steps += 2 * view.n_classes
                improved = True
            else:
                use.undo(before)
    return use.choice


def _greedy(view: EGraphView, costs: dict[str, float]) -> Extraction:
    if view.n_classes > GREEDY_DAG_MAX_CLASSES:
        choice = tree(view, costs)
        return Extraction(
            choice,
            dag_cost(view, choice, costs),
            "tree",
            f"{view.n_classes} classes > {GREEDY_DAG_MAX_CLASSES}: tree costs",
        )
    choice = share(view, costs, greedy_dag(view, costs))
    return Extraction(choice, dag_cost(view, choice, costs), "greedy")


def _tree(view: EGraphView, costs: dict[str, float]) -> Extraction:
    choice = tree(view, costs)
    return Extraction(choice, dag_cost(view, choice, costs), "tree")


def ilp(view: EGraphView, costs: dict[str, float], time_limit_s: float | None = None) -> Extraction:
    """Exact DAG extraction as a 0-1 program solved by HiGHS; greedy's program when it is not
    cheaper or HiGHS gives no answer in time.

    Acyclicity is enforced lazily: solve, and while the chosen program has a cycle, forbid that
    cycle (at most len-1 of its nodes) and solve again. Cheaper than ordering variables for every
    class, and the e-graphs jaxrw builds rarely offer a cycle worth taking. No warm start: with
    greedy's program set as one (highspy 1.16), HiGHS reported a lower optimum but handed the
    start back as its solution. Costs go in scaled so greedy's program costs ILP_SCALE: in seconds
    (1e-7..1e-5 a node) they sat at HiGHS's absolute tolerances, and it stopped short of the
    optimum. Rows are built in sorted order, so ties break alike in every process."""
    time_limit_s = ILP_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    t0 = time.perf_counter()  # the limit covers building the program too (50 chains: 3 s of it)
    start = _greedy(view, costs)
    try:
        import highspy
    except ImportError:
        start.note = f"highspy not installed: {start.extractor} used (pip install 'jaxrw[exact]')"
        return start
    live = _live_classes(view)
    nids = [nid for c in live for nid in view.classes[c]]
    if len(nids) > ILP_MAX_NODES:
        start.note = f"{len(nids)} nodes > ILP limit {ILP_MAX_NODES}: {start.extractor} used"
        return start
    # highspy's Highs() (1.16) enables its callbacks in __init__, which prints HiGHS's banner to
    # stdout before output_flag can be set (ERGO-Code/HiGHS#2749); the core class it wraps does
    # not, and has every method used here
    h = getattr(getattr(highspy, "_core", None), "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", ILP_GAP)
    inf = highspy.kHighsInf
    col = {nid: i for i, nid in enumerate(nids)}
    scale = ILP_SCALE / start.cost if start.cost > 0 else 1.0
    for nid in nids:  # x_n in {0, 1}; a node reading its own class is never chosen
        self_loop = view.nodes[nid].eclass in view.nodes[nid].children
        h.addVar(0.0, 0.0 if self_loop else 1.0)
        h.changeColCost(col[nid], costs[nid] * scale)
    h.changeColsIntegrality(len(nids), list(range(len(nids))), [highspy.HighsVarType.kInteger] * len(nids))
    for root in sorted(set(view.outputs)):
        idx = [col[n] for n in view.classes[root]]
        h.addRow(1.0, inf, len(idx), idx, [1.0] * len(idx))
    for nid in nids:
        for ch in sorted(set(view.nodes[nid].children)):
            members = [col[m] for m in view.classes[ch]]
            # x_n <= sum(x_m for m in child class)
            h.addRow(0.0, inf, len(members) + 1, [*members, col[nid]], [1.0] * len(members) + [-1.0])
    rounds = 0
    while True:
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            start.note = f"ILP out of time after {rounds} rounds: {start.extractor} used"
            return start
        h.setOptionValue("time_limit", left)
        h.run()
        rounds += 1
        status = h.getModelStatus()
        if h.getInfo().primal_solution_status != 2:  # no feasible solution found
            # HiGHS checks its time limit between steps of its own: 50 chains of four products
            # took it 6 s against 4.3 s left (25 s on a loaded host): the time is said as it was
            took = time.perf_counter() - t0
            why = f"{h.modelStatusToString(status)} after {took:.1f} s of {time_limit_s:g} s"
            start.note = f"ILP found no solution ({why}): {start.extractor} used"
            return start
        x = h.getSolution().col_value
        choice = {}
        for c in live:
            chosen = [nid for nid in view.classes[c] if x[col[nid]] > 0.5]
            if chosen:
                choice[c] = min(chosen, key=lambda nid: costs[nid])
        cycle = find_cycle(view, choice, view.outputs)
        if cycle is None:
            break
        # forbid this cycle: not all of its nodes at once
        idx = [col[choice[c]] for c in cycle]
        h.addRow(-inf, len(idx) - 1.0, len(idx), idx, [1.0] * len(idx))
    cost = dag_cost(view, choice, costs)
    if cost > start.cost:
        start.note = f"ILP stopped above the {start.extractor} cost: {start.extractor} used"
        return start
    optimal = status == highspy.HighsModelStatus.kOptimal
    what = "optimal" if optimal else "time limit"
    return Extraction(choice, cost, "ilp", f"{what} in {time.perf_counter() - t0:.2f}s, {rounds} round(s)")


def _live_classes(view: EGraphView) -> list[str]:
    seen: set[str] = set()
    stack = list(view.outputs)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for nid in view.classes[c]:
            stack.extend(ch for ch in view.nodes[nid].children if ch not in seen)
    return sorted(seen)


def fingerprint(view: EGraphView, choice: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The nodes a choice actually uses (two choices with equal fingerprints are one program)."""
    return tuple(sorted((c, choice[c]) for c in reachable(view, choice, view.outputs)))


def alternatives(
    view: EGraphView, costs: dict[str, float], best: dict[str, str], k: int
) -> list[dict[str, str]]:
    """Up to `k` distinct programs, cheapest first: `best`, then for each class it uses that has
    other nodes, the greedy program that avoids its chosen node (measured top-k tries these)."""
    found = {fingerprint(view, best): best}
    for c in reachable(view, best, view.outputs):
        if len(found) >= 4 * k:
            break
        if len(view.classes[c]) < 2:
            continue
        banned = dict(costs)
        banned[best[c]] = 1e30
        try:
            choice = (
                greedy_dag(view, banned) if view.n_classes <= GREEDY_DAG_MAX_CLASSES else tree(view, banned)
            )
            fp = fingerprint(view, choice)
        except (KeyError, ValueError):
            continue
        if fp not in found and dag_cost(view, choice, costs) < 1e29:
            found[fp] = choice
    ranked = sorted(found.values(), key=lambda ch: dag_cost(view, ch, costs))
    return ranked[:k]


Extractor = Callable[[EGraphView, dict[str, float]], Extraction]
EXTRACTORS: dict[str, Extractor] = {"greedy": _greedy, "ilp": ilp, "tree": _tree}


_BUILT_IN_EXTRACTORS = frozenset(EXTRACTORS)


def register_extractor(name: str, fn: Extractor) -> None:
    """Make `fn(view, costs) -> Extraction` available as `optimize(..., extractor=name)`. A name of
    one's own may be registered again; a built-in one ("greedy", "ilp", "tree") may not be replaced."""
    check_plugin("extractor", name, fn, _BUILT_IN_EXTRACTORS)
    EXTRACTORS[name] = fn


def get_extractor(name: str) -> Extractor:
    if name not in EXTRACTORS:
        raise InvalidOptionError(f"unknown extractor {name!r}; valid: {sorted(EXTRACTORS)!r}")
    return EXTRACTORS[name]

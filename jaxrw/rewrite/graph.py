"""A read-only view of a saturated e-graph: tensor e-classes, their e-nodes, shapes and dtypes.

egglog serializes the e-graph once (`EGraph._serialize`, a JSON document); this module parses it
into plain Python records that the cost models, extractors and the decoder share, so none of
them walk egglog's objects or call back into it per node.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph

__all__ = ["Node", "EGraphView", "components"]

_TENSOR = ".Tensor"


@dataclass(frozen=True)
class Node:
    """One e-node: `op` is the constructor name (`dot`, `add`, `opaque`, ...), `children` the tensor
    e-classes it reads (Vec arguments flattened, in order), `attrs` its other arguments."""

    id: str
    op: str
    eclass: str
    children: tuple[str, ...]
    attrs: tuple[Any, ...]


@dataclass
class EGraphView:
    nodes: dict[str, Node]
    classes: dict[str, list[str]]  # tensor e-class -> node ids
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    outputs: list[str]  # output index -> e-class
    # classes an inexact rule changed -> the changing rules' bits (nonfinite.py; empty unless
    # numerics="default" guards them)
    touched: dict[str, int] = field(default_factory=dict)
    # inputs treated like constants: hoisted arguments whose work is done once, off the hot call
    slow: frozenset[int] = frozenset()
    # class -> the 1-based position of the original equation it holds (encode's `order` facts)
    order: dict[str, int] = field(default_factory=dict)
    _const: dict[str, bool] = field(default_factory=dict, repr=False)
    _gen: dict[str, bool] = field(default_factory=dict, repr=False)
    _outputs: frozenset[str] | None = field(default=None, repr=False)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @classmethod
    def from_egraph(cls, egraph: EGraph) -> EGraphView:
        raw = json.loads(egraph._serialize(split_primitive_outputs=False).to_json())
        return cls.from_json(raw)

    @classmethod
    def from_json(cls, raw: dict) -> EGraphView:
        rnodes: dict[str, dict] = raw["nodes"]
        ctype = {k: v["type"] for k, v in raw["class_data"].items()}
        by_class: dict[str, list[str]] = {}
        for nid, n in rnodes.items():
            by_class.setdefault(n["eclass"], []).append(nid)

        values: dict[str, Any] = {}  # value nodes are shared (a shape by every class of it)

        def value(nid: str) -> Any:
            got = values.get(nid, values)
            if got is not values:
                return got
            n = rnodes[nid]
            t = ctype[n["eclass"]]
            if t == "i64":
                got = int(n["op"])
            elif t == "String":
                got = json.loads(n["op"])
            elif t.startswith("Vec[") and n["op"] == "Vec":
                got = tuple(value(c) for c in n["children"])
            else:
                raise ValueError(f"unexpected e-graph value {n!r} of type {t}")
            values[nid] = got
            return got

        nodes: dict[str, Node] = {}
        classes: dict[str, list[str]] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, str] = {}
        outputs: dict[int, str] = {}
        order: dict[str, int] = {}
        touched: dict[str, int] = {}
        for nid, n in rnodes.items():
            op = n["op"]
            if op == "touched":
                vnode = next(v for v in by_class[n["eclass"]] if rnodes[v]["op"] != "touched")
                if value(vnode):
                    touched[rnodes[n["children"][0]]["eclass"]] = value(vnode)
                continue
            if op in ("shape", "dtype"):
                target = rnodes[n["children"][0]]["eclass"]
                vnode = next(v for v in by_class[n["eclass"]] if rnodes[v]["op"] not in ("shape", "dtype"))
                (shapes if op == "shape" else dtypes)[target] = value(vnode)
                continue
            if op == "order":  # its i64 class may hold other functions' nodes (level) of that value
                number = next(
                    (rnodes[v]["op"] for v in by_class[n["eclass"]] if rnodes[v]["op"].isdigit()), None
                )
                if number is not None:
                    order.setdefault(rnodes[n["children"][0]]["eclass"], int(number))
                continue
            if op == "Out.of":
                outputs[value(n["children"][0])] = rnodes[n["children"][1]]["eclass"]
                continue
            if not ctype.get(n["eclass"], "").endswith(_TENSOR):
                continue
            children: list[str] = []
            attrs: list[Any] = []
            for c in n["children"]:
                cn = rnodes[c]
                t = ctype[cn["eclass"]]
                if t.endswith(_TENSOR):
                    children.append(cn["eclass"])
                elif t.startswith("Vec[") and t.endswith(_TENSOR + "]"):
                    children.extend(rnodes[e]["eclass"] for e in cn["children"])
                else:
                    attrs.append(value(c))
            name = op.split(".", 1)[1] if op.startswith("Tensor.") else op
            nodes[nid] = Node(nid, name, n["eclass"], tuple(children), tuple(attrs))
            classes.setdefault(n["eclass"], []).append(nid)
        missing = [c for c in classes if c not in shapes]
        if missing:
            raise ValueError(f"{len(missing)} e-classes have no shape (first: {missing[0]})")
        outs = [outputs[i] for i in sorted(outputs)]
        return cls(nodes, classes, shapes, dtypes, outs, touched, order=order)

    @property
    def output_set(self) -> frozenset[str]:
        """The output classes, as a set."""
        got = self._outputs
        if got is None:
            got = self._outputs = frozenset(self.outputs)
        return got

    def is_constant(self, eclass: str) -> bool:
        """True when some node of the class is built from constants and slow inputs only."""
        if not self._const:
            self._const = _constant_classes(self)
        return self._const.get(eclass, False)

    def is_generated(self, eclass: str, fusible: frozenset[str]) -> bool:
        """True when some node of the class computes its value from indices and scalars alone
        (iota, and `fusible` ops of such classes, e.g. an identity matrix): a fused kernel makes
        it in registers, reading no memory."""
        if not self._gen:
            self._gen = _generated_classes(self, fusible)
        return self._gen.get(eclass, False)

    def with_slow(self, slow: frozenset[int]) -> EGraphView:
        """The same e-graph with `slow` inputs treated as constants (for hoisting)."""
        return dataclasses.replace(self, slow=frozenset(slow), _const={}, _gen={}, _outputs=None)


def _closure(view: EGraphView, holds: Callable[[Node, dict[str, bool]], bool]) -> dict[str, bool]:
    """The least fixpoint: a class is marked once one of its nodes `holds` given the marks so far."""
    mark = {c: False for c in view.classes}
    changed = True
    while changed:
        changed = False
        for c, nids in view.classes.items():
            if not mark[c] and any(holds(view.nodes[nid], mark) for nid in nids):
                mark[c] = changed = True
    return mark


def _constant_classes(view: EGraphView) -> dict[str, bool]:
    def holds(n: Node, const: dict[str, bool]) -> bool:
        if n.op == "opaque" or (n.op == "var" and n.attrs[0] not in view.slow):
            return False
        return n.op in ("const", "var") or all(const[ch] for ch in n.children)

    return _closure(view, holds)


def _generated_classes(view: EGraphView, fusible: frozenset[str]) -> dict[str, bool]:
    def holds(n: Node, gen: dict[str, bool]) -> bool:
        scalar_const = n.op == "const" and not view.shapes.get(n.eclass)
        fused = n.op in fusible and bool(n.children) and all(gen[ch] for ch in n.children)
        return n.op == "iota" or scalar_const or fused

    return _closure(view, holds)


def components(items: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> dict[Any, Any]:
    """Each item's representative in the connected groups that `edges` make (union-find; an
    edge (a, b) puts a's group under b's representative)."""
    root = {x: x for x in items}

    def find(x: Hashable) -> Hashable:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for a, b in edges:
        root[find(a)] = find(b)
    return {x: find(x) for x in root}

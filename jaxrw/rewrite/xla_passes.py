"""What XLA will still do to a program jaxrw hands it, priced so the guard compares like with like.

Node costs price each kernel where it stands. On a GPU, XLA's `DotMerger` pass then merges dots
that read one shared operand (x@Wq, x@Wk, x@Wv become x@concat(Wq, Wk, Wv) and slices) when they
are small. So a program as written may already run as one GEMM, and a rewrite that merges the
same dots gains nothing. `program_cost` adds that pass's effect to a DAG's node costs; the guard
prices the program before and after rewriting with it.

Measured on the H200 with jax 0.11.2 (`bench/dot_merger_h200.py` and `dot_merger_sizes.py`;
`results/h200-2026-12-03g-dot-merger*.json`):
- the 32 head projections of per_head_proj and the 16 matrix-vector products of
  stacked_matvec_16 compile to one dot each (3.5x and 4.3x faster than with the merger off);
- three 1024² projections of one input compile to one dot after a per-call concatenation, which
  made them slower (0.80x);
- x@W1, x@W2 merge while each W holds up to 36 MB (f32, 3000²) but not at 64 MiB (4096²); two
  32 MiB bf16 weights merge and a third then stays apart; x@W (64 MiB) and x@A (a LoRA update)
  stay apart; W@v1, W@v2 merge with W at 64 MiB: the shared operand does not count;
- W@v with W 2048² (and llama288's 288² projections of one vector) compiles to no dot at all:
  XLA's GPU algebraic simplifier turns a matrix-vector product whose operands hold fewer than
  10M elements into a multiply and a reduction (`ShouldStrengthReduceDotToReduce`), which the
  merger never sees;
- x@W and x@A with W 2048² and A 2048x16 stay apart (f32 and in a bf16 LoRA pair): every merge
  seen was of dots whose other operands have one shape.
The rule fitted to these: a dot is a candidate when its other operand and its output hold at most
64 MiB, and a group takes a candidate while the group's own such bytes are still within it.

The emulation follows the pass: dots are grouped by an operand they share (same e-class, same
side, same dimension numbers and dtypes, other operands of one shape with at most one free
dimension),
taken in program order; a dot joins a group when it does not depend on a member nor a member on
it. A merged group is one GEMM over the concatenated other operands; that concatenation is free
for constants (folded once) and a copy kernel for per-call values; a member the program returns
is a slice copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cost import (
    COPYING_SLICES,
    SLICING,
    CostModel,
    Roofline,
    chains,
    dot_dims,
    is_fused,
    nbytes,
    op_name,
)
from .extract import dag_cost, reachable
from .graph import EGraphView, Node, components

__all__ = [
    "DOT_MERGER_MAX_BYTES",
    "MergedDots",
    "merged_dots",
    "program_cost",
    "shared_reads",
    "unchained_links",
]

STRENGTH_REDUCED_ELEMENTS = 10_000_000  # XLA's threshold for turning a GEMV into a reduction
DOT_MERGER_MAX_BYTES = 64 << 20  # fitted to the H200 probes above (other operand + output)


@dataclass(frozen=True)
class MergedDots:
    """One group of dot e-classes XLA merges into a single GEMM; `side` is the shared operand's
    position (0: they share the left operand and the right ones are concatenated)."""

    shared: str
    side: int
    members: tuple[str, ...]


def _own_bytes(view: EGraphView, other: str, eclass: str) -> float:
    """What a dot adds to a merged one: its other operand and its output."""
    return nbytes(view, other) + nbytes(view, eclass)


def strength_reduced(view: EGraphView, node: Node) -> bool:
    """A matrix-vector (or vector-vector) product XLA's GPU simplifier turns into a reduction."""
    nb = node.attrs[0]
    a, b = (view.shapes[c] for c in node.children)
    if len(a) > nb + 1 and len(b) > nb + 1:
        return False  # a matrix on both sides: a GEMM
    return math.prod(a[nb:]) + math.prod(b[nb:]) < STRENGTH_REDUCED_ELEMENTS


def merged_dots(view: EGraphView, choice: dict[str, str], order: list[str] | None = None) -> list[MergedDots]:
    """The groups XLA's dot merger forms in the chosen program (see the module docstring);
    `order`: the program's classes, children first, where the caller has walked it already."""
    order = reachable(view, choice, view.outputs) if order is None else order
    dots = [c for c in order if view.nodes[choice[c]].op == "dot"]
    if len(dots) < 2:
        return []
    bit = {c: 1 << i for i, c in enumerate(dots)}
    below: dict[str, int] = {}  # class -> the dots it depends on (itself included), as a bit set
    for c in order:
        mask = bit.get(c, 0)
        for ch in view.nodes[choice[c]].children:
            mask |= below.get(ch, 0)
        below[c] = mask
    candidates: dict[tuple, list[str]] = {}
    for d in dots:
        node = view.nodes[choice[d]]
        if strength_reduced(view, node):
            continue
        nb = node.attrs[0]
        types = tuple(view.dtypes.get(x) for x in (*node.children, d))
        for side in (0, 1):
            other = node.children[1 - side]
            # one free dimension to concatenate on, or none (a vector: XLA's DotDecomposer adds one)
            if (
                len(view.shapes[other]) in (nb + 1, nb + 2)
                and _own_bytes(view, other, d) <= DOT_MERGER_MAX_BYTES
            ):
                key = (node.children[side], side, node.attrs, types, view.shapes[other])
                candidates.setdefault(key, []).append(d)
    groups: list[MergedDots] = []
    merged: set[str] = set()
    for (shared, side, *_same), members in candidates.items():
        left = [d for d in members if d not in merged]
        while len(left) > 1:  # as the pass: each dot not merged yet seeds a group of the rest
            group, mask, size = [], 0, 0.0
            for d in left:
                if below[d] & ~bit[d] & mask or any(below[g] & bit[d] for g in group):
                    continue  # depends on a member, or a member depends on it
                if size > DOT_MERGER_MAX_BYTES:
                    break  # the merged dot has grown past a candidate's size
                group.append(d)
                mask |= bit[d]
                size += _own_bytes(view, view.nodes[choice[d]].children[1 - side], d)
            if len(group) > 1:
                merged.update(group)
                groups.append(MergedDots(shared, side, tuple(group)))
            left = [d for d in left if d not in group]
    return groups


def _slices_of_one_array(view: EGraphView, choice: dict[str, str], parts: list[str]) -> bool:
    """Parts that are all slices of one array (W[0], W[1], ...): XLA's simplifier turns their
    concatenation back into (a slice of) that array, so the merged GEMM reads it in place."""
    sources = set()
    for c in parts:
        sliced = False
        while view.nodes[choice[c]].op in SLICING:
            sliced |= view.nodes[choice[c]].op in COPYING_SLICES
            c = view.nodes[choice[c]].children[0]
        if not sliced:
            return False
        sources.add(c)
    return len(sources) == 1


def _merged_cost(model: Roofline, view: EGraphView, choice: dict[str, str], group: MergedDots) -> float:
    """One GEMM over the group, the per-call concatenation of its other operands, and the
    slices the program returns."""
    p = model.profile
    nodes = [view.nodes[choice[d]] for d in group.members]
    batch, m, n, k = dot_dims(nodes[0], view)
    if group.side == 0:  # x@W1, x@W2: the right operands are concatenated along n
        n = sum(dot_dims(x, view)[2] for x in nodes)
    else:  # A1@W, A2@W: the left operands along m
        m = sum(dot_dims(x, view)[1] for x in nodes)
    others = [x.children[1 - group.side] for x in nodes]
    out = sum(nbytes(view, d) for d in group.members)
    concat = sum(nbytes(view, o) for o in others)
    dtype = view.dtypes.get(nodes[0].children[0], "float32")
    cost = model.gemm(batch, m, n, k, dtype, nbytes(view, group.shared) + concat + out)
    if not all(view.is_constant(o) for o in others) and not _slices_of_one_array(view, choice, others):
        cost += 2 * concat / p.bandwidth + p.launch_s
    returned = [d for d in group.members if d in view.output_set]
    if returned:
        cost += 2 * sum(nbytes(view, d) for d in returned) / p.bandwidth + p.launch_s
    return cost


def program_cost(
    view: EGraphView, choice: dict[str, str], costs: dict[str, float], model: CostModel
) -> float:
    """The chosen program's predicted time: its node costs, with concat links decode cannot chain
    repriced (`unchained_links`; any roofline model) and, on a CUDA profile, the dots XLA merges
    priced as the merged GEMMs they become and operands read once per fused kernel (`shared_reads`)."""
    if not isinstance(model, Roofline):
        return dag_cost(view, choice, costs)
    order = reachable(view, choice, view.outputs)
    total = math.fsum(costs[choice[c]] for c in order)  # dag_cost, on the walk reused below
    total += unchained_links(model, view, choice, order, costs)
    if model.profile.kind != "cuda":
        return total
    total -= shared_reads(model, view, choice, order, costs)
    for group in merged_dots(view, choice, order):
        total += _merged_cost(model, view, choice, group) - sum(costs[choice[d]] for d in group.members)
    return max(total, 0.0)


def unchained_links(
    model: Roofline, view: EGraphView, choice: dict[str, str], order: list[str], costs: dict[str, float]
) -> float:
    """Seconds to add for concats priced as links of a same-axis chain (no launch, only their
    right operand copied) whose chosen left operand is not such a concat: decode emits them as
    concatenates of their own. `concatenate([a@W1, a@W2, b])` with the two dots merged was
    priced 21% faster than as written, and decoded to the same cost (a review's H200-profile
    repro): the guard passed a rewrite that gained nothing."""
    extra = 0.0
    for c in order:
        node = view.nodes[choice[c]]
        if node.op != "concat" or not model.profile.concat_chains or not chains(view, node):
            continue
        left = view.nodes[choice[node.children[0]]]
        if costs[choice[c]] > 0 and not (left.op == "concat" and left.attrs[0] == node.attrs[0]):
            extra += model.kernel_time(node, view) - costs[choice[c]]
    return extra


def shared_reads(
    model: Roofline, view: EGraphView, choice: dict[str, str], order: list[str], costs: dict[str, float]
) -> float:
    """Seconds the chosen program's fused kernels save by reading an operand once for all their
    ops that use it. Node costs charge each fused op its own reads, so a*b + a*c read `a` twice,
    where XLA's one fused kernel reads it once: the rewrite a*(b + c) was predicted 1.23x faster
    and measured 1.01x (H200, ew_factor; bench/HISTORY.md, eighteenth lease). A kernel here is a
    connected group of priced fused ops (slices apart: they read only what they keep)."""
    fused = {c for c in order if costs[choice[c]] > 0 and _fused(view.nodes[choice[c]])}
    links = ((ch, c) for c in fused for ch in view.nodes[choice[c]].children if ch in fused)
    kernel = components(fused, links)
    read: dict[str, set[str]] = {}  # kernel -> operands its ops have read so far
    saved = 0.0
    for c in order:
        if c not in fused:
            continue
        node = view.nodes[choice[c]]
        operands = model.outside_reads(node, view)
        seen = read.setdefault(kernel[c], set())
        again = sum(nbytes(view, o) for o in operands if o in seen)
        seen.update(operands)
        if again:
            reads = sum(nbytes(view, o) for o in operands)
            saved += model.fused_time(node, view, reads) - model.fused_time(node, view, reads - again)
    return saved


def _fused(node: Node) -> bool:
    """An op priced inside a fused kernel with reads of its whole operands (not a slice)."""
    return is_fused(node) and op_name(node) not in SLICING

"""Cost models: the predicted time of one e-node, given the shapes of its e-classes.

A cost model is anything with `name` and `node_cost(node, view) -> float` (seconds, >= 0, so a
term never costs less than its children: the program cost is the sum over the nodes of the
extracted DAG, shared subterms counted once). Models are registered by name:

    register_cost_model("mine", lambda profile: MyModel(profile))
    optimize(f, cost_model="mine")

Built in: `roofline` (per-kernel max of FLOPs/matrix rate and bytes/bandwidth plus launch, with
small-GEMM efficiency, elementwise fusion and constant folding) and `flops` (FLOPs plus bytes,
device-independent, for tests and for explaining what a rewrite saves).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidOptionError
from .encode import ELEMENTWISE_CALL
from .graph import EGraphView, Node
from .profiles import Profile

__all__ = [
    "CostModel",
    "Roofline",
    "FlopsBytes",
    "register_cost_model",
    "get_cost_model",
    "COST_MODELS",
    "node_flops",
    "itemsize",
    "speedup",
]


def speedup(before: float, after: float) -> float:
    """before / after: inf when only `after` is 0 (a program that costs nothing), 1.0 when both are."""
    if after > 0:
        return before / after
    return float("inf") if before > 0 else 1.0


# Ops XLA fuses into their neighbours: priced by the bytes they write, with no launch of their own.
FUSIBLE = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "neg",
        "unary",
        "binary",
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "convert_element_type",
        "select_n",
        "integer_pow",
        "iota",
        "clamp",
        "copy",
        "copy_p",
        "stop_gradient",
        "square",
        "slice",
        "transpose",  # folded into dot dimension numbers or fused by XLA
        ELEMENTWISE_CALL,  # a custom_jvp/custom_vjp call of an elementwise body (jax.nn.relu)
    }
)
# Work on constants and hoisted (slow) arguments is done once, off the hot call: free here.
# Data movement is folded even without hoisting; arithmetic only when arguments are hoisted.
FOLDED = frozenset({"concat", "transpose", "slice", "op"})
HOISTABLE = frozenset({"concat", "transpose", "slice", "dot", "add", "sub", "mul", "div", "neg", "unary"})
# Layout changes that keep every element (a unit axis added or dropped): folded and hoisted like
# the data movement above. A stack of constant weights is a concatenation of them, each with a
# leading unit axis (XLA folds that chain too; priced as copies, it was most of a batched
# experts program's predicted time).
RELAYOUTS = frozenset({"broadcast_in_dim", "reshape", "squeeze"})
SLICING = frozenset({"slice", "dynamic_slice", "squeeze", "reshape"})
COPYING_SLICES = frozenset({"slice", "slice_nd", "dynamic_slice"})  # not bitcasts: they copy


@runtime_checkable
class CostModel(Protocol):
    """What extraction prices programs with: `node_cost(node, view)`, the cost of one e-node (an
    operation over its children's e-classes, whose shapes and dtypes `view` holds), and a `name`.
    Register a factory of one with `register_cost_model(name, factory)`; factory(profile) gets
    the device's rates (jaxrw.Profile)."""

    name: str

    def node_cost(self, node: Node, view: EGraphView) -> float: ...


def itemsize(dtype: str) -> int:
    try:
        return int(np.dtype(dtype).itemsize)
    except TypeError:
        if dtype == "bfloat16":
            return 2
        return 4


def nbytes(view: EGraphView, eclass: str) -> float:
    return float(math.prod(view.shapes[eclass])) * itemsize(view.dtypes.get(eclass, "float32"))


def op_name(node: Node) -> str:
    """The primitive-level name: `op` nodes carry it as their first attribute."""
    return node.attrs[0] if node.op in ("op", "unary", "binary") else node.op


def is_fused(node: Node) -> bool:
    """Whether XLA fuses the node into its neighbours (FUSIBLE by constructor or primitive name)."""
    return node.op in FUSIBLE or op_name(node) in FUSIBLE


def dot_dims(node: Node, view: EGraphView) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a typed dot node."""
    a, b = node.children
    nb, lc, rc, _cfg = node.attrs
    sa, sb = view.shapes[a], view.shapes[b]
    batch = math.prod(sa[:nb])
    k = sa[lc]
    m = math.prod(d for i, d in enumerate(sa) if i >= nb and i != lc)
    n = math.prod(d for i, d in enumerate(sb) if i >= nb and i != rc)
    return batch, m, n, k


def transposed_operands(node: Node, view: EGraphView) -> list[str]:
    """The operands of a dot that a GEMM taking one layout copies first (`Profile.
    lhs_transposed_copied`): the left one where it contracts over a leading axis rather than its
    minor one, and then the right one too where it contracts over its minor axis. Neither for a
    matrix-vector product: XLA:CPU's takes either layout at the same speed."""
    a, b = node.children
    nb, lc, rc, _cfg = node.attrs
    if lc == len(view.shapes[a]) - 1 or min(dot_dims(node, view)[1:3]) == 1 or _minor_unfolded(view, a, lc):
        return []
    return [a, b] if rc == len(view.shapes[b]) - 1 and rc != nb else [a]


def _minor_unfolded(view: EGraphView, eclass: str, axis: int) -> bool:
    """Whether `eclass` is a transpose whose operand has `axis` as its minor axis: XLA folds such
    a transpose into the GEMM that reads it, which then takes the plain layout. Every node of the
    class must be one (a cost cannot see which the extractor picks: the program as written has
    one node a class)."""
    nodes = [view.nodes[n] for n in view.classes.get(eclass, ())]
    return bool(nodes) and all(
        node.op == "transpose" and node.attrs[0][axis] == len(node.attrs[0]) - 1 for node in nodes
    )


def node_flops(node: Node, view: EGraphView) -> float:
    """Arithmetic of one node: 2mnk per dot, one per output element for elementwise ops, one
    per input element for reductions, none for data movement."""
    if node.op == "dot":
        batch, m, n, k = dot_dims(node, view)
        return 2.0 * batch * m * n * k
    out = float(math.prod(view.shapes[node.eclass]))
    if node.op in ("add", "sub", "mul", "div", "neg", "unary", "binary"):
        return out
    if node.op == "sum" or op_name(node).startswith("reduce_"):
        return float(math.prod(view.shapes[node.children[0]]))
    return 0.0


class Roofline:
    """Per kernel: max(FLOPs / rate, bytes / bandwidth) + launch, with the refinements above."""

    name = "roofline"

    def __init__(self, profile: Profile):
        self.profile = profile

    def gemm(self, batch: int, m: int, n: int, k: int, dtype: str, moved: float) -> float:
        """One GEMM kernel: compute- or bandwidth-bound, whichever is slower, plus its launch."""
        p = self.profile
        rate = p.matmul_rate(dtype) * p.efficiency(m, n, k)
        return max(2.0 * batch * m * n * k / rate, moved / p.bandwidth) + p.launch_s

    def outside_reads(self, node: Node, view: EGraphView) -> list[str]:
        """The operands a fused elementwise op reads from outside its kernel (inputs, products,
        reductions), each once: `x * x` reads x once."""
        folded = self.profile.transpose_folded
        return [c for c in dict.fromkeys(node.children) if not _fusible_class(view, c, folded)]

    def fused_time(self, node: Node, view: EGraphView, reads: float) -> float:
        """A fused op's share of its kernel: a share of its output, and `reads` bytes read."""
        p = self.profile
        moved = p.fused_share * nbytes(view, node.eclass) + reads
        return max(node_flops(node, view) / p.vector_flops, moved / p.bandwidth)

    def node_cost(self, node: Node, view: EGraphView) -> float:
        p = self.profile
        if node.op in ("var", "const"):
            return 0.0
        if (node.op in FOLDED or (view.slow and node.op in HOISTABLE) or relayout(node, view)) and all(
            view.is_constant(c) for c in node.children
        ):
            return 0.0  # folded when the program is built, or hoisted out of the hot call
        out_b = nbytes(view, node.eclass)
        if node.op == "dot":
            batch, m, n, k = dot_dims(node, view)
            dt = view.dtypes.get(node.children[0], "float32")
            moved = nbytes(view, node.children[0]) + nbytes(view, node.children[1]) + out_b
            # an operand generated from indices (an identity matrix) is materialized for the GEMM
            made = [nbytes(view, c) for c in set(node.children) if view.is_generated(c, FUSIBLE)]
            copied = transposed_operands(node, view) if p.lhs_transposed_copied else []
            extra = sum(made) / p.bandwidth + p.launch_s * len(made)
            extra += sum(2 * nbytes(view, c) / p.bandwidth + p.launch_s for c in copied)
            return self.gemm(batch, m, n, k, dt, moved) + extra
        if p.kind == "cuda" and _scales_a_product(view, node):
            return 0.0  # XLA's GEMM rewriter applies the scale as cuBLAS's alpha
        name = op_name(node)
        if view.is_generated(node.eclass, FUSIBLE) and (
            node.op == "iota" or all(view.is_generated(c, FUSIBLE) for c in node.children)
        ):
            return 0.0  # made from indices inside whichever fused kernel reads it
        if p.transpose_folded and node.op == "transpose" and _folded_transpose(view, node):
            # a layout change of an input or a product: XLA folds it into a GEMM's operand (cuBLAS
            # reads either layout), or the fused kernel that consumes it reads in that order; the
            # consumer pays the read. Priced as a kernel of its own, `x @ W.T` with a 32000x4096
            # W was predicted 1.34x slower than its rewrite, and ran at parity (H200, llama4096)
            return 0.0
        if is_fused(node):
            # Inside a fusion: a share of its own output plus reads of operands that come from
            # outside any fusion (inputs, products, reductions).
            if name in SLICING:  # a slice reads only the part it keeps
                reads = out_b if not _fusible_class(view, node.children[0], p.transpose_folded) else 0.0
            else:
                reads = sum(nbytes(view, c) for c in self.outside_reads(node, view))
            fused = self.fused_time(node, view, reads)
            # a slice the program returns is written by a kernel of its own (XLA cannot hand
            # out part of a product's buffer, nor fold a slice into the GEMM as it does a scale or
            # an added matrix): a launch, and the whole slice written
            if name in COPYING_SLICES and node.eclass in view.output_set:
                return fused + (1 - p.fused_share) * out_b / p.bandwidth + p.launch_s
            return fused
        if p.concat_chains and node.op == "concat" and chains(view, node):
            # a link of a same-axis chain: decode emits the chain as one n-ary concatenate, so a
            # link copies only its right operand and shares the chain's one launch
            return 2 * nbytes(view, node.children[1]) / p.bandwidth
        return self.kernel_time(node, view)

    def kernel_time(self, node: Node, view: EGraphView) -> float:
        """An op run as a kernel of its own: its roofline time plus a launch."""
        p = self.profile
        out_b = nbytes(view, node.eclass)
        in_b = out_b if op_name(node) in SLICING else sum(nbytes(view, c) for c in node.children)
        return max(node_flops(node, view) / p.vector_flops, (in_b + out_b) / p.bandwidth) + p.launch_s


def relayout(node: Node, view: EGraphView) -> bool:
    """A RELAYOUTS node of one operand with as many elements as its result."""
    return (
        node.op in RELAYOUTS
        and len(node.children) == 1
        and math.prod(view.shapes[node.eclass]) == math.prod(view.shapes[node.children[0]])
    )


def chains(view: EGraphView, node: Node) -> bool:
    """Whether a concat's left operand can be a concat along the same axis (decode.py flattens
    such left-nested chains into one n-ary concatenate; `Profile.concat_chains`). Can, not is:
    node costs cannot see the extractor's choice, so `xla_passes.unchained_links` reprices the
    links whose chosen left operand is something else."""
    axis = node.attrs[0]
    return any(
        view.nodes[n].op == "concat" and view.nodes[n].attrs[0] == axis
        for n in view.classes.get(node.children[0], ())
    )


def _scalar_like(view: EGraphView, eclass: str) -> bool:
    """A rank-0 value, or a broadcast of one."""
    if not view.shapes.get(eclass):
        return True
    return any(
        view.nodes[n].op == "broadcast_in_dim" and not view.shapes.get(view.nodes[n].children[0])
        for n in view.classes.get(eclass, ())
    )


def _has_dot(view: EGraphView, eclass: str) -> bool:
    return any(view.nodes[n].op == "dot" for n in view.classes.get(eclass, ()))


def _scales_a_product(view: EGraphView, node: Node) -> bool:
    """s·(A@B), (A@B)·s or (A@B)/s with a scalar s."""
    if node.op == "mul" and len(node.children) == 2:
        a, b = node.children
        return (_has_dot(view, a) and _scalar_like(view, b)) or (_has_dot(view, b) and _scalar_like(view, a))
    if node.op == "div" and len(node.children) == 2:
        return _has_dot(view, node.children[0]) and _scalar_like(view, node.children[1])
    return False


def _fusible_class(view: EGraphView, eclass: str, transpose_folded: bool = False) -> bool:
    """Whether a value is made inside a fused kernel, so its consumers in that kernel read nothing
    for it: every node of its class is a fused op. Slices are not (they read what they keep); with
    `transpose_folded` (the profile's), neither is a transpose of an input or a product (free
    itself: its consumer reads the data). Every node, not some: a class that also holds a GEMM or
    an input may be taken from it, and then its consumers read it (a relu of an expert's product,
    whose class also holds the slice of a batched product, was priced as reading nothing, so an
    unchanged program was predicted 7% faster)."""
    nodes = view.classes.get(eclass, ())
    return bool(nodes) and all(_fused_op(view, view.nodes[n], transpose_folded) for n in nodes)


def _fused_op(view: EGraphView, node: Node, transpose_folded: bool) -> bool:
    if node.op == "slice" or not is_fused(node):
        return False
    return node.op != "transpose" or not transpose_folded or not _folded_transpose(view, node)


def _folded_transpose(view: EGraphView, node: Node) -> bool:
    """A transpose XLA folds into whatever reads it: not returned, and of a value that is not
    computed inside a fused kernel (an input, a product, a reduction). One level deep: e-graph
    classes can be cyclic (x = transpose(transpose(x)))."""
    if node.eclass in view.output_set:
        return False
    return not any(
        view.nodes[n].op in FUSIBLE and view.nodes[n].op not in ("slice", "transpose")
        for n in view.classes.get(node.children[0], ())
    )


class FlopsBytes:
    """FLOPs plus bytes moved (one byte weighs one FLOP): a device-independent yardstick."""

    name = "flops"

    def __init__(self, profile: Profile | None = None):
        self.profile = profile

    def node_cost(self, node: Node, view: EGraphView) -> float:
        if node.op in ("var", "const"):
            return 0.0
        moved = nbytes(view, node.eclass) + sum(nbytes(view, c) for c in node.children)
        return node_flops(node, view) + moved


COST_MODELS: dict[str, Callable[[Profile], CostModel]] = {"roofline": Roofline, "flops": FlopsBytes}


_BUILT_IN_COST_MODELS = frozenset(COST_MODELS)


def register_cost_model(name: str, factory: Callable[[Profile], CostModel]) -> None:
    """Make `factory(profile)` available as `optimize(..., cost_model=name)`. A name of one's own
    may be registered again (a notebook cell run twice); a built-in one may not be replaced."""
    check_plugin("cost model", name, factory, _BUILT_IN_COST_MODELS)
    COST_MODELS[name] = factory


def check_plugin(kind: str, name: Any, fn: Any, built_in: frozenset[str]) -> None:
    """Refuse a plug-in registration that would fail later: a name that is not a string or is a
    built-in's, or something not callable."""
    if not isinstance(name, str) or not name:
        raise InvalidOptionError(f"a {kind} name must be a non-empty string; got {name!r}")
    if name in built_in:
        raise InvalidOptionError(
            f"{name!r} is a built-in {kind} ({sorted(built_in)}); register yours under another name"
        )
    if not callable(fn):
        raise InvalidOptionError(f"{kind} {name!r} must be callable; got {fn!r} of type {type(fn).__name__}")


def get_cost_model(spec: str | CostModel, profile: Profile) -> CostModel:
    if isinstance(spec, str):
        if spec not in COST_MODELS:
            raise InvalidOptionError(f"unknown cost model {spec!r}; valid: {sorted(COST_MODELS)!r}")
        return COST_MODELS[spec](profile)
    if isinstance(spec, CostModel):
        return spec
    raise InvalidOptionError(
        f"cost_model must be a registered name or have node_cost(); got {spec!r}; "
        f"valid: {sorted(COST_MODELS)!r}"
    )

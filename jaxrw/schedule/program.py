"""The program a plan schedules: a flat list of operations over numbered values, each with a cost.

Built from a ClosedJaxpr with calls inlined. Every op carries its predicted solo time on the device
(a roofline from the Profile), the kernels it launches, the fraction of the machine it keeps busy
(so that overlapping branches can be priced) and the bytes it moves. Two kinds of op become free,
turning into buffer offsets instead of kernels: views (leading-axis slices and reshapes of program
inputs) and joins (a concatenation or stack along axis 0 of branch results, which the branches then
write in place). This is how packed, stacked buffers reach thunky as contiguous `.at[a:b]` views.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import compat
from ..rewrite.encode import BINARY, UNARY
from ..rewrite.profiles import Profile

__all__ = ["Lit", "Op", "Program", "build_program", "ELEMENTWISE", "ALIGN_BYTES"]

# Primitives XLA fuses into one kernel with their neighbours.
ELEMENTWISE = (
    UNARY
    | BINARY
    | frozenset(
        {
            "add",
            "sub",
            "mul",
            "div",
            "neg",
            "integer_pow",
            "round",
            "erfc",
            "clamp",
            "select_n",
            "convert_element_type",
            "broadcast_in_dim",
            "reshape",
            "squeeze",
            "expand_dims",
            "iota",
            "copy",
            "copy_p",
            "stop_gradient",
            "complex",
            "conj",
            "real",
            "imag",
            "population_count",
            "shift_left",
            "shift_right_arithmetic",
            "shift_right_logical",
            "concatenate",
            "slice",
            "dynamic_slice",
            "pad",
            "rev",
            "stack",
            "transpose",
            "random_bits",
            "threefry2x32",
        }
    )
)
# Ops that only reinterpret the bytes of their operand (row-major, same element count and dtype).
ALIASES = frozenset(
    {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p", "convert_element_type"}
)
# XLA aligns entry parameters to 16 bytes; views that would break that stay ordinary ops.
ALIGN_BYTES = 16
# numpy gives these a byte per element; XLA packs them several to a byte, so buffer sizes differ
SUB_BYTE_DTYPES = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})
# Threads an H200 keeps resident (132 SMs x 2048): an elementwise kernel smaller than this leaves
# part of the machine idle.
MACHINE_THREADS = 132 * 2048


@dataclass(frozen=True)
class Lit:
    """A literal operand (a Python or NumPy scalar baked into the equation)."""

    value: Any


@dataclass
class Op:
    index: int
    prim: Any
    params: dict
    ins: tuple[Any, ...]  # value ids (int) or Lit
    outs: tuple[int, ...]
    time_s: float = 0.0  # solo time on the device, launch excluded
    kernels: int = 0
    busy: float = 1.0  # fraction of the machine the kernel keeps busy
    nbytes: float = 0.0
    free: bool = False  # a view or join: no kernel, an offset into a buffer

    @property
    def name(self) -> str:
        return self.prim.name


@dataclass
class Program:
    ops: list[Op]
    avals: dict[int, tuple[tuple[int, ...], np.dtype]]
    inputs: list[int]
    outputs: list[Any]  # value id or Lit per flat output
    consts: dict[int, Any]
    producer: dict[int, int] = field(default_factory=dict)  # value -> op index
    users: dict[int, list[int]] = field(default_factory=dict)  # value -> op indices
    views: dict[int, tuple[int, int]] = field(default_factory=dict)  # value -> (input value, element offset)
    joins: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # join -> [(part, offset)]
    part_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # part -> (join, offset)
    join_ops: dict[int, list[int]] = field(default_factory=dict)  # join -> its free ops, in order

    def shape(self, v: int) -> tuple[int, ...]:
        return self.avals[v][0]

    def dtype(self, v: int) -> np.dtype:
        return self.avals[v][1]

    def nbytes(self, v: int) -> int:
        shape, dtype = self.avals[v]
        return int(math.prod(shape)) * dtype.itemsize

    def writers(self, v: int) -> list[int]:
        """Non-free ops that write the bytes of `v` (all parts of a join)."""
        if v in self.joins:
            return [w for p, _ in self.joins[v] for w in self.writers(p)]
        op = self.producer.get(v)
        if op is None or self.ops[op].free:
            return []
        return [op]

    def compute_fn(self, op_ids: Sequence[int], reads: Sequence[int], writes: Sequence[int]) -> Callable:
        """A function of the values `reads` returning the values `writes`, evaluating `op_ids` in order."""
        ops = [self.ops[i] for i in op_ids]
        consts = self.consts

        def compute(*vals: Any) -> list[Any]:
            env: dict[int, Any] = dict(zip(reads, vals, strict=True))
            for op in ops:
                args = [
                    a.value if isinstance(a, Lit) else (env[a] if a in env else consts[a]) for a in op.ins
                ]
                res = compat.bind_equation(op.prim, op.params, args)
                env.update(zip(op.outs, res, strict=True))
            return [env[w] for w in writes]

        return compute

    def outside(self, v: Any, args: Sequence[Any]) -> Any:
        """The value of an output computed without any region: a literal, constant, input, or view."""
        if isinstance(v, Lit):
            return v.value
        if v in self.consts:
            return self.consts[v]
        if v in self.inputs:
            return args[self.inputs.index(v)]
        op = self.ops[self.producer[v]]
        vals = [self.outside(a, args) for a in op.ins]
        res = compat.bind_equation(op.prim, op.params, vals)
        return res[op.outs.index(v)]

    def evaluate(self, args: Sequence[Any]) -> list[Any]:
        """Reference semantics: every op in order (free ops included)."""
        env: dict[int, Any] = dict(zip(self.inputs, args, strict=True))
        for op in self.ops:
            vals = [
                a.value if isinstance(a, Lit) else (env[a] if a in env else self.consts[a]) for a in op.ins
            ]
            env.update(zip(op.outs, compat.bind_equation(op.prim, op.params, vals), strict=True))
        return [
            o.value if isinstance(o, Lit) else (env[o] if o in env else self.consts[o]) for o in self.outputs
        ]


# -- building -------------------------------------------------------------------------------------

_INLINE = compat.INLINED_CALLS | {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}


def _body(eqn: Any) -> Any:
    for key in ("call_jaxpr", "fun_jaxpr", "jaxpr"):
        body = eqn.params.get(key)
        if body is not None:
            return body if isinstance(body, compat.ClosedJaxpr) else compat.ClosedJaxpr(body, ())
    return compat.call_body(eqn)


def build_program(closed: Any, profile: Profile) -> Program:
    """Flatten `closed` (a ClosedJaxpr), price each op for `profile`, mark views and joins."""
    if closed.effects:
        raise ValueError(f"programs with effects cannot be scheduled: {sorted(map(str, closed.effects))}")
    avals: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
    consts: dict[int, Any] = {}
    ops: list[Op] = []

    def new_value(aval: Any) -> int:
        vid = len(avals)
        if not isinstance(aval.dtype, np.dtype):  # extended dtypes: PRNG keys (key<fry>)
            raise ValueError(f"a value has dtype {aval.dtype}, which thunky buffers cannot hold")
        avals[vid] = (tuple(int(d) for d in aval.shape), np.dtype(aval.dtype))
        return vid

    def walk(jaxpr: Any, env: dict[Any, Any]) -> None:
        for eqn in jaxpr.eqns:
            ins = tuple(Lit(a.val) if compat.is_literal(a) else env[a] for a in eqn.invars)
            if eqn.primitive.name in _INLINE:
                body = _body(eqn)
                inner: dict[Any, Any] = {}
                for cv, c in zip(body.jaxpr.constvars, body.consts, strict=True):
                    vid = new_value(cv.aval)
                    consts[vid] = c
                    inner[cv] = vid
                inner.update(zip(body.jaxpr.invars, ins, strict=True))
                walk(body.jaxpr, inner)
                for o, a in zip(eqn.outvars, body.jaxpr.outvars, strict=True):
                    env[o] = Lit(a.val) if compat.is_literal(a) else inner[a]
                continue
            outs = tuple(new_value(o.aval) for o in eqn.outvars)
            for o, vid in zip(eqn.outvars, outs, strict=True):
                if not compat.is_dropvar(o):
                    env[o] = vid
            ops.append(Op(len(ops), eqn.primitive, dict(eqn.params), ins, outs))

    env: dict[Any, Any] = {}
    for cv, c in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        vid = new_value(cv.aval)
        consts[vid] = c
        env[cv] = vid
    inputs = []
    for v in closed.jaxpr.invars:
        vid = new_value(v.aval)
        env[v] = vid
        inputs.append(vid)
    walk(closed.jaxpr, env)
    outputs = [
        Lit(np.asarray(a.val, a.aval.dtype)) if compat.is_literal(a) else env[a] for a in closed.jaxpr.outvars
    ]
    ops = _live_ops(ops, outputs)
    used = {a for op in ops for a in (*op.ins, *op.outs) if not isinstance(a, Lit)} | set(inputs)
    for v, (shape, dtype) in avals.items():
        if v not in used:
            continue
        if dtype.itemsize == 0 or str(dtype) in SUB_BYTE_DTYPES:
            raise ValueError(f"value {v} has dtype {dtype}, which thunky buffers cannot hold")
        if 0 in shape:
            raise ValueError(f"value {v} has no elements (shape {shape})")
    prog = Program(ops, avals, inputs, outputs, consts)
    for op in ops:
        for o in op.outs:
            prog.producer[o] = op.index
        for a in op.ins:
            if not isinstance(a, Lit):
                prog.users.setdefault(a, []).append(op.index)
    _mark_views(prog)
    _mark_joins(prog)
    for op in ops:
        _price(prog, op, profile)
    return prog


def _live_ops(ops: list[Op], outputs: list[Any]) -> list[Op]:
    """Drop ops no output depends on (the program has no effects), renumbering the rest."""
    live = {o for o in outputs if not isinstance(o, Lit)}
    keep = []
    for op in reversed(ops):
        if any(o in live for o in op.outs):
            keep.append(op)
            live.update(a for a in op.ins if not isinstance(a, Lit))
    keep.reverse()
    for i, op in enumerate(keep):
        op.index = i
    return keep


def _is_alias(prog: Program, op: Op) -> bool:
    if op.name not in ALIASES or len(op.ins) != 1 or isinstance(op.ins[0], Lit) or len(op.outs) != 1:
        return False
    if op.name == "reshape" and op.params.get("dimensions") is not None:
        return False
    (src,), (dst,) = op.ins, op.outs
    return prog.dtype(src) == prog.dtype(dst) and math.prod(prog.shape(src)) == math.prod(prog.shape(dst))


def _leading_slice(prog: Program, op: Op) -> int | None:
    """Element offset of a `slice` that keeps every trailing dimension whole (a contiguous view)."""
    if op.name != "slice" or isinstance(op.ins[0], Lit):
        return None
    src = op.ins[0]
    shape = prog.shape(src)
    start, limit = op.params["start_indices"], op.params["limit_indices"]
    strides = op.params.get("strides") or (1,) * len(shape)
    if not shape or any(s != 1 for s in strides):
        return None
    if any(start[i] != 0 or limit[i] != shape[i] for i in range(1, len(shape))):
        return None
    return int(start[0]) * int(math.prod(shape[1:]))


def _aligned(prog: Program, v: int, offset: int) -> bool:
    return (offset * prog.dtype(v).itemsize) % ALIGN_BYTES == 0


def _mark_views(prog: Program) -> None:
    """Leading-axis slices and reshapes of program inputs become views of the input buffer."""
    base = {v: (v, 0) for v in prog.inputs}
    for op in prog.ops:
        if len(op.ins) != 1 or isinstance(op.ins[0], Lit) or op.ins[0] not in base:
            continue
        root, off = base[op.ins[0]]
        if _is_alias(prog, op):
            new_off = off
        else:
            delta = _leading_slice(prog, op)
            if delta is None:
                continue
            new_off = off + delta
        if not _aligned(prog, op.outs[0], new_off):
            continue
        op.free = True
        base[op.outs[0]] = (root, new_off)
        prog.views[op.outs[0]] = (root, new_off)


def _mark_joins(prog: Program) -> None:
    """concatenate(axis 0) / stack(axis 0) of values computed by the program: each part is written
    in place at its offset in the joined buffer, and the join itself costs nothing."""
    outputs = {o for o in prog.outputs if not isinstance(o, Lit)}
    for op in prog.ops:
        axis = op.params.get("dimension") if op.name == "concatenate" else op.params.get("axis")
        if op.name not in ("concatenate", "stack") or axis != 0 or len(op.ins) < 2:
            continue
        if any(isinstance(a, Lit) for a in op.ins):
            continue
        parts: list[tuple[int, int]] = []
        chain_ops: list[int] = []
        offset = 0
        ok = True
        for a in op.ins:
            root, chain = _alias_root(prog, a, outputs)
            pid = prog.producer.get(root)
            if (
                pid is None
                or prog.ops[pid].free
                or root in outputs
                or root in prog.part_of
                or root in prog.joins
                or any(r == root for r, _ in parts)
                or not _aligned(prog, root, offset)
            ):
                ok = False
                break
            parts.append((root, offset))
            chain_ops.extend(chain)
            offset += int(math.prod(prog.shape(a)))
        if not ok or len(op.outs) != 1:
            continue
        (joined,) = op.outs
        op.free = True
        for i in chain_ops:
            prog.ops[i].free = True
        prog.joins[joined] = parts
        prog.join_ops[joined] = sorted([*chain_ops, op.index])
        for p, off in parts:
            prog.part_of[p] = (joined, off)


def _alias_root(prog: Program, v: int, outputs: set[int]) -> tuple[int, list[int]]:
    """Follow single-use alias ops backwards from `v` to the value that owns its bytes (stopping at
    program outputs, which need bytes of their own, and at values read elsewhere too)."""
    chain: list[int] = []
    while True:
        pid = prog.producer.get(v)
        if pid is None or v in outputs:
            return v, chain
        op = prog.ops[pid]
        if op.free or not _is_alias(prog, op) or len(prog.users.get(op.ins[0], [])) != 1:
            return v, chain
        if len(prog.users.get(v, [])) != 1:  # another reader needs the op that writes `v`
            return v, chain
        chain.append(pid)
        v = op.ins[0]


# -- costs ----------------------------------------------------------------------------------------


def _dot_dims(prog: Program, op: Op) -> tuple[int, int, int, int]:
    (lc, rc), (lb, _rb) = op.params["dimension_numbers"]
    sa, sb = prog.shape(op.ins[0]), prog.shape(op.ins[1])
    batch = math.prod(sa[i] for i in lb)
    k = math.prod(sa[i] for i in lc)
    m = math.prod(d for i, d in enumerate(sa) if i not in lc and i not in lb)
    n = math.prod(d for i, d in enumerate(sb) if i not in rc and i not in _rb)
    return batch, m, n, k


def _price(prog: Program, op: Op, p: Profile) -> None:
    """Solo time, kernels, machine share and bytes of one op (free ops cost nothing)."""
    if op.free:
        return
    ins = [a for a in op.ins if not isinstance(a, Lit)]
    in_b = float(sum(prog.nbytes(a) for a in ins))
    out_b = float(sum(prog.nbytes(o) for o in op.outs))
    out_elems = float(sum(math.prod(prog.shape(o)) for o in op.outs))
    op.nbytes = in_b + out_b
    if op.name == "dot_general":
        batch, m, n, k = _dot_dims(prog, op)
        eff = p.efficiency(m, n, k)
        flops = 2.0 * batch * m * n * k
        rate = p.matmul_rate(str(prog.dtype(ins[0]))) * eff
        op.time_s = max(flops / rate, op.nbytes / p.bandwidth)
        op.kernels = 1
        op.busy = min(1.0, eff * max(1.0, batch / 8))
        return
    if op.name in ELEMENTWISE:
        # fused: a share of its own output (Profile.fused_share), plus operands read from outside
        # any fusion
        reads = sum(prog.nbytes(a) for a in ins if not _fused_value(prog, a))
        op.nbytes = p.fused_share * out_b + reads
        op.time_s = max(out_elems / p.vector_flops, op.nbytes / p.bandwidth)
        users = [prog.ops[u] for o in op.outs for u in prog.users.get(o, [])]
        op.kernels = 0 if users and all(u.name in ELEMENTWISE and not u.free for u in users) else 1
        op.busy = min(1.0, out_elems / MACHINE_THREADS)
        return
    in_elems = float(sum(math.prod(prog.shape(a)) for a in ins))
    op.time_s = max(in_elems / p.vector_flops, op.nbytes / p.bandwidth)
    op.kernels = 1
    op.busy = min(1.0, max(out_elems, in_elems / 64) / MACHINE_THREADS)


def _fused_value(prog: Program, v: int) -> bool:
    pid = prog.producer.get(v)
    return pid is not None and prog.ops[pid].name in ELEMENTWISE and not prog.ops[pid].free

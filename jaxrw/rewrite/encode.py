"""jaxpr -> e-graph. Known primitives become typed terms; every other equation an opaque node.

The encoder walks the equations once, writing an egglog term per jaxpr variable (as egglog text, see
egg_source.py, run in one batch) and recording side tables (constants, parameters, opaque
equations) in a `Program`. Nested jit/closed_call/remat
bodies are inlined; control flow and anything unknown stays opaque with its operands as children.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.extend
import numpy as np
from egglog import EGraph

from .. import compat
from ..errors import UnsupportedProgramError
from . import nonfinite
from .effects import loops_only
from .egg_source import EggSource, Str, Sym, Vec, ivec, ref_of
from .lease import program_egraph
from .platform_conds import constant_value, diagonal_gather, gathered_diagonal, running_branch
from .primitives import (
    BINARY,
    COVERED,
    CUSTOM_CALLS,
    ELEMENTWISE_CALL,
    ELEMENTWISE_TYPED,
    UNARY,
    elementwise_call,
)
from .sites import DotSite, OuterSite, broadcast_outer, outer_form
from .terms import (
    DEFAULT_CFG,
    Out,
    Tensor,
    cfg_dtype,
    diagonal_of,
    dtype,
    fill,
    float_dtype,
    level,
    order,
    plain_cfg,
    shape,
)

__all__ = [
    "Program",
    "DotSite",
    "OuterSite",
    "encode",
    "count_equations",
    "encoded_equations",
    "UNARY",
    "BINARY",
    "ELEMENTWISE_TYPED",
    "ELEMENTWISE_CALL",
]


@dataclass
class Program:
    """One encoded jaxpr: the e-graph plus the side tables its terms index into."""

    egraph: EGraph | None  # None once the rewrite is done (RewriteResult.release: it was lent)
    in_avals: list[Any]
    out_avals: list[Any]
    outputs: list[str]  # the output terms, as egglog text
    consts: list[Any] = field(default_factory=list)
    params: list[tuple[Any, dict]] = field(default_factory=list)  # (primitive, params)
    eqns: list[Any] = field(default_factory=list)  # opaque equations
    n_equations: int = 0  # equations after inlining
    # where each was written (by `order` - 1): decode binds an e-class's chosen node there, so the
    # rewritten program keeps the user's jax.named_scope names and source lines (compat.Source)
    sources: list[Any] = field(default_factory=list)
    primitives: dict[str, int] = field(default_factory=dict)  # count by primitive name
    const_is_arg: list[bool] = field(default_factory=list)  # closed-over arrays (not literals)
    # opaque equation index -> replacement `vals -> outputs` (control flow with rewritten bodies)
    eqn_fns: dict[int, Any] = field(default_factory=dict)
    # egglog references of the term-language callables written (which rules can fire: reach.py)
    symbols: frozenset = frozenset()
    dots: list[DotSite] = field(default_factory=list)  # unbatched dots, in program order
    outers: list[OuterSite] = field(default_factory=list)  # outer products, in program order
    # x[i] (a row of x along its leading axis) -> (x, i); and stacks along a new leading axis:
    # (the stack, its operands). What lets `batch.stack_dots` read a stack of rows as x itself.
    rows: dict[Sym, tuple[Sym, int]] = field(default_factory=dict)
    stacks: list[tuple[Sym, tuple[Sym, ...]]] = field(default_factory=list)

    def describe(self) -> str:
        return f"Program({self.n_equations} equations, {len(self.outputs)} outputs, {len(self.eqns)} opaque)"


class _Encoder:
    def __init__(self, closed: Any, egraph: EGraph | None = None):
        self.closed = closed
        self.egraph = program_egraph() if egraph is None else egraph
        self.src = EggSource(self.egraph)  # the terms and facts, as egglog commands (egg_source.py)
        self.consts: list[Any] = []
        self.const_keys: dict[Any, int] = {}
        self.params: list[tuple[Any, dict]] = []
        self.param_keys: dict[Any, int] = {}
        self.eqns: list[Any] = []
        self.eqn_fns: dict[int, Any] = {}
        self.body_hook: Any = None
        self.cone_outputs: frozenset[int] = frozenset()  # outputs that reach a saturating op outside
        self._cone: set[Any] | None = None  # jaxpr variables that do (nonfinite.py), when first asked
        self.n_equations = 0
        self.sources: list[Any] = []  # per equation (order - 1): where it was written (compat.Source)
        self.primitives: dict[str, int] = {}
        self.const_is_arg: list[bool] = []
        self.levels: dict[str, int] = {}  # let name -> longest path from an input
        self.n_bound = 0  # let-bound equation terms (see `bind`)
        self.dots: list[DotSite] = []
        self.outers: list[OuterSite] = []
        self._broadcasts: dict[Any, Any] = {}  # broadcast_in_dim equations by output (note_outer)
        self.rows: dict[Sym, tuple[Sym, int]] = {}
        self.stacks: list[tuple[Sym, tuple[Sym, ...]]] = []
        self._row_slices: dict[Sym, tuple[Sym, int]] = {}  # x[i:i+1] -> (x, i)
        self._leads: dict[Sym, Sym] = {}  # broadcast of t to [1, *t.shape] -> t
        self._dot: tuple | None = None  # the dot `structural` just typed: (a, b, lc, rc, cfg)

    def t(self, ctor: Any, *args: Any) -> Sym:
        """The term `ctor(*args)` (a constructor of terms.py) as egglog text."""
        return self.src.call(ctor, *args)

    # --- side tables -------------------------------------------------------------------------
    def const(self, value: Any, aval: Any, literal: bool) -> Sym:
        key = None
        if literal and np.ndim(value) == 0:
            # by the exact bits: a literal's repr can round (jax 0.12 prints 0.000120001 as 0.00012)
            arr = np.asarray(value)
            key = ("lit", type(value).__name__, str(arr.dtype), arr.tobytes(), aval.weak_type)
        if key is not None and key in self.const_keys:
            return self.t(Tensor.const, self.const_keys[key])
        idx = len(self.consts)
        self.consts.append(value)
        self.const_is_arg.append(not literal)
        if key is not None:
            self.const_keys[key] = idx
        t = self.t(Tensor.const, idx)
        self.note_type(t, aval)
        value_fact = _scalar_value(value)
        if value_fact is not None:
            self.src.set(fill, t, to=value_fact)
        return t

    def param(self, prim: Any, params: dict) -> int:
        try:
            key = (prim.name, _freeze(params))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self.param_keys:
            return self.param_keys[key]
        idx = len(self.params)
        self.params.append((prim, params))
        if key is not None:
            self.param_keys[key] = idx
        return idx

    def note_position(self, t: Sym, lvl: int) -> None:
        """`order` and `level` of an equation's output (side conditions of the merge rules)."""
        self.src.set(order, t, to=self.n_equations)
        self.src.set(level, t, to=lvl)
        self.levels[t] = lvl

    def note_dot(self, eqn: Any, t: Sym, lvl: int) -> None:
        """Record an unbatched dot of rank-1/2 operands and one dtype (see DotSite)."""
        a, b, lc, rc, cfg = self._dot
        va, vb = eqn.invars[0].aval, eqn.invars[1].aval
        dts = {str(va.dtype), str(vb.dtype), str(eqn.outvars[0].aval.dtype)}
        if len(va.shape) in (1, 2) and len(vb.shape) in (1, 2) and len(dts) == 1:
            self.dots.append(DotSite(t, a, b, tuple(va.shape), tuple(vb.shape), lc, rc, cfg, lvl, dts.pop()))

    def note_stacking(self, eqn: Any, ins: list[Sym], t: Sym) -> None:
        """Record rows x[i] (a unit slice of the leading axis, squeezed) and stacks along a new
        leading axis (`stack`, or a concatenate of unit-axis broadcasts): see Program.rows."""
        name, p = eqn.primitive.name, eqn.params
        shape_in = tuple(eqn.invars[0].aval.shape) if eqn.invars else ()
        if name == "slice" and shape_in and not any(s != 1 for s in p.get("strides") or ()):
            lo, hi = p["start_indices"], p["limit_indices"]
            rest_whole = all(a == 0 and b == n for a, b, n in zip(lo[1:], hi[1:], shape_in[1:], strict=True))
            if hi[0] == lo[0] + 1 and rest_whole:
                self._row_slices[t] = (ins[0], int(lo[0]))
        elif name == "squeeze" and tuple(p["dimensions"]) == (0,) and ins[0] in self._row_slices:
            self.rows[t] = self._row_slices[ins[0]]
        elif name == "broadcast_in_dim" and tuple(p["shape"]) == (1, *shape_in):
            if tuple(p["broadcast_dimensions"]) == tuple(range(1, len(shape_in) + 1)):
                self._leads[t] = ins[0]
        elif name == "stack" and p.get("axis") == 0:
            self.stacks.append((t, tuple(ins)))
        elif name == "concatenate" and p["dimension"] == 0 and all(i in self._leads for i in ins):
            self.stacks.append((t, tuple(self._leads[i] for i in ins)))

    def note_outer(self, eqn: Any, own: bool, env: dict, ins: list[Sym], t: Sym) -> None:
        """Record outer products (sites.OuterSite) and the broadcasts they may be written with."""
        name = eqn.primitive.name if own and len(eqn.outvars) == 1 else ""
        if name == "broadcast_in_dim" and eqn.params.get("sharding") is None:
            self._broadcasts[eqn.outvars[0]] = eqn
        elif name == "dot_general" and (form := outer_form(eqn)) is not None:
            self.outers.append(OuterSite(t, ins[0], ins[1], *form))
        elif name == "mul" and (found := broadcast_outer(eqn, self._broadcasts)) is not None:
            p, q, nb = found
            sa, sb = tuple(p.aval.shape), tuple(q.aval.shape)
            a, b = self.read(env, p), self.read(env, q)
            self.outers.append(OuterSite(t, a, b, sa, sb, nb, str(p.aval.dtype), written=True))

    def note_type(self, t: Sym, aval: Any) -> None:
        self.src.set(shape, t, to=ivec(aval.shape))
        self.src.set(dtype, t, to=Str(str(aval.dtype)))

    def bind(self, t: Sym) -> Sym:
        """A let-bound name for an equation's term. Terms built on the name, and facts about it,
        stay O(1) in size; unbound, each term would hold the whole program below it and encoding
        would be quadratic in the equation count."""
        self.n_bound += 1
        return self.src.let(f"$jaxrw{self.n_bound}", t)

    # --- walking -----------------------------------------------------------------------------
    def read(self, env: dict, v: Any) -> Sym:
        if compat.is_literal(v):
            return self.const(v.val, v.aval, literal=True)
        return env[v]

    def run(self, jaxpr: Any, consts: list[Sym], args: list[Sym], scope: Any = None) -> list[Sym]:
        """The output terms of `jaxpr`'s equations (nested jits inlined: their equations' scopes
        under `scope`, the jit's own)."""
        env: dict[Any, Sym] = {}
        for v, t in zip(jaxpr.constvars, consts, strict=True):
            env[v] = t
        for v, t in zip(jaxpr.invars, args, strict=True):
            env[v] = t
        for eqn in jaxpr.eqns:
            ins = [self.read(env, v) for v in eqn.invars]
            name = eqn.primitive.name
            own = not impostor(eqn.primitive)  # jax's own primitive: its name may be acted on
            if name in compat.ENCODER_INLINED and own:
                body = compat.call_body(eqn)
                inner_consts = [self.const(c, _aval(c), literal=False) for c in body.consts]
                outs = self.run(body.jaxpr, inner_consts, ins, compat.source_of(eqn, scope).name_stack)
            else:
                self.n_equations += 1
                self.sources.append(compat.source_of(eqn, scope))
                self.primitives[name] = self.primitives.get(name, 0) + 1
                self._dot = None
                modeled = own and not touches_empty(eqn)  # its name may be acted on
                outs = [self.bind(o) for o in self.equation(eqn, ins, modeled)]
                lvl = 1 + max((self.levels.get(t, 0) for t in ins), default=0)
                if self._dot is not None:
                    self.note_dot(eqn, outs[0], lvl)
                self.note_outer(eqn, own, env, ins, outs[0])
                if len(outs) == 1 and modeled:
                    self.note_stacking(eqn, ins, outs[0])
                for o, v in zip(outs, eqn.outvars, strict=True):
                    self.note_type(o, v.aval)
                    self.note_position(o, lvl)
                if own and eqn.params.get("branches_platforms") and name == "cond":
                    self.platform_cond(eqn, ins, outs)
                if own and name == "gather" and diagonal_gather(jaxpr, None, eqn):
                    self.diagonal(outs[0], ins[0], eqn.invars[0].aval.shape)
            for v, o in zip(eqn.outvars, outs, strict=True):
                if not compat.is_dropvar(v):
                    env[v] = o
        return [self.read(env, v) for v in jaxpr.outvars]

    def platform_cond(self, eqn: Any, ins: list[Sym], outs: list[Sym]) -> None:
        """A platform-dependent cond (jnp.diagonal of a square matrix in jax 0.12: a gather by
        default, Σ_0 I∘x for Mosaic) is opaque here; what the branch this platform runs computes
        is read where it is known. Where it gathers x[i, i] of an operand x (its indices, made
        from iotas, are evaluated to check), its first output is `diagonal_of(out, x)`
        (rules/reduce.py platform_diagonal); an output that depends on no operand (the indices,
        a residual under jax.grad) is that constant, so the cond need not stay for it. Other
        branches are not read: jax runs only one, and need not make them agree."""
        branch = running_branch(eqn)
        if branch is None:
            return
        k = gathered_diagonal(branch)
        if k is not None:
            self.diagonal(outs[0], ins[1 + k], branch.jaxpr.invars[k].aval.shape)
        for out, var in zip(outs, branch.jaxpr.outvars, strict=True):
            value = constant_value(branch.jaxpr, list(branch.consts), var)
            if value is not None:
                self.src.add(f"(union {out} {self.const(value, var.aval, literal=False)})")

    def diagonal(self, out: Sym, x: Sym, shape: tuple[int, ...]) -> None:
        """Record out = x[.., i, i] (reduce.platform_diagonal): of x's square leading block where
        its last two axes differ (a slice of a product is a product of slices: reduce.slice_dot)."""
        n, m = shape[-2:]
        if n != m:
            x = self.t(Tensor.slice, x, len(shape) - (1 if m > n else 2), 0, min(n, m))
        self.src.add(self.t(diagonal_of, out, x))

    def equation(self, eqn: Any, ins: list[Sym], own: bool = True) -> list[Sym]:
        """Terms for one equation's outputs (opaque unless `own`: a primitive jax.lax's by name only,
        no value of it empty: `touches_empty`)."""
        name, p = eqn.primitive.name, eqn.params
        plain = all(v is None for v in p.values())
        if len(eqn.outvars) == 1 and not eqn.effects and own:
            if name in ELEMENTWISE_TYPED and plain and len(ins) == 2:
                return [self.t(ELEMENTWISE_TYPED[name], ins[0], ins[1])]
            if name == "neg" and plain:
                return [self.t(Tensor.neg, ins[0])]
            if name in UNARY and plain and len(ins) == 1:
                return [self.t(Tensor.unary, Str(name), ins[0])]
            if name in BINARY and plain and len(ins) == 2:
                return [self.t(Tensor.binary, Str(name), ins[0], ins[1])]
            typed = self.structural(eqn, ins)
            if typed is not None:
                return [typed]
            if name in CUSTOM_CALLS and elementwise_call(eqn):
                self.saturating_operands(ins)
                return [self.t(Tensor.op, Str(ELEMENTWISE_CALL), self.param(eqn.primitive, p), Vec(ins))]
            if name in COVERED or name in nonfinite.VALUE_IDENTITIES:
                if name not in nonfinite.VALUE_IDENTITIES or self.out_cone(eqn):
                    self.saturating_operands(ins)  # an identity's operand: only where its value is
                return [self.t(Tensor.op, Str(name), self.param(eqn.primitive, p), Vec(ins))]
        self.saturating_operands(ins)
        idx = len(self.eqns)
        self.eqns.append(eqn)
        if self.body_hook is not None:
            replacement = self.body_hook(eqn, self.out_cone(eqn))
            if replacement is not None:
                self.eqn_fns[idx] = replacement
        return [self.t(Tensor.opaque, idx, k, Vec(ins)) for k in range(len(eqn.outvars))]

    def out_cone(self, eqn: Any) -> frozenset[int]:
        """Which outputs of `eqn` reach a saturating op. The cone of the whole jaxpr is computed
        the first time a body asks (control-flow bodies are rewritten before this program's
        e-graph exists); programs without control flow never pay for it."""
        if self._cone is None:
            self._cone = nonfinite.jaxpr_cone(self.closed.jaxpr, self.cone_outputs, _inlined_body)
        return frozenset(i for i, v in enumerate(eqn.outvars) if v in self._cone)

    def saturating_operands(self, ins: list[Sym]) -> None:
        """Operands of ops the e-graph does not model may meet a saturating function there: they
        are in the cone (nonfinite.py; the rules cannot index a Vec of operands)."""
        for t in ins:
            self.src.set(nonfinite.cone, t, to=1)

    def structural(self, eqn: Any, ins: list[Sym]) -> Sym | None:
        """Typed dot/transpose/concat/slice/sum where the parameters fit the typed form."""
        name, p = eqn.primitive.name, eqn.params
        extra_none = all(v is None for k, v in p.items() if k in ("out_sharding", "sharding"))
        if name == "dot_general" and extra_none:
            (lc, rc), (lb, rb) = p["dimension_numbers"]
            nb = len(lb)
            # a precision per operand that differs, (HIGHEST, DEFAULT): rules that swap a dot's
            # operands (transpose_out, assoc_2d, kron_dot) keep `cfg` as written and would hand
            # HIGHEST to the other operand (0.117 apart on a TPU for a 512x256 @ 256x64
            # product); such a dot stays as written
            # Nor are boolean dots rewritten: their sums are ORs (`ones(bool) @ B` became
            # sum(B), which reduce_sum refuses for bool: a fallback on a valid program)
            prec = p.get("precision")
            one_precision = not (isinstance(prec, tuple | list) and len(set(prec)) > 1)
            boolean = eqn.invars[0].aval.dtype == np.bool_ or eqn.invars[1].aval.dtype == np.bool_
            if (
                one_precision
                and not boolean
                and len(lc) == 1
                and len(rc) == 1
                and tuple(lb) == tuple(range(nb))
                and tuple(rb) == tuple(range(nb))
                and lc[0] >= nb
                and rc[0] >= nb
                and nb <= 2
            ):
                cfg = {k: v for k, v in p.items() if k != "dimension_numbers"}
                cid = self.param(eqn.primitive, cfg)
                pet = p.get("preferred_element_type")
                self.src.set(cfg_dtype, cid, to=Str("" if pet is None else str(pet)))
                in_dt = str(eqn.invars[0].aval.dtype)
                same_in = in_dt == str(eqn.invars[1].aval.dtype)
                plain = all(v is None for k, v in cfg.items() if k != "preferred_element_type")
                if plain and same_in and (pet is None or str(pet) == in_dt):
                    self.src.add(self.t(plain_cfg, cid, Str(in_dt)))
                if nb == 0:
                    self._dot = (ins[0], ins[1], int(lc[0]), int(rc[0]), cid)
                return self.t(Tensor.dot, ins[0], ins[1], nb, int(lc[0]), int(rc[0]), cid)
        if name == "transpose" and len(p["permutation"]) in (2, 3, 4):  # shapes: terms.py
            return self.t(Tensor.transpose, ins[0], ivec(p["permutation"]))
        if name == "concatenate" and len(ins) >= 2:
            out = ins[0]
            for t in ins[1:]:
                out = self.t(Tensor.concat, out, t, int(p["dimension"]))
                # intermediate shapes of the nest are derived by the analysis rules
            return out
        if name == "slice" and (not p.get("strides") or all(s == 1 for s in p["strides"])):
            full = eqn.invars[0].aval.shape
            cut = [
                i
                for i, (a, b, n) in enumerate(zip(p["start_indices"], p["limit_indices"], full, strict=True))
                if (a, b) != (0, n)
            ]
            if len(cut) == 1:
                ax = cut[0]
                return self.t(
                    Tensor.slice, ins[0], ax, int(p["start_indices"][ax]), int(p["limit_indices"][ax])
                )
            if len(cut) > 1 and p.get("strides") is None:
                return self.t(Tensor.slice_nd, ins[0], ivec(p["start_indices"]), ivec(p["limit_indices"]))
        if name == "reduce_sum" and extra_none and len(p["axes"]) in (1, 2):
            return self.t(Tensor.sum, ins[0], ivec(sorted(p["axes"])))
        return self.typed_ops(eqn, ins)

    def typed_ops(self, eqn: Any, ins: list[Sym]) -> Sym | None:
        """Typed forms of ops the structured/elementwise rules read. Each decodes (decode.py) to a
        jax.lax call that binds the same primitive with the same parameters."""
        name, p = eqn.primitive.name, eqn.params
        no_sharding = p.get("sharding") is None and p.get("out_sharding") is None
        if name == "broadcast_in_dim" and no_sharding and len(ins) == 1:
            return self.t(Tensor.broadcast_in_dim, ins[0], ivec(p["shape"]), ivec(p["broadcast_dimensions"]))
        if name == "reshape" and no_sharding and p.get("dimensions") is None and len(ins) == 1:
            return self.t(Tensor.reshape, ins[0], ivec(p["new_sizes"]))
        if name == "squeeze" and len(p["dimensions"]) == 1:
            return self.t(Tensor.squeeze, ins[0], int(p["dimensions"][0]))
        if name == "convert_element_type" and no_sharding and not p.get("weak_type"):
            return self.t(Tensor.convert_element_type, ins[0], Str(str(np.dtype(p["new_dtype"]))))
        if name == "select_n" and len(ins) == 3:
            return self.t(Tensor.select_n, ins[0], ins[1], ins[2])
        if name == "iota" and no_sharding:
            dt = Str(str(np.dtype(p["dtype"])))
            return self.t(Tensor.iota, dt, ivec(p["shape"]), int(p["dimension"]))
        if name == "integer_pow":
            return self.t(Tensor.integer_pow, ins[0], int(p["y"]))
        if name in ("reduce_max", "reduce_min") and no_sharding and len(p["axes"]) in (1, 2):
            ctor = Tensor.reduce_max if name == "reduce_max" else Tensor.reduce_min
            return self.t(ctor, ins[0], ivec(sorted(p["axes"])))
        if name == "pad" and len(ins) == 2:
            cfg = [int(x) for triple in p["padding_config"] for x in triple]
            return self.t(Tensor.pad, ins[0], ins[1], ivec(cfg))
        if name == "stack" and set(p) == {"axis"} and ins:
            return self.t(Tensor.stack, Vec(ins), int(p["axis"]))
        return None


def _scalar_value(value: Any) -> float | None:
    """The number a rank-0 numeric constant holds (for `fill`), or None."""
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - opaque constants (keys, tokens) have no value
        return None
    if arr.ndim != 0 or arr.dtype.kind not in "iuf" and str(arr.dtype) != "bfloat16":
        return None
    v = float(arr.astype(np.float64))
    return v if np.isfinite(v) else None


def _aval(x: Any) -> Any:
    return compat.get_aval(x)


@functools.cache
def _lax_primitives() -> dict[str, Any]:
    return {p.name: p for p in vars(jax.lax).values() if isinstance(p, jax.extend.core.Primitive)}


def impostor(primitive: Any) -> bool:
    """A primitive named like one of jax.lax's that is not it (a user's `Primitive("exp")`): the
    rules and decode act on names, so it is kept opaque. Names jax.lax does not export (pjit,
    custom_jvp_call) cannot be told apart and are taken as jax's."""
    known = _lax_primitives().get(primitive.name)
    return known is not None and known is not primitive


def touches_empty(eqn: Any) -> bool:
    """Whether an operand or result of the equation has zero elements. Such an equation stays
    opaque: nothing is gained on it, and concatenations of empty arrays have the shape of their
    parts, so merge and slice rules grew the e-graph without bound on them (make fuzz: a hang).
    The rest of the program is rewritten (lax.associative_scan makes empty slices)."""
    values = (*eqn.invars, *eqn.outvars)
    return any(getattr(getattr(v, "aval", None), "size", 1) == 0 for v in values)


def _freeze(x: Any) -> Any:
    """A hashable key for parameter dicts (dtypes and tuples compare by value)."""
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, list | tuple):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, np.dtype):
        return ("dtype", str(x))
    hash(x)
    return x


def encode(
    closed: Any,
    body_hook: Any = None,
    cone_outputs: frozenset[int] = frozenset(),
    egraph: EGraph | None = None,
) -> Program:
    """Load a ClosedJaxpr into `egraph` (one lent by lease.py, holding only a template's contents),
    else a fresh e-graph; raise UnsupportedProgramError for effects other
    than debug calls in the bodies of loops and conds that are outputs (effects.loops_only).
    `body_hook(eqn, out_cone)` may supply a replacement for an opaque equation (see control.py);
    `out_cone` says which of its outputs reach a saturating op (nonfinite.py), as `cone_outputs`
    says of this program's outputs where it is a body itself."""
    if closed.effects and not loops_only(closed):
        names = sorted({type(e).__name__ for e in closed.effects})
        if names == ["NamedAxisEffect"]:  # not a side effect, but the axis is bound outside this trace
            raise UnsupportedProgramError(
                "collectives over a named axis bound outside the function (psum in the body of a "
                "shard_map, pmap or vmap with axis_name) are not rewritten: optimize the function "
                "that calls shard_map instead"
            )
        raise UnsupportedProgramError(f"programs with side effects are not rewritten (effects: {names})")
    _refuse_symbolic_shapes(closed)
    enc = _Encoder(closed, egraph)
    enc.body_hook = body_hook
    enc.cone_outputs = cone_outputs
    args = []
    for i, v in enumerate(closed.jaxpr.invars):
        t = enc.t(Tensor.var, i)
        enc.note_type(t, v.aval)
        args.append(t)
    consts = [enc.const(c, _aval(c), literal=False) for c in closed.consts]
    outs = enc.run(closed.jaxpr, consts, args)
    for i, t in enumerate(outs):
        enc.src.add(enc.t(Out.of, i, t))
        if i in cone_outputs:
            enc.src.set(nonfinite.cone, t, to=1)
    enc.src.set(cfg_dtype, DEFAULT_CFG, to=Str(""))
    enc.src.flush()
    eg = enc.egraph
    return Program(
        egraph=eg,
        in_avals=[v.aval for v in closed.jaxpr.invars],
        out_avals=[v.aval for v in closed.jaxpr.outvars],
        outputs=outs,
        consts=enc.consts,
        params=enc.params,
        eqns=enc.eqns,
        n_equations=enc.n_equations,
        sources=enc.sources,
        primitives=enc.primitives,
        const_is_arg=enc.const_is_arg,
        eqn_fns=enc.eqn_fns,
        symbols=frozenset({*enc.src.refs, ref_of(float_dtype)}),  # float_dtype: new_egraph's rows
        dots=enc.dots,
        outers=enc.outers,
        rows=enc.rows,
        stacks=enc.stacks,
    )


def _refuse_symbolic_shapes(closed: Any) -> None:
    """Raise UnsupportedProgramError in one line for an argument of symbolic shape (jax.export with
    jax.export.symbolic_shape): the e-graph's shapes are numbers (jax's own error, where a size is
    read, was three paragraphs a user took for a crash)."""
    for i, v in enumerate(closed.jaxpr.invars):
        shape = getattr(v.aval, "shape", ())
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            dims = ", ".join(str(d) for d in shape)
            raise UnsupportedProgramError(
                f"argument {i} has a symbolic shape ({dims}): only programs of concrete shapes are rewritten"
            )


def _inlined_body(eqn: Any) -> Any:
    return compat.call_body(eqn) if eqn.primitive.name in compat.ENCODER_INLINED else None


def encoded_equations(jaxpr: Any) -> Iterator[Any]:
    """The equations `encode` sees, in its order: nested jit/closed_call bodies inlined."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in compat.ENCODER_INLINED:
            yield from encoded_equations(compat.call_body(eqn).jaxpr)
        else:
            yield eqn


def count_equations(jaxpr: Any) -> int:
    """How many equations `encode` would see, cheaply (no e-graph)."""
    return sum(1 for _ in encoded_equations(jaxpr))

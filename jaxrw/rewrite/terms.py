"""The typed egglog term language: one constructor per tensor concept, plus shape/dtype analysis.

Every term is a `Tensor`. Inputs, constants and opaque equations index side tables kept by the
encoder (`Program`), so the e-graph holds only structure. Typed constructors exist for the
operations rules match or create; other covered primitives use `Tensor.op` with a parameter
table id; everything else is `Tensor.opaque`, which keeps the original equation.

`shape(t)` and `dtype(t)` are egglog functions: the encoder sets them for every original term and
the `analysis` ruleset derives them for terms that rules create, so rules can read sizes (for
slices after a merge) and every e-class carries its type for the cost model.
"""

from __future__ import annotations

from egglog import (
    EGraph,
    Expr,
    String,
    StringLike,
    Vec,
    eq,
    function,
    i64,
    i64Like,
    rule,
    ruleset,
    set_,
    vars_,
)

__all__ = ["Tensor", "Out", "shape", "dtype", "analysis", "new_egraph"]


class Tensor(Expr):
    """A tensor-valued term. Constructors mirror jax.lax; see the module docstring."""

    @classmethod
    def var(cls, index: i64Like) -> Tensor:
        """The `index`-th flat input of the program."""

    @classmethod
    def const(cls, index: i64Like) -> Tensor:
        """A constant (closed-over array or literal) from the program's constant table."""

    @classmethod
    def add(cls, a: Tensor, b: Tensor) -> Tensor: ...

    @classmethod
    def sub(cls, a: Tensor, b: Tensor) -> Tensor: ...

    @classmethod
    def mul(cls, a: Tensor, b: Tensor) -> Tensor: ...

    @classmethod
    def div(cls, a: Tensor, b: Tensor) -> Tensor: ...

    @classmethod
    def neg(cls, a: Tensor) -> Tensor: ...

    @classmethod
    def binary(cls, name: StringLike, a: Tensor, b: Tensor) -> Tensor:
        """Other elementwise binary primitives by name: max, min, pow, comparisons, ..."""

    @classmethod
    def unary(cls, name: StringLike, a: Tensor) -> Tensor:
        """Elementwise unary primitives by name: exp, log, tanh, sqrt, ..."""

    @classmethod
    def dot(cls, a: Tensor, b: Tensor, nb: i64Like, lc: i64Like, rc: i64Like, cfg: i64Like) -> Tensor:
        """dot_general with `nb` leading batch dims on both sides and one contracting dim each.

        `lc`/`rc` are the contracting axes of a and b; `cfg` indexes (precision,
        preferred_element_type) in the parameter table. Output: batch, a's free, b's free axes.
        """

    @classmethod
    def transpose(cls, a: Tensor, perm: Vec[i64]) -> Tensor: ...

    @classmethod
    def concat(cls, a: Tensor, b: Tensor, axis: i64Like) -> Tensor:
        """Binary concatenation; n-ary jaxpr concatenates nest to the left (decode flattens)."""

    @classmethod
    def slice(cls, a: Tensor, axis: i64Like, start: i64Like, stop: i64Like) -> Tensor:
        """A unit-stride slice along one axis."""

    @classmethod
    def sum(cls, a: Tensor, axes: Vec[i64]) -> Tensor:
        """reduce_sum over `axes` (sorted)."""

    @classmethod
    def op(cls, name: StringLike, params: i64Like, args: Vec[Tensor]) -> Tensor:
        """A covered primitive with parameters from the table (reshape, broadcast_in_dim, ...)."""

    @classmethod
    def opaque(cls, eqn: i64Like, out: i64Like, args: Vec[Tensor]) -> Tensor:
        """Output `out` of original equation `eqn`, kept as it is; rewrites flow around it."""


class Out(Expr):
    """Ties output `index` of the program to its term, so all outputs share one e-graph."""

    @classmethod
    def of(cls, index: i64Like, t: Tensor) -> Out: ...


@function(merge=lambda old, new: old)
def shape(t: Tensor) -> Vec[i64]:
    """The shape of a term (an e-class invariant)."""


@function(merge=lambda old, new: old)
def dtype(t: Tensor) -> String:
    """The dtype name of a term (an e-class invariant)."""


analysis = ruleset(name="analysis")
_a, _b, _t = vars_("a b t", Tensor)
_sa, _sb, _perm, _axes = vars_("sa sb perm axes", Vec[i64])
_n, _lc, _rc, _ax, _s0, _s1, _cfg = vars_("n lc rc ax s0 s1 cfg", i64)
_name, _d = vars_("name d", String)


@analysis.register
def _shape_rules():
    # Elementwise: the operand of highest rank gives the shape (scalar literals broadcast).
    for ctor in (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div):
        yield rule(eq(_t).to(ctor(_a, _b)), eq(_sa).to(shape(_a)), eq(_sb).to(shape(_b)),
                   _sb.length() <= _sa.length(), eq(_d).to(dtype(_a))).then(
            set_(shape(_t)).to(_sa), set_(dtype(_t)).to(_d))
        yield rule(eq(_t).to(ctor(_a, _b)), eq(_sa).to(shape(_a)), eq(_sb).to(shape(_b)),
                   _sa.length() < _sb.length(), eq(_d).to(dtype(_b))).then(
            set_(shape(_t)).to(_sb), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.neg(_a)), eq(_sa).to(shape(_a)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.unary(_name, _a)), eq(_sa).to(shape(_a)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa), set_(dtype(_t)).to(_d))
    # dot with 0..2 leading batch dims: batch + a free + b free; dtype follows a (rules that
    # create dots only fire where the output dtype equals the operand dtype).
    yield rule(eq(_t).to(Tensor.dot(_a, _b, 0, _lc, _rc, _cfg)), eq(_sa).to(shape(_a)),
               eq(_sb).to(shape(_b)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.remove(_lc).append(_sb.remove(_rc))), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.dot(_a, _b, 1, _lc, _rc, _cfg)), eq(_sa).to(shape(_a)),
               eq(_sb).to(shape(_b)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.remove(_lc).append(_sb.remove(_rc).remove(0))), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.dot(_a, _b, 2, _lc, _rc, _cfg)), eq(_sa).to(shape(_a)),
               eq(_sb).to(shape(_b)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.remove(_lc).append(_sb.remove(_rc).remove(0).remove(0))),
        set_(dtype(_t)).to(_d))
    # transpose of rank 2 and 3
    yield rule(eq(_t).to(Tensor.transpose(_a, _perm)), eq(_sa).to(shape(_a)), eq(_perm.length()).to(i64(2)),
               eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(Vec(_sa[_perm[0]], _sa[_perm[1]])), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.transpose(_a, _perm)), eq(_sa).to(shape(_a)), eq(_perm.length()).to(i64(3)),
               eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(Vec(_sa[_perm[0]], _sa[_perm[1]], _sa[_perm[2]])), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.concat(_a, _b, _ax)), eq(_sa).to(shape(_a)), eq(_sb).to(shape(_b)),
               eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.set(_ax, _sa[_ax] + _sb[_ax])), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.slice(_a, _ax, _s0, _s1)), eq(_sa).to(shape(_a)), eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.set(_ax, _s1 - _s0)), set_(dtype(_t)).to(_d))
    # sums over one or two axes (rules create no wider reductions)
    yield rule(eq(_t).to(Tensor.sum(_a, _axes)), eq(_sa).to(shape(_a)), eq(_axes.length()).to(i64(1)),
               eq(_d).to(dtype(_a))).then(set_(shape(_t)).to(_sa.remove(_axes[0])), set_(dtype(_t)).to(_d))
    yield rule(eq(_t).to(Tensor.sum(_a, _axes)), eq(_sa).to(shape(_a)), eq(_axes.length()).to(i64(2)),
               eq(_d).to(dtype(_a))).then(
        set_(shape(_t)).to(_sa.remove(_axes[1]).remove(_axes[0])), set_(dtype(_t)).to(_d))


def new_egraph() -> EGraph:
    """A fresh e-graph for one program."""
    return EGraph()

"""The typed egglog term language: one constructor per tensor concept, plus shape/dtype analysis.

Every term is a `Tensor`. Inputs, constants and opaque equations index side tables kept by the
encoder (`Program`), so the e-graph holds only structure. Typed constructors exist for the
operations rules match or create (they are named after the jax primitive they decode to, so the
cost models price them like the primitive); other covered primitives use `Tensor.op` with a
parameter table id; everything else is `Tensor.opaque`, which keeps the original equation.

`shape(t)` and `dtype(t)` are egglog functions: the encoder sets them for every original term and
the `analysis` ruleset derives them for terms that rules create, so rules can read sizes (for
slices after a merge) and every e-class carries its type for the cost model.

The analysis also derives facts that rules use as side conditions, never equalities:
`fill(t)` (every element of t equals this number), `is_eye`, `is_eye_mask`, `positive`,
`nonneg`, and, for the multi-dot merges, an order on the dots that share an operand (see
`lfirst`/`lnext` below). The encoder sets `order(t)` (position in the program) and `level(t)`
(longest path from an input) for the terms of the program as written; two terms of equal level
cannot depend on each other, which is what lets merges of "independent" dots be stated.
"""

from __future__ import annotations

from egglog import (
    EGraph,
    Expr,
    String,
    StringLike,
    Vec,
    delete,
    eq,
    f64,
    function,
    i64,
    i64Like,
    ne,
    relation,
    rule,
    ruleset,
    set_,
    union,
    vars_,
)

__all__ = [
    "Tensor",
    "Out",
    "shape",
    "dtype",
    "fill",
    "order",
    "level",
    "cfg_dtype",
    "is_eye",
    "is_eye_mask",
    "kept_diagonal",
    "outer_of",
    "positive",
    "nonneg",
    "float_dtype",
    "structured",
    "plain_cfg",
    "joined",
    "diagonal_of",
    "FLOATS",
    "lfirst",
    "lnext",
    "rfirst",
    "rnext",
    "analysis",
    "new_egraph",
    "DEFAULT_CFG",
]

# The `cfg` of dots that rules create where the program had none to copy: precision None and
# the operand dtype as preferred element type (accumulating in float32 for bf16/f16; see decode).
DEFAULT_CFG = -1


class Tensor(Expr):
    """A tensor-valued term. Constructors mirror jax.lax; see the module docstring."""

    @classmethod
    def var(cls, index: i64Like) -> Tensor:
        """The `index`-th flat input of the program."""

    @classmethod
    def const(cls, index: i64Like) -> Tensor:
        """A constant (closed-over array or literal) from the program's constant table."""

    @classmethod
    def scalar(cls, num: i64Like, den: i64Like, dtype: StringLike) -> Tensor:
        """A rank-0 literal num/den of `dtype`, created by rules (e.g. the 2 of X + X -> 2X)."""

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
    def integer_pow(cls, a: Tensor, y: i64Like) -> Tensor: ...

    @classmethod
    def dot(cls, a: Tensor, b: Tensor, nb: i64Like, lc: i64Like, rc: i64Like, cfg: i64Like) -> Tensor:
        """dot_general with `nb` leading batch dims on both sides and one contracting dim each.

        `lc`/`rc` are the contracting axes of a and b; `cfg` indexes (precision,
        preferred_element_type) in the parameter table (DEFAULT_CFG: none to copy).
        Output: batch, a's free, b's free axes.
        """

    @classmethod
    def transpose(cls, a: Tensor, perm: Vec[i64]) -> Tensor: ...

    @classmethod
    def concat(cls, a: Tensor, b: Tensor, axis: i64Like) -> Tensor:
        """Binary concatenation; n-ary jaxpr concatenates nest to the left (decode flattens)."""

    @classmethod
    def stack(cls, args: Vec[Tensor], axis: i64Like) -> Tensor:
        """The `stack` primitive (jax >= 0.12): the operands joined along a new axis."""

    @classmethod
    def slice(cls, a: Tensor, axis: i64Like, start: i64Like, stop: i64Like) -> Tensor:
        """A unit-stride slice along one axis."""

    @classmethod
    def slice_nd(cls, a: Tensor, starts: Vec[i64], limits: Vec[i64]) -> Tensor:
        """A unit-stride slice along several axes (rules split it into `slice`s)."""

    @classmethod
    def broadcast_in_dim(cls, a: Tensor, shape: Vec[i64], dims: Vec[i64]) -> Tensor:
        """Operand axis i becomes output axis dims[i] (size equal, or 1 and broadcast)."""

    @classmethod
    def reshape(cls, a: Tensor, shape: Vec[i64]) -> Tensor:
        """Row-major reshape (dimensions=None)."""

    @classmethod
    def squeeze(cls, a: Tensor, axis: i64Like) -> Tensor:
        """Drop one unit axis."""

    @classmethod
    def convert_element_type(cls, a: Tensor, dtype: StringLike) -> Tensor: ...

    @classmethod
    def select_n(cls, pred: Tensor, on_false: Tensor, on_true: Tensor) -> Tensor:
        """select_n with two cases: where(pred, on_true, on_false)."""

    @classmethod
    def iota(cls, dtype: StringLike, shape: Vec[i64], dim: i64Like) -> Tensor: ...

    @classmethod
    def pad(cls, a: Tensor, value: Tensor, config: Vec[i64]) -> Tensor:
        """lax.pad; `config` is the flattened (low, high, interior) per axis."""

    @classmethod
    def sum(cls, a: Tensor, axes: Vec[i64]) -> Tensor:
        """reduce_sum over `axes` (sorted)."""

    @classmethod
    def reduce_max(cls, a: Tensor, axes: Vec[i64]) -> Tensor: ...

    @classmethod
    def reduce_min(cls, a: Tensor, axes: Vec[i64]) -> Tensor: ...

    @classmethod
    def op(cls, name: StringLike, params: i64Like, args: Vec[Tensor]) -> Tensor:
        """A covered primitive with parameters from the table (cumsum, clamp, ...)."""

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


@function(merge=lambda old, new: old)
def fill(t: Tensor) -> f64:
    """Every element of `t` equals this value (scalar literals and their broadcasts)."""


@function(merge=lambda old, new: old)
def order(t: Tensor) -> i64:
    """Position of an original equation's output in the program (set by the encoder)."""


@function(merge=lambda old, new: old.max(new))
def level(t: Tensor) -> i64:
    """Longest path from an input to this original term (set by the encoder)."""


@function(merge=lambda old, new: old)
def cfg_dtype(cfg: i64Like) -> String:
    """The preferred element type of a dot configuration, "" for none (set by the encoder)."""


is_eye_mask = relation("is_eye_mask", Tensor)  # t[i, j] = (i == j), a square boolean matrix
is_eye = relation("is_eye", Tensor)  # t is an identity matrix (of a numeric dtype)
positive = relation("positive", Tensor)  # t > 0 elementwise (in real arithmetic)
nonneg = relation("nonneg", Tensor)  # t >= 0 elementwise (in real arithmetic)
float_dtype = relation("float_dtype", String)  # the floating-point dtype names
# t is built from lower-rank data: a broadcast, a product of such (an outer product), a low-rank
# product, a constant fill or an identity (products with it are cheap: what distributing a
# product over a sum needs)
structured = relation("structured", Tensor)
# plain_cfg(cfg, d): dots of dtype d under this configuration compute what DEFAULT_CFG computes
# (no precision override, output in the operand dtype); set by the encoder
plain_cfg = relation("plain_cfg", i64, String)
# joined(a, b): a = b, written by a seed (rules/batch.py) and made a union by the analysis, which
# runs next. A union written as a command of its own costs a pass over the e-graph (egglog 14:
# 0.45 us per row; 2,000 of them on 20k rows, 3 s); as facts, one rule applies them all
joined = relation("joined", Tensor, Tensor)
# diagonal_of(t, x): t = x[.., i, i] for an x square in its last two axes, where jnp.diagonal is a
# gather or a platform-dependent cond (jax 0.12) the e-graph cannot read: the encoder checked that
# it gathers exactly the diagonal (encode.py); rules/reduce.py platform_diagonal states it as a sum
diagonal_of = relation("diagonal_of", Tensor, Tensor)
# kept_diagonal(t, a, b, nb, form): t is the product of a and bᵀ over their last two axes (a: [.., i, k],
# b: [.., j, k], past nb leading batch axes) kept on its diagonal, zero off it, by a mask of `form`
# ("select": where(I, ·, 0); "eye": ·∘I, NaN off it for an Inf there). Found once per product by
# rules/reduce.py diag_dot, whose sums over it then need no pattern per layout
kept_diagonal = relation("kept_diagonal", Tensor, Tensor, Tensor, i64, String)
# outer_of(t, p, q, nb): t[.., i, j] = p[.., i] q[.., j] past nb leading batch axes (p, q of t's
# dtype), written by rules/outer.py's seed where the program has such a product, and by its rules
# for what they derive; the other outer rules query it, so a program without one never pays for
# them (reach.py)
outer_of = relation("outer_of", Tensor, Tensor, Tensor, i64)


# Groups of dots for the multi-dot merges (rules/merge.py, rules/batch.py). A group holds the
# original dots of one level that share an operand (or, for batching, operand shapes); `*first`
# is the smallest `order` in the group and `*next(x)` the order of the member after x, so merge
# rules build one run per group (first, first+next, ...) instead of every subset.
@function(merge=lambda old, new: old.min(new))
def lfirst(a: Tensor, nb: i64Like, lc: i64Like, rc: i64Like, cfg: i64Like, lvl: i64Like) -> i64:
    """Smallest order among dots dot(a, B) of this form and level, B with one free axis."""


@function(merge=lambda old, new: old.min(new))
def lnext(x: Tensor) -> i64:
    """Order of the next dot after x in x's left-shared group."""


@function(merge=lambda old, new: old.min(new))
def rfirst(b: Tensor, nb: i64Like, lc: i64Like, rc: i64Like, cfg: i64Like, lvl: i64Like) -> i64:
    """Smallest order among dots dot(A, b) of this form and level, A with one free axis."""


@function(merge=lambda old, new: old.min(new))
def rnext(x: Tensor) -> i64:
    """Order of the next dot after x in x's right-shared group."""


analysis = ruleset(name="analysis")
_a, _b, _c, _t, _x, _y = vars_("a b c t x y", Tensor)
_sa, _sb, _so, _perm, _axes, _cfgv = vars_("sa sb so perm axes cfgv", Vec[i64])
_v = vars_("v", Vec[Tensor])
(_v,) = _v
_n, _m, _lc, _rc, _ax, _s0, _s1, _cfg, _k, _o1, _o2, _lv = vars_("n m lc rc ax s0 s1 cfg k o1 o2 lv", i64)
_name, _d = vars_("name d", String)
_f, _g = vars_("f g", f64)

_ELEMENTWISE = (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div)
_TYPED_BINARY = ("max", "min", "pow")  # binary ops rules create (their dtype is the operands')
FLOATS = ("float32", "bfloat16", "float16", "float64")
# iota types that hold any index of an array jax can make (jnp.einsum("ii->i") counts in uint32:
# a mask of 2^32 rows would not fit in memory)
INDEX_DTYPES = ("int32", "int64", "uint32", "uint64")


def _set(t, s, d):
    return (set_(shape(t)).to(s), set_(dtype(t)).to(d))


_elementwise = relation("elementwise", Tensor, Tensor, Tensor)  # t = f(a, b), f elementwise


def _broadcast_shape_rules():
    """Shape of an elementwise op: rank-0 operands broadcast; equal ranks take the larger of each
    axis (jax 0.12 broadcasts size-1 axes implicitly)."""
    ew = _elementwise(_t, _a, _b)
    yield rule(ew, eq(_sa).to(shape(_a)), eq(_sb).to(shape(_b)), eq(_sb).to(_sa), eq(_d).to(dtype(_a))).then(
        *_set(_t, _sa, _d)
    )
    yield rule(
        ew, eq(_sa).to(shape(_a)), eq(_sb).to(shape(_b)), eq(_sb.length()).to(i64(0)), eq(_d).to(dtype(_a))
    ).then(*_set(_t, _sa, _d))
    yield rule(
        ew,
        eq(_sa).to(shape(_a)),
        eq(_sb).to(shape(_b)),
        eq(_sa.length()).to(i64(0)),
        _sb.length() > 0,
        eq(_d).to(dtype(_b)),
    ).then(*_set(_t, _sb, _d))
    for r in range(1, 5):
        out = Vec[i64](*[_sa[i].max(_sb[i]) for i in range(r)])
        yield rule(
            ew,
            eq(_sa).to(shape(_a)),
            eq(_sb).to(shape(_b)),
            ne(_sa).to(_sb),
            eq(_sa.length()).to(i64(r)),
            eq(_sb.length()).to(i64(r)),
            eq(_so).to(out),
            eq(_d).to(dtype(_a)),
        ).then(*_set(_t, _so, _d))


@analysis.register
def _shape_rules():
    for ctor in _ELEMENTWISE:
        yield rule(eq(_t).to(ctor(_a, _b))).then(_elementwise(_t, _a, _b))
    for name in _TYPED_BINARY:
        yield rule(eq(_t).to(Tensor.binary(name, _a, _b))).then(_elementwise(_t, _a, _b))
    yield from _broadcast_shape_rules()
    same = (
        Tensor.neg(_a),
        Tensor.unary(_name, _a),
        Tensor.integer_pow(_a, _k),
    )
    for term in same:
        yield rule(eq(_t).to(term), eq(_sa).to(shape(_a)), eq(_d).to(dtype(_a))).then(*_set(_t, _sa, _d))
    # iotas, comparisons and where(pred, b, a) of operands of one shape, as rules build them
    # (reduce.platform_diagonal)
    yield rule(eq(_t).to(Tensor.iota(_d, _sa, _n))).then(*_set(_t, _sa, _d))
    yield rule(eq(_t).to(Tensor.binary("eq", _a, _b)), eq(_sa).to(shape(_a)), eq(_sa).to(shape(_b))).then(
        *_set(_t, _sa, String("bool"))
    )
    yield rule(
        eq(_t).to(Tensor.select_n(_c, _b, _a)),
        eq(_sa).to(shape(_a)),
        eq(_sa).to(shape(_b)),
        eq(_sa).to(shape(_c)),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _sa, _d))
    yield rule(eq(_t).to(Tensor.scalar(_n, _m, _d))).then(
        *_set(_t, Vec[i64].empty(), _d), set_(fill(_t)).to(f64.from_i64(_n) / f64.from_i64(_m))
    )
    # dot: batch + a free + b free. The dtype is the configuration's preferred element type, or
    # a's dtype where it has none ("", as for DEFAULT_CFG).
    for nb in range(3):
        b_free = _sb.remove(_rc)
        for _ in range(nb):
            b_free = b_free.remove(0)
        out = _sa.remove(_lc).append(b_free)
        yield rule(
            eq(_t).to(Tensor.dot(_a, _b, nb, _lc, _rc, _cfg)),
            eq(_sa).to(shape(_a)),
            eq(_sb).to(shape(_b)),
            eq(_so).to(out),
            eq(cfg_dtype(_cfg)).to(String("")),
            eq(_d).to(dtype(_a)),
        ).then(*_set(_t, _so, _d))
        yield rule(
            eq(_t).to(Tensor.dot(_a, _b, nb, _lc, _rc, _cfg)),
            eq(_sa).to(shape(_a)),
            eq(_sb).to(shape(_b)),
            eq(_so).to(out),
            eq(_d).to(cfg_dtype(_cfg)),
            ne(_d).to(String("")),
        ).then(*_set(_t, _so, _d))
    for r in (2, 3, 4):  # rules transpose the last two axes past two batch axes (reduce.diag_dot)
        out = Vec[i64](*[_sa[_perm[i]] for i in range(r)])
        yield rule(
            eq(_t).to(Tensor.transpose(_a, _perm)),
            eq(_sa).to(shape(_a)),
            eq(_perm.length()).to(i64(r)),
            eq(_so).to(out),
            eq(_d).to(dtype(_a)),
        ).then(*_set(_t, _so, _d))
    yield rule(
        eq(_t).to(Tensor.concat(_a, _b, _ax)),
        eq(_sa).to(shape(_a)),
        eq(_sb).to(shape(_b)),
        eq(_so).to(_sa.set(_ax, _sa[_ax] + _sb[_ax])),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    yield rule(
        eq(_t).to(Tensor.slice(_a, _ax, _s0, _s1)),
        eq(_sa).to(shape(_a)),
        eq(_so).to(_sa.set(_ax, _s1 - _s0)),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    yield rule(
        eq(_t).to(Tensor.broadcast_in_dim(_a, _sb, _perm)),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _sb, _d))
    yield rule(eq(_t).to(Tensor.reshape(_a, _sb)), eq(_d).to(dtype(_a))).then(*_set(_t, _sb, _d))
    yield rule(
        eq(_t).to(Tensor.squeeze(_a, _ax)),
        eq(_sa).to(shape(_a)),
        eq(_so).to(_sa.remove(_ax)),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    yield rule(eq(_t).to(Tensor.convert_element_type(_a, _d)), eq(_sa).to(shape(_a))).then(*_set(_t, _sa, _d))
    # stack (only stacks of fewer operands are created): a new axis of size len(args)
    yield rule(
        eq(_t).to(Tensor.stack(_v, 0)),
        eq(_a).to(_v[0]),
        eq(_sa).to(shape(_a)),
        eq(_so).to(Vec[i64](_v.length()).append(_sa)),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    yield rule(
        eq(_t).to(Tensor.stack(_v, _ax)),
        eq(_a).to(_v[0]),
        eq(_sa).to(shape(_a)),
        eq(_ax).to(_sa.length()),
        eq(_so).to(_sa.push(_v.length())),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    yield rule(
        eq(_t).to(Tensor.stack(_v, 1)),
        eq(_a).to(_v[0]),
        eq(_sa).to(shape(_a)),
        eq(_sa.length()).to(i64(2)),
        eq(_so).to(Vec[i64](_sa[0], _v.length(), _sa[1])),
        eq(_d).to(dtype(_a)),
    ).then(*_set(_t, _so, _d))
    # reductions over one or two axes (rules create no wider reductions)
    for ctor in (Tensor.sum, Tensor.reduce_max, Tensor.reduce_min):
        yield rule(
            eq(_t).to(ctor(_a, _axes)),
            eq(_sa).to(shape(_a)),
            eq(_axes.length()).to(i64(1)),
            eq(_so).to(_sa.remove(_axes[0])),
            eq(_d).to(dtype(_a)),
        ).then(*_set(_t, _so, _d))
        yield rule(
            eq(_t).to(ctor(_a, _axes)),
            eq(_sa).to(shape(_a)),
            eq(_axes.length()).to(i64(2)),
            eq(_so).to(_sa.remove(_axes[1]).remove(_axes[0])),
            eq(_d).to(dtype(_a)),
        ).then(*_set(_t, _so, _d))


def _shape_rank_below(a, full):
    return shape(a).length() < full.length()


@analysis.register
def _value_facts():
    # fill: broadcasts, reshapes and float conversions keep a constant fill
    yield rule(eq(_t).to(Tensor.broadcast_in_dim(_a, _sb, _perm)), eq(_f).to(fill(_a))).then(
        set_(fill(_t)).to(_f)
    )
    yield rule(eq(_t).to(Tensor.reshape(_a, _sb)), eq(_f).to(fill(_a))).then(set_(fill(_t)).to(_f))
    for fl in FLOATS:
        yield rule(
            eq(_t).to(Tensor.convert_element_type(_a, fl)), eq(_f).to(fill(_a)), eq(dtype(_a)).to(_d)
        ).then(set_(fill(_t)).to(_f))
    # the identity: (iota0 [+ 0]) == iota1 on a square shape, converted to a number type. The
    # iotas count in an integer type wide enough for any index (a bf16 or uint8 iota repeats
    # values past 256), and nothing broadcasts them (jax 0.12's elementwise ops spread size-1
    # axes: a (1, 1) iota plus a (5, 5) zero is all zeros)
    for index_dtype in INDEX_DTYPES:
        iota0 = Tensor.iota(index_dtype, _sa, 0)
        iota1 = Tensor.iota(index_dtype, _sa, 1)
        square = (eq(_sa.length()).to(i64(2)), eq(_sa[0]).to(_sa[1]), eq(shape(_t)).to(_sa))
        for lhs in (iota0, Tensor.add(iota0, _c), Tensor.add(_c, iota0)):
            extra = () if lhs is iota0 else (eq(fill(_c)).to(f64(0.0)), eq(shape(lhs)).to(_sa))
            for t in (Tensor.binary("eq", lhs, iota1), Tensor.binary("eq", iota1, lhs)):
                yield rule(eq(_t).to(t), *square, *extra).then(is_eye_mask(_t))
    yield rule(eq(_t).to(Tensor.convert_element_type(_a, _name)), is_eye_mask(_a)).then(is_eye(_t))
    # structured operands: cheap to multiply by
    yield rule(eq(_t).to(Tensor.broadcast_in_dim(_a, _sb, _perm)), _shape_rank_below(_a, _sb)).then(
        structured(_t)
    )
    yield rule(eq(_f).to(fill(_t))).then(structured(_t))
    yield rule(is_eye(_t)).then(structured(_t))
    yield rule(eq(_t).to(Tensor.mul(_a, _b)), structured(_a), structured(_b)).then(structured(_t))
    # a low-rank product (a LoRA update A@B): contracted over at most a quarter of either side
    for lc, rc in ((1, 0), (0, 0), (1, 1), (0, 1)):
        yield rule(
            eq(_t).to(Tensor.dot(_a, _b, 0, lc, rc, _cfg)),
            eq(_sa).to(shape(_a)),
            eq(_sb).to(shape(_b)),
            eq(_sa.length()).to(i64(2)),
            eq(_sb.length()).to(i64(2)),
            _sa[lc] * 4 <= _sa[1 - lc],
            _sa[lc] * 4 <= _sb[1 - rc],
        ).then(structured(_t))
    # positivity in real arithmetic (domain side conditions of exp/log/sqrt rules): real floating
    # point only (exp of a complex number is not positive, nor z·z nonnegative)
    real = float_dtype(dtype(_t))
    yield rule(eq(_t).to(Tensor.unary("exp", _a)), real).then(positive(_t))
    yield rule(eq(_f).to(fill(_t)), _f > f64(0.0)).then(positive(_t))
    yield rule(eq(_f).to(fill(_t)), _f >= f64(0.0)).then(nonneg(_t))
    yield rule(positive(_t)).then(nonneg(_t))
    for ctor in (Tensor.add, Tensor.mul, Tensor.div):
        yield rule(eq(_t).to(ctor(_a, _b)), positive(_a), positive(_b)).then(positive(_t))
    for ctor in (Tensor.add, Tensor.mul):
        yield rule(eq(_t).to(ctor(_a, _b)), nonneg(_a), nonneg(_b)).then(nonneg(_t))
    yield rule(eq(_t).to(Tensor.unary("sqrt", _a)), positive(_a)).then(positive(_t))
    yield rule(eq(_t).to(Tensor.mul(_a, _a)), real).then(nonneg(_t))
    yield rule(eq(_t).to(Tensor.integer_pow(_a, 2)), real).then(nonneg(_t))
    yield rule(eq(_t).to(Tensor.unary("abs", _a))).then(nonneg(_t))


@analysis.register
def _joins():
    yield rule(joined(_a, _b)).then(union(_a).with_(_b), delete(joined(_a, _b)))


@analysis.register
def _dot_groups():
    """Orders of the original dots that share an operand within one level: left-shared dot(a, B)
    (lfirst/lnext) and right-shared dot(B, a) (rfirst/rnext), B of rank nb+2 (one free axis),
    keyed by (a, form, level)."""
    for nb in range(3):
        for first, next_, shared_left in ((lfirst, lnext, True), (rfirst, rnext, False)):

            def dot(other: Tensor, nb: int = nb, shared_left: bool = shared_left) -> Tensor:
                pair = (_a, other) if shared_left else (other, _a)
                return Tensor.dot(*pair, nb, _lc, _rc, _cfg)

            one_free = (eq(shape(_b).length()).to(i64(nb + 2)),)
            yield rule(eq(_x).to(dot(_b)), *one_free, eq(_o1).to(order(_x)), eq(_lv).to(level(_x))).then(
                set_(first(_a, nb, _lc, _rc, _cfg, _lv)).to(_o1)
            )
            yield rule(
                eq(_x).to(dot(_b)),
                eq(_y).to(dot(_c)),
                eq(_lv).to(level(_x)),
                eq(_lv).to(level(_y)),
                eq(_o1).to(order(_x)),
                eq(_o2).to(order(_y)),
                _o1 < _o2,
                *one_free,
                eq(shape(_c).length()).to(i64(nb + 2)),
            ).then(set_(next_(_x)).to(_o2))


def new_egraph() -> EGraph:
    """A fresh e-graph for one program."""
    eg = EGraph()
    eg.register(*[float_dtype(String(name)) for name in FLOATS])
    return eg

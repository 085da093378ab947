"""Non-finite results stay where jax.jit has them in numerics="default" (issue 7, docs/numerics.md).

A rule exact only in real arithmetic (reassociation, factoring) can turn a NaN into ±Inf or back:
`inf·b + inf·c` with b > 0 > c is NaN, the factored `inf·(b + c)` is +Inf. Both are non-finite,
and the ops programs are mostly made of (sums, products, dots, layout) keep a non-finite value
non-finite. A *saturating* op does not: tanh, exp, max, 1/x or a comparison maps ±Inf to a finite
value and NaN to NaN (or to another finite value). So in "default" an inexact rule must not
rewrite a value that flows into a saturating op: the value's *cone*.

Two parts:
- In the e-graph, `cone(t) = 1` is derived by rules (children of saturating ops, then the
  children of every cone term); each inexact rule is guarded (`guard`) to fire only where
  `cone(root) = 0`, and marks the class it changes with `touched(root) = 1`.
- After saturation a changed class may still have joined the cone (a union with a cone class,
  or a stack wider than the rules follow): `unsafe_classes` finds touched classes in the cone of
  the final e-graph, computed in Python, and run.py then redoes the program with exact rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from egglog import Action, Fact, String, Vec, eq, function, i64, relation, rule, set_, union, var, vars_
from egglog import declarations as decl
from egglog.runtime import RuntimeExpr

from .. import compat
from .terms import Tensor, analysis, dtype

__all__ = [
    *("cone", "touched", "guard", "unsafe_classes", "saturating_children", "facts", "rules_of_marks"),
    *("STACK_RULES_UP_TO", "VALUE_IDENTITIES"),
]

# f(NaN), f(+Inf) and f(-Inf) are all non-finite: a NaN/Inf swap below stays non-finite above
TRANSPARENT_UNARY = frozenset(
    {
        *("log", "log1p", "sqrt", "cbrt", "abs", "floor", "ceil", "square"),
        *("sin", "cos", "tan", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos"),
    }
)
EXACT_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
# stacks have any number of operands; the e-graph rules follow this many (unsafe_classes: all)
STACK_RULES_UP_TO = 64


@function(merge=lambda old, new: old.max(new))
def cone(t: Tensor) -> i64:
    """1 where t's value flows into a saturating op (the analysis sets 0 for every other term)."""


@function(merge=lambda old, new: old | new)
def touched(t: Tensor) -> i64:
    """Where an inexact rule changed t's class: the bits of the rules that did (`rule_bit`)."""


_BITS: dict[str, int] = {}  # guarded rule name -> its bit in `touched` (one process's numbering)
_WIDTH = 62  # bits in use; past that many guarded rules, rules share a bit (a rerun leaves out both)


def rule_bit(name: str) -> int:
    """The bit of `touched` that rule `name` sets, numbered as rules are first guarded."""
    return _BITS.setdefault(name, len(_BITS) % _WIDTH)


def rules_of_marks(marks: Iterable[int]) -> set[str]:
    """The names of the guarded rules whose bits are set in any of `marks`."""
    union_ = 0
    for m in marks:
        union_ |= m
    return {name for name, bit in _BITS.items() if union_ >> bit & 1}


saturating_name = relation("saturating_name", String)  # unary/binary op names that saturate
exact_dtype = relation("exact_dtype", String)  # integer and bool dtypes (float -> int saturates)


def facts(unary: Iterable[str], binary: Iterable[str]) -> list[Any]:
    """The rows one e-graph needs: which op names saturate, which dtypes are not floats."""
    names = sorted({*(n for n in unary if n not in TRANSPARENT_UNARY), *binary})
    return [saturating_name(String(n)) for n in names] + [exact_dtype(String(d)) for d in EXACT_DTYPES]


def _positional(op: str, param: Any, operands: Sequence[Any]) -> Sequence[Any] | None:
    """The operands saturated by the ops whose answer depends on the position or a parameter
    (the same for e-nodes and jaxpr equations); None for every other op."""
    if op == "div":
        return operands[1:]  # x / ±inf = 0
    if op == "select_n":
        return operands[:1]
    if op == "integer_pow":
        return operands if param <= 0 else operands[:0]
    if op == "convert_element_type":
        return operands if str(param) in EXACT_DTYPES else operands[:0]
    return None


# ops whose result is their operand's value (a placement, a copy): a NaN/Inf swap below them is
# the same swap above, so they saturate nothing; their operands join a cone only where their
# result does (the encoder asks the program's cone, `saturating_children` the final e-graph's)
VALUE_IDENTITIES = frozenset({"sharding_constraint", "reshard", "copy", "copy_p", "stop_gradient"})


def saturating_children(op: str, attrs: tuple, children: tuple[str, ...]) -> tuple[str, ...]:
    """The operands of one e-node (graph.Node fields) that a saturating op reads. `op` and
    `opaque` count as saturating in all operands (their semantics are not modelled), but for the
    value identities (`VALUE_IDENTITIES`: their operands reach a cone through their own class)."""
    if op == "unary":
        return () if attrs[0] in TRANSPARENT_UNARY else children
    if op == "op" and attrs and attrs[0] in VALUE_IDENTITIES:
        return ()
    if op in ("binary", "reduce_max", "reduce_min", "op", "opaque"):
        return children
    got = _positional(op, attrs[0] if attrs else None, children)
    return () if got is None else tuple(got)


_t, _a, _b, _c = vars_("t a b c", Tensor)
_n, _d = vars_("n d", String)
_k, _l, _r, _cf = vars_("k l r cf", i64)
_s1, _s2 = vars_("s1 s2", Vec[i64])
(_v,) = vars_("v", Vec[Tensor])
_ONE, _ZERO = i64(1), i64(0)

# every constructor with tensor operands, as (term, operands)
_TERMS = (
    (Tensor.add(_a, _b), (_a, _b)),
    (Tensor.sub(_a, _b), (_a, _b)),
    (Tensor.mul(_a, _b), (_a, _b)),
    (Tensor.div(_a, _b), (_a, _b)),
    (Tensor.neg(_a), (_a,)),
    (Tensor.binary(_n, _a, _b), (_a, _b)),
    (Tensor.unary(_n, _a), (_a,)),
    (Tensor.integer_pow(_a, _k), (_a,)),
    (Tensor.dot(_a, _b, _k, _l, _r, _cf), (_a, _b)),
    (Tensor.transpose(_a, _s1), (_a,)),
    (Tensor.concat(_a, _b, _k), (_a, _b)),
    (Tensor.slice(_a, _k, _l, _r), (_a,)),
    (Tensor.slice_nd(_a, _s1, _s2), (_a,)),
    (Tensor.broadcast_in_dim(_a, _s1, _s2), (_a,)),
    (Tensor.reshape(_a, _s1), (_a,)),
    (Tensor.squeeze(_a, _k), (_a,)),
    (Tensor.convert_element_type(_a, _d), (_a,)),
    (Tensor.select_n(_a, _b, _c), (_a, _b, _c)),
    (Tensor.pad(_a, _b, _s1), (_a, _b)),
    (Tensor.sum(_a, _s1), (_a,)),
    (Tensor.reduce_max(_a, _s1), (_a,)),
    (Tensor.reduce_min(_a, _s1), (_a,)),
)


@analysis.register
def _cone_rules():
    yield rule(eq(_d).to(dtype(_t))).then(set_(cone(_t)).to(_ZERO))
    # saturating ops: their operands join the cone (the encoder does it for op/opaque operands)
    yield rule(eq(_t).to(Tensor.unary(_n, _a)), saturating_name(_n)).then(set_(cone(_a)).to(_ONE))
    yield rule(eq(_t).to(Tensor.binary(_n, _a, _b)), saturating_name(_n)).then(
        set_(cone(_a)).to(_ONE), set_(cone(_b)).to(_ONE)
    )
    yield rule(eq(_t).to(Tensor.div(_a, _b))).then(set_(cone(_b)).to(_ONE))
    yield rule(eq(_t).to(Tensor.integer_pow(_a, _k)), _k <= _ZERO).then(set_(cone(_a)).to(_ONE))
    yield rule(eq(_t).to(Tensor.convert_element_type(_a, _d)), exact_dtype(_d)).then(set_(cone(_a)).to(_ONE))
    yield rule(eq(_t).to(Tensor.select_n(_a, _b, _c))).then(set_(cone(_a)).to(_ONE))
    for red in (Tensor.reduce_max, Tensor.reduce_min):
        yield rule(eq(_t).to(red(_a, _s1))).then(set_(cone(_a)).to(_ONE))
    # the cone is closed under operands
    for term, operands in _TERMS:
        yield rule(eq(_t).to(term), eq(cone(_t)).to(_ONE)).then(*(set_(cone(x)).to(_ONE) for x in operands))
    for i in range(STACK_RULES_UP_TO):
        yield rule(eq(_t).to(Tensor.stack(_v, _k)), eq(cone(_t)).to(_ONE), _v.length() > i64(i)).then(
            set_(cone(_v[i])).to(_ONE)
        )


_ROOT = var("nonfinite_root", Tensor)


def _expr(decls: Any, tp: Any, e: Any) -> Any:
    return RuntimeExpr.__from_values__(decls, decl.TypedExprDecl(tp, e))


def _outside(t: Any) -> Any:
    """cone(t) is 0, written as a comparison: as `cone(t) = 0` egglog's planner began the
    query at the constant and scanned every class outside the cone (a deep linear network's
    SGD step: the guarded associativity rules searched 4x longer than under "fast", 7.2 s vs 1.9 s)."""
    return cone(t) < _ONE


def guard(rw: Any, name: str) -> Any:
    """The same rewrite, firing only outside the cone and marking the class it changes with
    rule `name`'s bit (so a rerun can leave out just the rules whose changes joined the cone)."""
    d, decls = rw.decl, rw.__egg_decls__
    mark = i64(1 << rule_bit(name))
    if isinstance(d, decl.RewriteDecl):
        lhs, rhs = _expr(decls, d.tp, d.lhs), _expr(decls, d.tp, d.rhs)
        conditions = [Fact(decls, f) for f in d.conditions]
        return rule(eq(_ROOT).to(lhs), *conditions, _outside(_ROOT)).then(
            union(_ROOT).with_(rhs), set_(touched(_ROOT)).to(mark)
        )
    if isinstance(d, decl.RuleDecl):
        roots = [_expr(decls, a.tp, a.lhs) for a in d.head if isinstance(a, decl.UnionDecl)]
        body = [Fact(decls, f) for f in d.body] + [_outside(x) for x in roots]
        head = [Action(decls, a) for a in d.head] + [set_(touched(x)).to(mark) for x in roots]
        return rule(*body, name=d.name, eval_mode=d.eval_mode).then(*head)
    raise TypeError(f"cannot guard a {type(d).__name__}")


def unsafe_classes(view: Any, roots: Iterable[str] = ()) -> set[str]:
    """Classes an inexact rule changed that flow into a saturating op in the final e-graph
    (`view.touched[c]` names the rules: rules_of_marks); `roots`: classes known to (a body's
    outputs that reach one outside)."""
    marked = set(view.touched)
    if not marked:
        return set()
    in_cone: set[str] = set()
    work = [ch for n in view.nodes.values() for ch in saturating_children(n.op, n.attrs, n.children)]
    work.extend(roots)
    while work:
        c = work.pop()
        if c in in_cone:
            continue
        in_cone.add(c)
        for nid in view.classes.get(c, ()):
            work.extend(view.nodes[nid].children)
    return marked & in_cone


# --- the cone on a jaxpr (control-flow bodies are rewritten before the outer e-graph exists) ----

# primitives whose operands a non-finite value passes through unchanged in kind (NaN stays
# non-finite, so a swap below stays a swap above); every other primitive saturates all operands
_TRANSPARENT_PRIMITIVES = TRANSPARENT_UNARY | {
    *("add", "add_any", "sub", "mul", "neg", "dot_general", "transpose", "concatenate", "pad"),
    *("slice", "dynamic_slice", "dynamic_update_slice", "reshape", "broadcast_in_dim", "squeeze"),
    *("expand_dims", "reduce_sum", "cumsum", "rev", "reduce_precision", "stack"),
    *VALUE_IDENTITIES,  # copy, copy_p, stop_gradient, sharding constraints
}


def _saturated_operands(eqn: Any) -> list[Any]:
    """The operands one jaxpr equation saturates (as saturating_children does for e-nodes)."""
    name, ins = eqn.primitive.name, list(eqn.invars)
    param = eqn.params.get("y") if name == "integer_pow" else eqn.params.get("new_dtype")
    got = _positional(name, param, ins)
    if got is not None:
        return list(got)
    return [] if name in _TRANSPARENT_PRIMITIVES else ins


def jaxpr_cone(jaxpr: Any, out_cone: Iterable[int], inlined: Any = None) -> set[Any]:
    """The variables of `jaxpr` (and of the call bodies `inlined(eqn)` returns, recursively) whose
    values flow into a saturating op, given which outputs (`out_cone`, by index) do outside."""
    cone: set[Any] = set()
    outs = jaxpr.outvars
    cone.update(outs[i] for i in out_cone if not compat.is_literal(outs[i]))
    for eqn in reversed(jaxpr.eqns):
        body = inlined(eqn) if inlined is not None else None
        if body is not None:
            inner_out = [i for i, v in enumerate(eqn.outvars) if v in cone]
            inner = jaxpr_cone(body.jaxpr, inner_out, inlined)
            cone |= inner
            reached = [v for v, b in zip(eqn.invars, body.jaxpr.invars, strict=True) if b in inner]
        elif any(v in cone for v in eqn.outvars):
            reached = list(eqn.invars)
        else:
            reached = _saturated_operands(eqn)
        cone.update(v for v in reached if not compat.is_literal(v))
    return cone

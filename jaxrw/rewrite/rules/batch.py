"""Batching: independent dots of equal shapes become one batched dot on stacked operands, and back.

`batch.stack_dots` batches the equal-shape groups the encoder records (`Program.dots`: original
unbatched dots of one level whose operands have the same shapes, such as per-head projections of
separate inputs or small experts), each group whole, before saturation (`Rule.seed`). Where the
program stacks the results of other batched dots, `batch.expand_dot` and `batch.concat_batched`
reach one batched dot. The way back composes `reduce.slice_dot` (a batch slice of a dot is a
dot of slices) with `batch.squeeze_batch` and `batch.squeeze_expand`.

All rules move data only: exact in floating point and in integer arithmetic.
"""

from __future__ import annotations

from typing import Any

from egglog import Vec, eq, i64, rewrite, rule, union, vars_

from ..egg_source import EggSource, Sym, ivec
from ..terms import Tensor, joined, shape
from . import Rule, register_rule
from ._util import RING, V, rand, rank, same_dtype, sizes

A, B, X, Y = V.A, V.B, V.X, V.Y
x = V.x
l, r, c, n = V.l, V.r, V.c, V.n
sa, sb, sc, so = V.sa, V.sb, V.sc, V.so
dot, concat, slice_, squeeze = Tensor.dot, Tensor.concat, Tensor.slice, Tensor.squeeze


def _reg(name, identity, build, conditions, example, late=False):
    register_rule(Rule(f"batch.{name}", "batch", identity, True, build, conditions, example, RING, late=late))


def _lead(t, s, rk):
    """t (of shape s and rank rk) with a leading unit axis."""
    return Tensor.broadcast_in_dim(t, Vec[i64](i64(1)).append(s), Vec[i64](*[i64(i + 1) for i in range(rk)]))


# --- independent dots -> one batched dot ---------------------------------------------------------


# the most dots one stack joins; a larger group is stacked in parts of this many. 2,000 products
# of 32x32 matrices stacked whole took 3.5 s to write and 3.5 s more to analyse, and passed the
# node limit before any rule ran (a new user's program); 256 per batched dot is past where
# batching small products stops paying on a GPU anyway (one kernel's grid fills the device)
MAX_STACK = 256


def _seed_stacked_dots(program: Any) -> int:
    """A1@B1, A2@B2, ..., An@Bn (a group: unbatched dots of one level, equal operand shapes,
    form and dtype) -> the slices of [A1;..;An] @batch [B1;..;Bn], written for the whole group at
    once. As an egglog rule that grew the stack one dot per iteration, 32 experts took 36
    iterations (the default limit is 12), and every partial stack in between fed the slice rules
    (9,400 e-nodes). Dots that share an operand go to different stacks (`_stacks`; the
    shared-operand merges of rules/merge.py join those without copies), and the whole group is
    one more stack. Returns how many dots were joined (a dot in two stacks counts twice)."""
    groups: dict[tuple, list[Any]] = {}
    for d in program.dots:
        groups.setdefault((d.sa, d.sb, d.lc, d.rc, d.cfg, d.level, d.dtype), []).append(d)
    src = EggSource(program.egraph)
    n_joined = 0
    for members in groups.values():
        stacks = [s[i : i + MAX_STACK] for s in _stacks(members) for i in range(0, len(s), MAX_STACK)]
        # also all at once, shared operands repeated (the q, k and v projections of four
        # decoders as one stack of twelve), where some stack holds two dots at least
        whole = (
            [members] if len(stacks) > 1 and max(map(len, stacks)) > 1 and len(members) <= MAX_STACK else []
        )
        for stack in stacks + whole:
            if len(stack) < 2:
                continue
            first = stack[0]
            left, right = _lead_text(src, first.a, first.sa), _lead_text(src, first.b, first.sb)
            for d in stack[1:]:
                left = src.call(concat, left, _lead_text(src, d.a, d.sa), 0)
                right = src.call(concat, right, _lead_text(src, d.b, d.sb), 0)
            stacked = src.call(dot, left, right, 1, first.lc + 1, first.rc + 1, first.cfg)
            big = src.let(f"$jaxrw_stack{n_joined}", stacked)
            for i, d in enumerate(stack):
                src.add(src.call(joined, d.term, src.call(squeeze, src.call(slice_, big, 0, i, i + 1), 0)))
            _join_rows_and_stacks(program, src, stack, left, right, big)
            n_joined += len(stack)
    src.flush()
    if program.symbols:  # the constructors written here can make more rules match (reach.py)
        program.symbols = program.symbols | frozenset(src.refs)
    return n_joined


def _join_rows_and_stacks(
    program: Any, src: EggSource, stack: list[Any], left: Sym, right: Sym, big: Sym
) -> None:
    """Where the stacked operands are consecutive rows x[i], ..., x[i+n-1] of one x, they are
    x[i:i+n] (x itself when whole); where the program stacks the dots' results in order, that
    stack is (a slice of) the batched dot. Either would otherwise come back one concatenation
    link per iteration, and meanwhile be priced as copies (experts' inputs and outputs)."""
    for side, operands in ((left, [d.a for d in stack]), (right, [d.b for d in stack])):
        rows = [program.rows.get(t) for t in operands]
        if all(rows) and len({arr for arr, _ in rows}) == 1:
            arr, i0 = rows[0]
            if [i for _, i in rows] == list(range(i0, i0 + len(rows))):
                src.add(src.call(joined, side, src.call(slice_, arr, 0, i0, i0 + len(rows))))
    terms = [d.term for d in stack]
    for t, operands in program.stacks:
        j = terms.index(operands[0]) if operands and operands[0] in terms else -1
        if j >= 0 and list(operands) == terms[j : j + len(operands)]:
            whole = len(operands) == len(terms)
            src.add(src.call(joined, t, big if whole else src.call(slice_, big, 0, j, j + len(operands))))


def _stacks(members: list[Any]) -> list[list[Any]]:
    """A group's dots split into stacks whose members share no operand, first fit in program
    order: the q, k and v projections of four decoders become a stack of the four q's, one of the
    k's and one of the v's."""
    stacks: list[tuple[list[Any], set[str], set[str]]] = []
    for d in members:
        for members_, seen_a, seen_b in stacks:
            if d.a not in seen_a and d.b not in seen_b:
                members_.append(d)
                seen_a.add(d.a)
                seen_b.add(d.b)
                break
        else:
            stacks.append(([d], {d.a}, {d.b}))
    return [m for m, _, _ in stacks]


def _lead_text(src: EggSource, t: Sym, s: tuple[int, ...]) -> Sym:
    """`_lead` as egglog text: t of shape s with a leading unit axis."""
    return src.call(Tensor.broadcast_in_dim, t, ivec((1, *s)), ivec(range(1, len(s) + 1)))


def _experts_example(rng, dt):
    m_, k_, n_ = sizes(rng, 3, 2, 17)
    xs = [rand(rng, (m_, k_), dt) for _ in range(3)]
    ws = [rand(rng, (k_, n_), dt) for _ in range(3)]
    return (lambda *a: (a[0] @ a[3], (a[1] @ a[4]) * 2, a[2] @ a[5] + 1)), (*xs, *ws)


register_rule(
    Rule(
        "batch.stack_dots",
        "batch",
        "A1@B1, A2@B2, ... -> slices of [A1;A2;..] @batch [B1;B2;..]",
        True,
        list,  # no egglog rewrites: the whole group is written before saturation
        "unbatched dots of one level with equal operand shapes (rank <= 2), same cfg, one dtype",
        _experts_example,
        RING,
        seed=_seed_stacked_dots,
    )
)


# --- stacked results -----------------------------------------------------------------------------


def _expand_dot():
    # expand0(A@B) -> expand0(A) @batch expand0(B)   (a leading unit axis becomes a batch axis)
    out = []
    for ra in (1, 2):
        for rb in (1, 2):
            prod = dot(A, B, 0, l, r, c)
            conds = (eq(sa).to(shape(A)), eq(sb).to(shape(B)), rank(A, ra), rank(B, rb), eq(sc).to(shape(x)))
            dims = Vec[i64](*[i64(i + 1) for i in range(ra + rb - 2)])
            lhs = Tensor.broadcast_in_dim(prod, so, dims)
            out.append(
                rule(
                    eq(x).to(lhs),
                    *conds,
                    eq(so).to(Vec[i64](i64(1)).append(shape(prod))),
                    *same_dtype(A, B, prod),
                ).then(union(x).with_(dot(_lead(A, sa, ra), _lead(B, sb, rb), 1, l + 1, r + 1, c)))
            )
    return out


def _concat_batched():
    # [A1 @b B1 ; A2 @b B2] -> [A1;A2] @b [B1;B2]   (along the leading batch axis). Two links at a
    # time: windows of 3 and 4 links over a stack of 32 experts' products grew the e-graph from
    # 5,400 to 9,200 e-nodes in 8 iterations, past what the DAG-aware extractor takes
    # (extract.py); groups of original dots are batched whole by `batch.stack_dots` instead
    a0, a1, b0, b1 = vars_("a0 a1 b0 b1", Tensor)
    lhs = concat(dot(a0, b0, V.nb, l, r, c), dot(a1, b1, V.nb, l, r, c), 0)
    conds = [
        V.nb >= 1,
        eq(shape(a1).remove(0)).to(shape(a0).remove(0)),
        eq(shape(b1).remove(0)).to(shape(b0).remove(0)),
        *same_dtype(a0, a1, b0, b1, dot(a0, b0, V.nb, l, r, c), dot(a1, b1, V.nb, l, r, c)),
    ]
    return [rewrite(lhs).to(dot(concat(a0, a1, 0), concat(b0, b1, 0), V.nb, l, r, c), *conds)]


def _stacked_example(rng, dt):
    import jax.numpy as jnp

    m_, k_, n_ = sizes(rng, 3, 2, 17)
    xs = [rand(rng, (m_, k_), dt) for _ in range(3)]
    ws = [rand(rng, (k_, n_), dt) for _ in range(3)]
    return (lambda *a: jnp.concatenate([(a[i] @ a[3 + i])[None] for i in range(3)])), (*xs, *ws)


def _concat_batched_example(rng, dt):
    import jax.numpy as jnp

    b1, b2, m_, k_ = sizes(rng, 4, 2, 9)
    return (lambda a1, a2, w1, w2: jnp.concatenate([a1 @ w1, a2 @ w2], 0)), (
        rand(rng, (b1, m_, k_), dt),
        rand(rng, (b2, m_, k_), dt),
        rand(rng, (b1, k_, m_), dt),
        rand(rng, (b2, k_, m_), dt),
    )


_reg(
    "expand_dot",
    "expand0(A@B) -> expand0(A) @batch expand0(B)",
    _expand_dot,
    "unbatched dot of operands of rank <= 2, one dtype",
    _stacked_example,
)
_reg(
    "concat_batched",
    "[A1@B1 ; A2@B2] (batch axis) -> [A1;A2] @ [B1;B2]",
    _concat_batched,
    "batched dots of one form, concatenated along the leading batch axis; one dtype",
    _concat_batched_example,
)


# --- row blocks of one array -------------------------------------------------------------------


def _index_rows():
    # X[t] @ B (X of shape [n, m, k]) -> rows t*m:(t+1)*m of reshape(X, [n*m, k]) @ B: every index
    # of X multiplied by the same B is a row block of one product, which the extractor's sharing
    # pass computes once (as the hand-written NasRNN multiplies all steps' inputs in one GEMM)
    A = squeeze(slice_(X, 0, V.i, V.j), 0)
    flat = Tensor.reshape(X, Vec[i64](n * V.m, V.k))
    conds = (
        eq(V.so).to(shape(X)),
        eq(V.so.length()).to(i64(3)),
        eq(n).to(V.so[0]),
        eq(V.m).to(V.so[1]),
        eq(V.k).to(V.so[2]),
        eq(V.j).to(V.i + 1),
        rank(B, 2),
        *same_dtype(X, B),
    )
    return [
        rewrite(dot(A, B, 0, 1, r, c)).to(slice_(dot(flat, B, 0, 1, r, c), 0, V.i * V.m, V.j * V.m), *conds)
    ]


def _index_rows_example(rng, dt):
    n_, m_, k_, o_ = sizes(rng, 4, 1, 17)
    n_ = max(n_, 3)

    def f(xs, w, v):
        return xs[0] @ w, (xs[2] @ w) * 2, xs[1] @ v.T + 1

    return f, (rand(rng, (n_, m_, k_), dt), rand(rng, (k_, o_), dt), rand(rng, (o_, k_), dt))


_reg(
    "index_rows",
    "X[t] @ B -> (reshape(X, [n*m, k]) @ B)[t*m:(t+1)*m]",
    _index_rows,
    "X of rank 3 indexed on its first axis, B of rank 2, A's contracting axis last; one dtype",
    _index_rows_example,
    late=True,  # its row blocks, fed back to slice_dot and the merges, grow the e-graph 15x on NasRNN
)


# --- the way back --------------------------------------------------------------------------------


def _squeeze_batch():
    # squeeze0(A @b B) with one batch -> squeeze0(A) @ squeeze0(B)
    prod = dot(A, B, 1, l, r, c)
    conds = (eq(shape(A)[0]).to(i64(1)), *same_dtype(A, B, prod))
    return [rewrite(squeeze(prod, 0)).to(dot(squeeze(A, 0), squeeze(B, 0), 0, l - 1, r - 1, c), *conds)]


def _squeeze_expand():
    # squeeze(expand(a, ax), ax) -> a   (a broadcast that only inserts that unit axis)
    out = []
    for rk in range(4):
        for ax in range(rk + 1):
            dims = Vec[i64](*[i64(i if i < ax else i + 1) for i in range(rk)])
            conds = (eq(sa).to(shape(A)), rank(A, rk), eq(so.length()).to(i64(rk + 1)), eq(so[ax]).to(i64(1)))
            out.append(
                rule(
                    eq(x).to(squeeze(Tensor.broadcast_in_dim(A, so, dims), ax)),
                    *conds,
                    eq(sa).to(so.remove(ax)),
                ).then(union(x).with_(A))
            )
    return out


def _expand_squeeze():
    # expand(squeeze(Y, ax), ax) -> Y   (the unit axis put back where it was)
    out = []
    for rk in range(4):
        for ax in range(rk + 1):
            dims = Vec[i64](*[i64(i if i < ax else i + 1) for i in range(rk)])
            conds = (eq(sa).to(shape(Y)), eq(sa.length()).to(i64(rk + 1)))
            lhs = Tensor.broadcast_in_dim(squeeze(Y, ax), sa, dims)
            out.append(rule(eq(x).to(lhs), *conds).then(union(x).with_(Y)))
    return out


def _expand_squeeze_example(rng, dt):
    import jax.numpy as jnp

    b_, m_ = sizes(rng, 2, 2, 17)
    return (lambda y: (jnp.expand_dims(y[1], 0) * 2, y[:, 0][:, None] + 1)), (rand(rng, (b_, m_), dt),)


def _squeeze_batch_example(rng, dt):
    from jax import lax

    m_, k_, n_ = sizes(rng, 3, 2, 17)

    def f(a, b):
        return lax.squeeze(lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), (0,))

    return f, (rand(rng, (1, m_, k_), dt), rand(rng, (1, k_, n_), dt))


def _squeeze_expand_example(rng, dt):
    from jax import lax

    m_, n_ = sizes(rng, 2, 2, 17)
    return (lambda a: (lax.squeeze(a[None], (0,)) * 2, lax.squeeze(a[:, None], (1,)))), (
        rand(rng, (m_, n_), dt),
    )


_reg(
    "squeeze_batch",
    "squeeze0(A @batch B) -> squeeze0(A) @ squeeze0(B)",
    _squeeze_batch,
    "one batch axis of size 1; one dtype",
    _squeeze_batch_example,
)
_reg(
    "expand_squeeze",
    "expand(squeeze(Y, ax), ax) -> Y",
    _expand_squeeze,
    "rank <= 4",
    _expand_squeeze_example,
)
_reg(
    "squeeze_expand",
    "squeeze(expand(a, ax), ax) -> a",
    _squeeze_expand,
    "the broadcast only inserts the squeezed unit axis (rank <= 3)",
    _squeeze_expand_example,
)

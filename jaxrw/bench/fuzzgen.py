"""Random well-typed JAX programs for differential fuzzing of `optimize` (tests and `make fuzz`).

A program is plain JSON data (a *spec*), so a failing case can be saved and replayed as a
regression test: nothing runs but the interpreter in `jaxrw.bench.fuzzprog`:

    {"values": [[op, [operand ids], {params}], ...], "outputs": [ids], "options": {...}}

Value `i` is the result of entry `i`; `["in", [], {"shape", "dtype"}]` entries are the program's
inputs in order, `["const", ...]` closed-over arrays. `programs()` is a hypothesis strategy that
builds specs step by step from a pool of typed values, so every program traces: chains, shared
subexpressions, broadcasts, slices, concatenations, reductions, transposes, dots of every matmul
form, and opaque primitives (sort, cumsum, conv, scan, while, cond, custom_jvp, top_k, gather).

Each value carries an *exact* flag: it is computed from inputs only by operations no valid
rewrite may change (data movement, neg/abs/max/min, selects, integer arithmetic). Comparisons,
argmax and float-to-int conversions read exact values only, so a legal reassociation elsewhere
can never flip a discrete result and produce a false alarm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from .fuzzprog import kind

__all__ = ["programs", "FLOATS"]

FLOATS = ("float32", "bfloat16", "float16")
SIZES = (1, 2, 3, 4, 5, 8, 0)  # shrinks toward 1; size 0 (empty arrays) is rare
LITERALS = (2.0, 0.5, -1.5, 1.0, 0.0, 3.0)
UNARY_F = (
    "tanh",
    "neg",
    "abs",
    "sin",
    "cos",
    "logistic",
    "exp_t",
    "sqrt_abs",
    "log1p_abs",
    "relu",
    "square",
    "cube",
    "erf",
    "rsqrt1",
    "gelu",
)
UNARY_EXACT = frozenset({"neg", "abs", "relu"})
BINARY_F = ("add", "mul", "sub", "max", "min", "div_safe")
BINARY_I = ("add", "mul", "sub", "max", "min", "idiv", "irem")
BINARY_B = ("and", "or", "xor")
COMPARE = ("lt", "gt", "le", "ge", "eq", "ne")
OPAQUE = (
    "cumsum",
    "sort",
    "flip",
    "pad",
    "clip",
    "cummax",
    "top_k",
    "gather",
    "dyn_slice",
    "dyn_update",
    "conv",
    "scan",
    "while",
    "cond",
    "jitcall",
    "softmax",
    "argmax",
)
IDIOMS = ("trace", "rowsum", "shared", "scaled", "transposed", "double", "diag", "eye", "stack")
OPAQUE_EXACT = frozenset(
    {"sort", "flip", "pad", "clip", "cummax", "top_k", "gather", "dyn_slice", "dyn_update", "argmax"}
)


# --- generation ---------------------------------------------------------------------------------


class _Gen:
    """The pool of typed values a program is built from; one method per kind of step."""

    def __init__(self, draw: Callable, consts: bool):
        self.draw, self.consts = draw, consts
        self.values: list[list] = []
        self.types: list[tuple[tuple[int, ...], str, bool]] = []  # shape, dtype, exact

    # helpers
    def d(self, strategy: Any) -> Any:
        return self.draw(strategy)

    def add(self, op: str, args: list[int], params: dict, shape: tuple, dtype: str, exact: bool) -> int:
        self.values.append([op, list(args), params])
        self.types.append((tuple(int(s) for s in shape), dtype, exact))
        return len(self.values) - 1

    def dim(self) -> int:
        """A dimension size; now and then 0 (an empty array)."""
        return 0 if self.d(st.integers(0, 40)) == 0 else self.d(st.sampled_from(SIZES[:-1]))

    def shape(self, lo: int = 0, hi: int = 3) -> tuple[int, ...]:
        return tuple(self.dim() for _ in range(self.d(st.integers(lo, hi))))

    def leaf(self, shape: tuple, dtype: str) -> int:
        """A fresh input, or (sometimes) a closed-over constant, of this type."""
        if self.consts and kind(dtype) == "f" and self.d(st.integers(0, 3)) == 0:
            seed = self.d(st.integers(0, 2**16))
            return self.add(
                "const", [], {"shape": list(shape), "dtype": dtype, "seed": seed}, shape, dtype, True
            )
        return self.add("in", [], {"shape": list(shape), "dtype": dtype}, shape, dtype, True)

    def pick(self, pred: Callable[[tuple], bool] = lambda t: True) -> int | None:
        cands = [i for i, t in enumerate(self.types) if pred(t)]
        if not cands:
            return None
        return cands[-1 - self.d(st.integers(0, len(cands) - 1))]

    def operand(self, shape: tuple, dtype: str, exact: bool = False) -> int:
        """An existing value of exactly this type, or a new leaf."""
        i = None
        if self.d(st.booleans()):
            i = self.pick(lambda t: t[0] == shape and t[1] == dtype and (t[2] or not exact))
        return self.leaf(shape, dtype) if i is None else i

    def cast(self, i: int, dtype: str) -> int:
        shape, dt, exact = self.types[i]
        if dt == dtype:
            return i
        return self.add("cvt", [i], {"to": dtype}, shape, dtype, exact)

    # steps: each returns the new value's id, or None when it does not apply to operand x
    def unary(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        k = kind(dt)
        names = {"f": UNARY_F, "i": ("neg", "abs", "square"), "b": ("not",)}[k]
        f = self.d(st.sampled_from(names))
        keeps = k != "f" or f in UNARY_EXACT
        return self.add("un", [x], {"f": f}, shape, dt, exact and keeps)

    def binary(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        k = kind(dt)
        f = self.d(st.sampled_from({"f": BINARY_F, "i": BINARY_I, "b": BINARY_B}[k]))
        how = self.d(st.sampled_from(("value", "literal", "swap")))
        if how == "literal" and k != "b":
            lit = self.d(st.sampled_from(LITERALS))
            lit = int(lit) if k == "i" else lit
            keeps = k == "i" or f in ("max", "min")
            return self.add(
                "bin", [x], {"f": f, "lit": lit, "swap": self.d(st.booleans())}, shape, dt, exact and keeps
            )
        # a broadcastable partner: drop leading axes and/or set axes to 1
        drop = self.d(st.integers(0, len(shape)))
        sub = tuple(1 if self.d(st.integers(0, 3)) == 0 else s for s in shape[drop:])
        y = self.operand(sub, dt)
        keeps = k != "f" or f in ("max", "min")
        args = [y, x] if how == "swap" and sub == shape else [x, y]
        return self.add("bin", args, {"f": f}, shape, dt, exact and self.types[y][2] and keeps)

    def dot(self, x: int) -> int | None:
        shape, dt, _ = self.types[x]
        if kind(dt) == "b" or not shape:
            return None
        form = self.d(st.sampled_from(("matmul", "general")))
        pet = None
        if dt in ("bfloat16", "float16") and self.d(st.integers(0, 3)) == 0:
            pet = "float32"
        prec = "highest" if self.d(st.integers(0, 7)) == 0 else None
        out_dt = pet or dt
        k = shape[-1]
        if form == "matmul":
            which = self.d(st.sampled_from(("mat", "vec", "batch")))
            if which == "vec" or len(shape) == 1 and which == "batch":
                b_shape = (k,)
            elif which == "batch" and len(shape) >= 3:
                b_shape = (*shape[:-2], k, self.d(st.sampled_from(SIZES[:-1])))
            else:
                b_shape = (k, self.d(st.sampled_from(SIZES[:-1])))
            y = self.operand(b_shape, dt)
            out = jax.eval_shape(
                jnp.matmul, jax.ShapeDtypeStruct(shape, np.float32), jax.ShapeDtypeStruct(b_shape, np.float32)
            ).shape
            return self.add("dot", [x, y], {"form": "matmul", "pet": pet, "prec": prec}, out, out_dt, False)
        # dot_general: one or two contracting axes anywhere, optionally one batch axis
        r = len(shape)
        nbatch = 1 if r >= 2 and self.d(st.integers(0, 2)) == 0 else 0
        free = list(range(nbatch, r))
        nc = 2 if len(free) >= 2 and self.d(st.integers(0, 3)) == 0 else 1
        lc = sorted(self.d(st.permutations(free))[:nc])
        rank_b = nbatch + nc + self.d(st.integers(0, 1))
        slots = list(range(nbatch, rank_b))
        rc = list(self.d(st.permutations(slots))[:nc])
        b_shape = [0] * rank_b
        for i in range(nbatch):
            b_shape[i] = shape[i]
        for a, b in zip(lc, rc, strict=True):
            b_shape[b] = shape[a]
        for i in range(rank_b):
            if i >= nbatch and i not in rc:
                b_shape[i] = self.d(st.sampled_from(SIZES[:-1]))
        y = self.operand(tuple(b_shape), dt)
        lb = list(range(nbatch))
        out = [shape[i] for i in lb] + [shape[i] for i in range(r) if i not in lc and i not in lb]
        out += [b_shape[i] for i in range(rank_b) if i not in rc and i not in lb]
        p = {"form": "general", "lc": lc, "rc": rc, "lb": lb, "rb": lb, "pet": pet, "prec": prec}
        return self.add("dot", [x, y], p, tuple(out), out_dt, False)

    def chain(self, x: int) -> int | None:
        """x @ W1 @ W2 [@ v] and A@B ± A@C: the shapes the dot rules rewrite."""
        shape, dt, _ = self.types[x]
        if kind(dt) != "f" or not shape:
            return None
        if self.d(st.booleans()):
            cur = x
            for _ in range(self.d(st.integers(2, 3))):
                k = self.types[cur][0][-1]
                w = self.operand((k, self.d(st.sampled_from(SIZES[:-1]))), dt)
                out = (*self.types[cur][0][:-1], self.types[w][0][-1])
                cur = self.add("dot", [cur, w], {"form": "matmul", "pet": None, "prec": None}, out, dt, False)
            return cur
        n = self.d(st.sampled_from(SIZES[:-1]))
        b, c = (self.operand((shape[-1], n), dt) for _ in range(2))
        mm = {"form": "matmul", "pet": None, "prec": None}
        out = (*shape[:-1], n)
        if self.d(st.booleans()):  # A@B ± A@C
            ab = self.add("dot", [x, b], mm, out, dt, False)
            ac = self.add("dot", [x, c], mm, out, dt, False)
        else:  # A@C ± B@C with a second left operand of x's shape
            other = self.operand(shape, dt)
            ab = self.add("dot", [x, b], mm, out, dt, False)
            ac = self.add("dot", [other, b], mm, out, dt, False)
        return self.add("bin", [ab, ac], {"f": self.d(st.sampled_from(("add", "sub")))}, out, dt, False)

    def idiom(self, x: int) -> int | None:
        """Idioms the other rule families rewrite: traces and row sums of products, products that
        share an operand, scaled and transposed products, X + X, diag(v) @ A, I @ A, stacks."""
        shape, dt, _ = self.types[x]
        if kind(dt) != "f" or len(shape) != 2 or 0 in shape:
            return None
        m, k = shape
        mm = {"form": "matmul", "pet": None, "prec": None}
        which = self.d(st.sampled_from(IDIOMS))
        if which in ("trace", "rowsum"):
            n = m if which == "trace" else self.d(st.sampled_from(SIZES[:-1]))
            p = self.add("dot", [x, self.operand((k, n), dt)], mm, (m, n), dt, False)
            if which == "trace":
                return self.add("trace", [p], {}, (), dt, False)
            return self.add("red", [p], {"f": "sum", "axes": [0], "keep": False}, (n,), dt, False)
        if which == "shared":  # x @ W1 and x @ W2 side by side
            n = self.d(st.sampled_from(SIZES[:-1]))
            a = self.add("dot", [x, self.operand((k, n), dt)], mm, (m, n), dt, False)
            b = self.add("dot", [x, self.operand((k, n), dt)], mm, (m, n), dt, False)
            if self.d(st.booleans()):
                return self.add("cat", [a, b], {"axis": 1}, (m, 2 * n), dt, False)
            t = self.add("un", [a], {"f": "tanh"}, (m, n), dt, False)
            return self.add("bin", [t, b], {"f": "add"}, (m, n), dt, False)
        if which == "scaled":
            lit = self.d(st.sampled_from(LITERALS))
            s = self.add("bin", [x], {"f": "mul", "lit": lit, "swap": False}, shape, dt, False)
            return self.add("dot", [s, self.operand((k, k), dt)], mm, (m, k), dt, False)
        if which == "transposed":
            p = self.add("dot", [x, self.operand((k, m), dt)], mm, (m, m), dt, False)
            return self.add("tr", [p], {"perm": [1, 0]}, (m, m), dt, False)
        if which == "double":
            p = self.add("dot", [x, self.operand((k, k), dt)], mm, (m, k), dt, False)
            return self.add("bin", [p, p], {"f": "add"}, (m, k), dt, False)
        if which == "diag":
            v = self.operand((m,), dt)
            d = self.add("diagmat", [v], {}, (m, m), dt, False)
            return self.add("dot", [d, x], mm, (m, k), dt, False)
        if which == "eye":
            e = self.add("eye", [], {"n": m, "dtype": dt}, (m, m), dt, True)
            return self.add("dot", [e, x], mm, (m, k), dt, False)
        w1, w2 = (self.operand((k, k), dt) for _ in range(2))
        a = self.add("dot", [x, w1], mm, (m, k), dt, False)
        b = self.add("dot", [self.operand((m, k), dt), w2], mm, (m, k), dt, False)
        return self.add("stk", [a, b], {"axis": 0}, (2, m, k), dt, False)

    def transpose(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if len(shape) < 2:
            return None
        perm = list(self.d(st.permutations(range(len(shape)))))
        return self.add("tr", [x], {"perm": perm}, tuple(shape[p] for p in perm), dt, exact)

    def reshape(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        how = self.d(st.sampled_from(("flatten", "unit", "merge", "split")))
        new = list(shape)
        if how == "flatten":
            new = [math.prod(shape)]
        elif how == "unit":
            ax = self.d(st.integers(0, len(shape)))
            new.insert(ax, 1)
            if self.d(st.booleans()):
                return self.add("rs", [x], {"shape": new, "axis": ax}, tuple(new), dt, exact)
        elif how == "merge" and len(shape) >= 2:
            i = self.d(st.integers(0, len(shape) - 2))
            new[i : i + 2] = [shape[i] * shape[i + 1]]
        elif how == "split":
            splittable = [i for i, s in enumerate(shape) if s in (4, 8)]
            if not splittable:
                return None
            i = self.d(st.sampled_from(splittable))
            new[i : i + 1] = [2, shape[i] // 2]
        else:
            return None
        return self.add("rs", [x], {"shape": new}, tuple(new), dt, exact)

    def broadcast(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if len(shape) >= 4:
            return None
        lead = self.d(st.sampled_from(SIZES[:-1]))
        new = [lead] + [self.d(st.sampled_from(SIZES[1:-1])) if s == 1 else s for s in shape]
        return self.add("bc", [x], {"shape": new}, tuple(new), dt, exact)

    def squeeze(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        units = [i for i, s in enumerate(shape) if s == 1]
        if not units:
            return None
        ax = self.d(st.sampled_from(units))
        return self.add("sq", [x], {"axis": ax}, shape[:ax] + shape[ax + 1 :], dt, exact)

    def slice(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if not shape or 0 in shape:
            return None
        starts, stops, steps, out = [], [], [], []
        for i, s in enumerate(shape):
            cut = i == len(shape) - 1 or self.d(st.booleans())
            a = self.d(st.integers(0, s - 1)) if cut else 0
            b = self.d(st.integers(a + 1, s)) if cut else s
            step = 2 if cut and b - a >= 3 and self.d(st.integers(0, 3)) == 0 else 1
            starts.append(a), stops.append(b), steps.append(step)
            out.append(-(-(b - a) // step))
        return self.add("sl", [x], {"start": starts, "stop": stops, "step": steps}, tuple(out), dt, exact)

    def concat(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if not shape:
            return None
        ax = self.d(st.integers(0, len(shape) - 1))
        parts = [x]
        for _ in range(self.d(st.integers(1, 2))):
            if self.d(st.booleans()):
                parts.append(x)  # a shared subexpression
            else:
                other = list(shape)
                other[ax] = self.d(st.sampled_from(SIZES[:-1]))
                parts.append(self.operand(tuple(other), dt))
        if self.d(st.booleans()):
            parts.reverse()
        out = list(shape)
        out[ax] = sum(self.types[p][0][ax] for p in parts)
        all_exact = all(self.types[p][2] for p in parts)
        if self.d(st.integers(0, 4)) == 0 and all(self.types[p][0] == shape for p in parts):
            return self.add(
                "stk", parts, {"axis": ax}, shape[:ax] + (len(parts),) + shape[ax:], dt, all_exact
            )
        return self.add("cat", parts, {"axis": ax}, tuple(out), dt, all_exact)

    def reduce(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if not shape:
            return None
        k = kind(dt)
        fs = {"f": ("sum", "max", "min", "mean"), "i": ("sum", "max", "min"), "b": ("any", "all")}[k]
        f = self.d(st.sampled_from(fs))
        if f in ("max", "min") and 0 in shape:
            return None
        axes = sorted(set(self.d(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape)))))
        keep = self.d(st.booleans())
        out = (
            tuple(1 if i in axes else s for i, s in enumerate(shape))
            if keep
            else tuple(s for i, s in enumerate(shape) if i not in axes)
        )
        keeps = f in ("max", "min", "any", "all") or k == "i"
        return self.add("red", [x], {"f": f, "axes": axes, "keep": keep}, out, dt, exact and keeps)

    def convert(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        k = kind(dt)
        options = [t for t in (*FLOATS, "int32") if t != dt]
        if k == "f" and not exact:
            options = [t for t in options if t != "int32"]
        to = self.d(st.sampled_from(options))
        return self.add("cvt", [x], {"to": to}, shape, to, exact)

    def compare(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        if not exact or kind(dt) == "b":
            return None
        f = self.d(st.sampled_from(COMPARE))
        if self.d(st.booleans()):
            lit = self.d(st.sampled_from(LITERALS))
            return self.add(
                "cmp", [x], {"f": f, "lit": int(lit) if kind(dt) == "i" else lit}, shape, "bool", True
            )
        y = self.operand(shape, dt, exact=True)
        return self.add("cmp", [x, y], {"f": f}, shape, "bool", True)

    def select(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        c = self.pick(lambda t: t[1] == "bool" and t[0] == shape)
        if c is None:
            c = self.leaf(shape, "bool")
        y = self.operand(shape, dt)
        return self.add("sel", [c, x, y], {}, shape, dt, exact and self.types[y][2])

    def opaque(self, x: int) -> int | None:
        shape, dt, exact = self.types[x]
        k = kind(dt)
        f = self.d(st.sampled_from(OPAQUE))
        keeps = exact and f in OPAQUE_EXACT
        p: dict[str, Any] = {"f": f}
        if k == "b" or (not shape and f not in ("clip", "cond", "jitcall", "while")) or 0 in shape:
            return None
        if k == "i" and f in ("conv", "softmax", "scan", "cummax"):
            return None
        if f in ("cumsum", "flip", "cummax", "argmax", "sort", "softmax"):
            p["axis"] = self.d(st.integers(0, len(shape) - 1))
            if f == "argmax":
                if not exact:
                    return None
                return self.add("opq", [x], p, shape[: p["axis"]] + shape[p["axis"] + 1 :], "int32", True)
            return self.add("opq", [x], p, shape, dt, keeps)
        if f == "pad":
            cfg = [
                [
                    self.d(st.integers(-1 if s > 1 else 0, 2)),
                    self.d(st.integers(0, 1)),
                    self.d(st.integers(0, 1)),
                ]
                for s in shape
            ]
            out = tuple(lo + hi + s + max(0, s - 1) * it for s, (lo, it, hi) in zip(shape, cfg, strict=True))
            p["cfg"] = [[lo, hi, it] for lo, it, hi in cfg]
            return self.add("opq", [x], p, out, dt, keeps)
        if f in ("clip", "jitcall", "while"):
            return self.add("opq", [x], p, shape, dt, keeps)
        if f == "top_k":
            p["k"] = self.d(st.integers(1, shape[-1]))
            p["idx"] = exact and self.d(st.booleans())
            out_dt = "int32" if p["idx"] else dt
            return self.add("opq", [x], p, (*shape[:-1], p["k"]), out_dt, keeps)
        if f == "gather":
            p["idx"] = [self.d(st.integers(0, shape[0] - 1)) for _ in range(self.d(st.integers(1, 3)))]
            return self.add("opq", [x], p, (len(p["idx"]), *shape[1:]), dt, keeps)
        if f == "dyn_slice":
            p["size"] = self.d(st.integers(1, shape[0]))
            p["start"] = self.d(st.integers(0, shape[0] - p["size"]))
            return self.add("opq", [x], p, (p["size"], *shape[1:]), dt, keeps)
        if f == "dyn_update":
            upd = self.operand((1, *shape[1:]), dt)
            p["start"] = self.d(st.integers(0, shape[0] - 1))
            return self.add("opq", [x, upd], p, shape, dt, keeps and self.types[upd][2])
        if f == "conv":
            if len(shape) != 3:
                return None
            kw = self.d(st.integers(1, 3))
            w = self.operand((self.d(st.sampled_from(SIZES[:-1])), shape[1], kw), dt)
            return self.add("opq", [x, w], p, (shape[0], self.types[w][0][0], shape[2]), dt, False)
        if f == "scan":
            return self.add("opq", [x], p, shape[1:], dt, False)
        if f == "cond":
            pred = self.leaf((), "bool")
            return self.add("opq", [pred, x], p, shape, dt, False)
        return None

    STEPS = (
        "unary",
        "binary",
        "dot",
        "chain",
        "idiom",
        "transpose",
        "reshape",
        "broadcast",
        "squeeze",
        "slice",
        "concat",
        "reduce",
        "convert",
        "compare",
        "select",
        "opaque",
    )


@st.composite
def programs(
    draw: Callable,
    max_steps: int = 6,
    dtypes: tuple[str, ...] = (*FLOATS, "int32", "bool"),
    numerics: tuple[str, ...] = ("default", "strict", "fast"),
) -> dict:
    """A hypothesis strategy of program specs (see the module docstring)."""
    fdt = draw(st.sampled_from(dtypes))
    g = _Gen(draw, consts=draw(st.booleans()))
    for _ in range(draw(st.integers(1, 2))):
        g.leaf(g.shape(1, 3), fdt)
    for _ in range(draw(st.integers(1, max_steps))):
        for _attempt in range(3):  # a step that does not fit the operand is drawn again
            x = g.pick()
            if getattr(g, draw(st.sampled_from(_Gen.STEPS)))(x) is not None:
                break
        else:
            g.unary(x)
    n = len(g.values)
    extra = draw(st.lists(st.integers(0, n - 1), max_size=2))
    outputs = [n - 1, *extra]
    options = {
        "numerics": draw(st.sampled_from(numerics)),
        "min_gain": draw(st.sampled_from((0.0, None))),  # 0: decode whenever not predicted slower
        "extractor": draw(st.sampled_from(("greedy", "tree", "ilp"))),
        "cost_model": draw(st.sampled_from(("roofline", "flops"))),
        "seed": draw(st.integers(0, 2**16)),
        # now and then one input element is NaN or +-Inf (see fuzz.check for what must hold then)
        "poison": draw(st.sampled_from((None,) * 6 + ("nan", "inf", "-inf"))),
        # verify=True: optimize's Python call path (built outside a trace, checked against jax.jit)
        "verify": draw(st.sampled_from((False, False, True))),
        # hoist_argnums=0: the first input is a slow argument (optimize's hoisted call path)
        "hoist": draw(st.sampled_from((False, False, True))),
    }
    return {"values": g.values, "outputs": outputs, "options": options}

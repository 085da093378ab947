"""The interpreter of fuzz program specs (see `jaxrw.bench.fuzzgen`): spec -> JAX function, inputs.

Only this table of operations runs: a spec is data, never code. `build(spec, x64=True)` gives the
float64 reference: every float widened, rounded where the program converts to a narrower float.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["build", "make_inputs", "OPS", "kind"]


def kind(dtype: str) -> str:
    """'b' (bool), 'i' (int32) or 'f' (a float dtype)."""
    return "b" if dtype == "bool" else ("i" if dtype == "int32" else "f")


_UN: dict[str, Callable] = {
    "tanh": jnp.tanh,
    "neg": lambda x: -x,
    "abs": jnp.abs,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "logistic": jax.nn.sigmoid,
    "exp_t": lambda x: jnp.exp(jnp.tanh(x)),
    "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x)),
    "log1p_abs": lambda x: jnp.log1p(jnp.abs(x)),
    "relu": jax.nn.relu,
    "square": jnp.square,
    "cube": lambda x: x**3,
    "erf": lax.erf,
    "rsqrt1": lambda x: lax.rsqrt(1 + x * x),
    "gelu": jax.nn.gelu,
    "not": jnp.logical_not,
}
_BIN: dict[str, Callable] = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "div_safe": lambda a, b: a / (1 + jnp.abs(b)),
    "idiv": lambda a, b: lax.div(*jnp.broadcast_arrays(a, b * b + 1)),  # truncating, never by 0
    "irem": lambda a, b: lax.rem(*jnp.broadcast_arrays(a, b * b + 1)),
    "and": jnp.logical_and,
    "or": jnp.logical_or,
    "xor": jnp.logical_xor,
    "lt": jnp.less,
    "gt": jnp.greater,
    "le": jnp.less_equal,
    "ge": jnp.greater_equal,
    "eq": jnp.equal,
    "ne": jnp.not_equal,
}


class _Interp:
    """Evaluates spec entries with jax; `x64=True` maps every float dtype to float64 (reference)."""

    def __init__(self, x64: bool):
        self.x64 = x64

    def dt(self, name: str | None) -> Any:
        if name is None:
            return None
        if self.x64 and kind(name) == "f":
            return jnp.float64
        return jnp.dtype(name)

    def same(self, ref: Any, y: Any) -> Any:
        return y.astype(ref.dtype) if y.dtype != ref.dtype else y

    def __call__(self, op: str, xs: list, p: dict) -> Any:
        if op not in OPS or op == "in":  # a spec names table entries, nothing else
            raise ValueError(f"unknown operation {op!r}; valid: {sorted(OPS)!r}")
        return getattr(self, "op_" + op)(xs, p)

    def op_const(self, xs: list, p: dict) -> Any:
        return _const_value(p, self.dt(p["dtype"]))

    def op_un(self, xs: list, p: dict) -> Any:
        return _UN[p["f"]](xs[0])

    def op_bin(self, xs: list, p: dict) -> Any:
        f = _BIN[p["f"]]
        if "lit" in p:
            lit = p["lit"]
            if p["f"] in ("idiv", "irem"):
                lit = lit if lit else 1
            return f(lit, xs[0]) if p.get("swap") and p["f"] not in ("idiv", "irem") else f(xs[0], lit)
        return f(xs[0], self.same(xs[0], xs[1]))

    def op_cmp(self, xs: list, p: dict) -> Any:
        return _BIN[p["f"]](xs[0], p["lit"] if "lit" in p else xs[1])

    def op_dot(self, xs: list, p: dict) -> Any:
        a, b = xs
        prec = lax.Precision.HIGHEST if p["prec"] == "highest" else None
        pet = self.dt(p["pet"])
        if p["form"] == "matmul":
            return jnp.matmul(a, b, precision=prec, preferred_element_type=pet)
        dims = ((tuple(p["lc"]), tuple(p["rc"])), (tuple(p["lb"]), tuple(p["rb"])))
        return lax.dot_general(a, b, dims, precision=prec, preferred_element_type=pet)

    def op_tr(self, xs: list, p: dict) -> Any:
        return jnp.transpose(xs[0], p["perm"])

    def op_rs(self, xs: list, p: dict) -> Any:
        if "axis" in p:
            return jnp.expand_dims(xs[0], p["axis"])
        return xs[0].reshape(tuple(p["shape"]))

    def op_bc(self, xs: list, p: dict) -> Any:
        return jnp.broadcast_to(xs[0], tuple(p["shape"]))

    def op_sq(self, xs: list, p: dict) -> Any:
        return jnp.squeeze(xs[0], p["axis"])

    def op_sl(self, xs: list, p: dict) -> Any:
        return lax.slice(xs[0], p["start"], p["stop"], p["step"])

    def op_cat(self, xs: list, p: dict) -> Any:
        return jnp.concatenate([self.same(xs[0], x) for x in xs], axis=p["axis"])

    def op_stk(self, xs: list, p: dict) -> Any:
        return jnp.stack([self.same(xs[0], x) for x in xs], axis=p["axis"])

    def op_red(self, xs: list, p: dict) -> Any:
        x, f, axes, keep = xs[0], p["f"], tuple(p["axes"]), p["keep"]
        if f == "sum":
            return jnp.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)
        if f == "mean":
            return jnp.mean(x, axis=axes, keepdims=keep)
        return {"max": jnp.max, "min": jnp.min, "any": jnp.any, "all": jnp.all}[f](
            x, axis=axes, keepdims=keep
        )

    def op_cvt(self, xs: list, p: dict) -> Any:
        if self.x64 and kind(p["to"]) == "f":  # the reference rounds where the program does
            return xs[0].astype(jnp.dtype(p["to"])).astype(jnp.float64)
        return xs[0].astype(self.dt(p["to"]))

    def op_trace(self, xs: list, p: dict) -> Any:
        return jnp.trace(xs[0])

    def op_diagmat(self, xs: list, p: dict) -> Any:
        return jnp.diag(xs[0])

    def op_eye(self, xs: list, p: dict) -> Any:
        return jnp.eye(p["n"], dtype=self.dt(p["dtype"]))

    def op_sel(self, xs: list, p: dict) -> Any:
        c, a, b = xs
        return jnp.where(c, a, self.same(a, b))

    def op_opq(self, xs: list, p: dict) -> Any:
        x, f = xs[0], p["f"]
        if f == "cumsum":
            return jnp.cumsum(x, axis=p["axis"], dtype=x.dtype)
        if f == "sort":
            return jnp.sort(x, axis=p["axis"])
        if f == "flip":
            return jnp.flip(x, p["axis"])
        if f == "cummax":
            return lax.cummax(x, axis=p["axis"])
        if f == "argmax":
            return jnp.argmax(x, axis=p["axis"]).astype(jnp.int32)
        if f == "softmax":
            return jax.nn.softmax(x, axis=p["axis"])
        if f == "pad":
            return lax.pad(x, jnp.zeros((), x.dtype), [tuple(c) for c in p["cfg"]])
        if f == "clip":
            return jnp.clip(x, -1, 1)
        if f == "top_k":
            vals, idx = lax.top_k(x, p["k"])
            return idx if p["idx"] else vals
        if f == "gather":
            return jnp.asarray(x)[jnp.asarray(p["idx"], jnp.int32)]
        if f == "dyn_slice":
            return lax.dynamic_slice_in_dim(x, p["start"], p["size"], 0)
        if f == "dyn_update":
            return lax.dynamic_update_slice_in_dim(x, self.same(x, xs[1]), p["start"], 0)
        if f == "conv":
            return lax.conv_general_dilated(
                x, self.same(x, xs[1]), (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH")
            )
        if f == "scan":

            def step(c, xi):
                c = c * 0.5 + jnp.tanh(xi) if jnp.issubdtype(x.dtype, jnp.floating) else c + xi
                return c, None

            return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), x)[0]
        if f == "while":
            return lax.fori_loop(
                0, 3, lambda i, c: c * 2 - 1 if jnp.issubdtype(c.dtype, jnp.floating) else c * 2 - i, x
            )
        if f == "cond":
            pred, x = xs
            return lax.cond(pred, lambda v: v * 2, lambda v: -v, x)
        if f == "jitcall":
            return _inner(x)
        raise ValueError(f"unknown opaque op {f!r}")


@jax.jit
def _inner(x: Any) -> Any:
    """A nested jit (inlined by the encoder), holding a dot when the value is a float matrix."""
    if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating):
        return (x @ jnp.swapaxes(x, -1, -2)) @ x
    return x * 2 + 1


def _const_value(p: dict, dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(p["seed"])
    return np.asarray(rng.standard_normal(p["shape"]).astype(np.float32)).astype(dtype)


OPS = ("in", "const", *(n[3:] for n in dir(_Interp) if n.startswith("op_") and n != "op_const"))


def build(spec: dict, x64: bool = False) -> Callable[..., tuple]:
    """The program a spec describes, as a function of its inputs returning a tuple of outputs."""
    interp = _Interp(x64)
    values, outputs = spec["values"], spec["outputs"]

    def program(*inputs: Any) -> tuple:
        env: list[Any] = []
        it = iter(inputs)
        for op, args, params in values:
            env.append(next(it) if op == "in" else interp(op, [env[i] for i in args], params))
        return tuple(env[i] for i in outputs)

    program.__name__ = program.__qualname__ = "fuzz_program"
    return program


def make_inputs(spec: dict, seed: int, x64: bool = False) -> list[Any]:
    """Random inputs for a spec: floats ~ N(0, 1), ints in [-5, 5], bools fair coins; with
    options["poison"], one element of the first non-empty float input is NaN, inf or -inf."""
    rng = np.random.default_rng(seed)
    poison = spec.get("options", {}).get("poison")
    out = []
    for op, _, p in spec["values"]:
        if op != "in":
            continue
        shape, dt = tuple(p["shape"]), p["dtype"]
        if dt == "bool":
            out.append(jnp.asarray(rng.random(shape) < 0.5))
        elif dt == "int32":
            out.append(jnp.asarray(rng.integers(-5, 6, shape).astype(np.int32)))
        else:
            x = np.asarray(rng.standard_normal(shape).astype(np.float32)).astype(jnp.dtype(dt))
            if poison and x.size:
                x[tuple(int(rng.integers(0, s)) for s in shape)] = float(poison)
                poison = None
            out.append(jnp.asarray(x.astype(np.float64) if x64 else x))
    return out

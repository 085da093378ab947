"""Call sequences: `optimize(fn, <options>)` against `jax.jit(fn, <the same jit options>)` over a
drawn list of what callers do (the same weights, replaced weights, dropped references, positional
and keyword calls, static values, jit/grad/vmap around the function, bind, clear_cache, donation,
NumPy parameters changed in place, new signatures, Python scalars beside the weights, namedtuple
and registered-dataclass parameters).
Derandomized, 30 examples (CI is reproducible); `CALLSEQ_EXAMPLES=N` runs more. A review's first
run of it found two defects (the explicit examples below): NumPy parameters changed in place were
served stale hoisted values, and verify with a donated argument read a deleted buffer.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import traceback
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import jaxrw
from jaxrw.errors import InvalidOptionError
from jaxrw.tolerance import relative_error
from tests import callseq_paths as leafpath

# ----------------------------------------------------------------------------------------------
# program templates: each fn(p, x, mode=0); `mode` is used in Python control flow, so it is only
# ever passed when it is static.


def _post(y, mode):
    if mode == 1:
        return 2.0 * y
    if mode == 2:
        return jnp.tanh(y)
    return y


def chain(p, x, mode=0):
    # x @ a @ b -> x @ (a @ b), a @ b hoistable
    return _post(x @ p["a"] @ p["b"], mode)


def proj(p, x, mode=0):
    # shared-input projections: merged into one GEMM over concatenated weights (hoistable concat)
    return _post(jnp.concatenate([x @ p["w1"], x @ p["w2"], x @ p["w3"]], axis=-1), mode)


def factor(p, x, mode=0):
    # x@w1 + x@w2 -> x@(w1 + w2), the sum hoistable
    return _post(x @ p["w1"] + x @ p["w2"], mode)


def mlp(p, x, mode=0):
    # nested params with a None leaf, a list and a tuple
    h = jnp.tanh(x @ (p["A"] @ p["B"]) + p["b"][0])
    return _post(h @ p["out"][0], mode)


class Named(NamedTuple):
    a: Any
    b: Any


def named(p, x, mode=0):
    # parameters in a namedtuple (checked as its fields on the quick path), a @ b hoistable
    return _post(x @ p.a @ p.b, mode)


def scaled(p, x, mode=0):
    # a Python scalar beside the weights (the quick path compares it by value), A @ B hoistable
    return _post(jnp.tanh(x @ (p["a"] @ p["b"])) * p["s"], mode)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Struct:
    a: Any
    b: Any
    k: float = dataclasses.field(default=1.0, metadata={"static": True})


def struct(p, x, mode=0):
    # parameters in a registered dataclass (checked as its fields on the quick path), a @ b
    # hoistable, and a static meta field that picks the program (jax retraces when it changes)
    return _post(x @ p.a @ p.b * p.k, mode)


def mlp_shapes(d):
    return {"A": (d, d), "B": (d, d), "b": [(d,), None], "out": ((d, 8),)}


TEMPLATES = {
    "chain": (chain, lambda d: {"a": (d, d), "b": (d, d)}),
    "proj": (proj, lambda d: {"w1": (d, d), "w2": (d, d), "w3": (d, d)}),
    "factor": (factor, lambda d: {"w1": (d, d), "w2": (d, d)}),
    "mlp": (mlp, mlp_shapes),
    "scaled": (scaled, lambda d: {"a": (d, d), "b": (d, d), "s": 0.5}),
    "named": (named, lambda d: Named((d, d), (d, d))),
    "struct": (struct, lambda d: Struct((d, d), (d, d))),
}


def _is_shape(s):
    return isinstance(s, tuple) and all(isinstance(i, int) for i in s)


# ----------------------------------------------------------------------------------------------
# options and steps

options_st = st.fixed_dictionaries(
    {
        "template": st.sampled_from(sorted(TEMPLATES)),
        "hoist": st.sampled_from([None, "argnums", "argnums", "argnums", "argnames"]),
        "static": st.sampled_from([None, "argnums", "argnames"]),
        "donate": st.sampled_from([None, None, 1, 0]),
        "numerics": st.sampled_from(["default", "default", "strict"]),
        "schedule": st.sampled_from(["auto", "xla"]),
        "verify": st.sampled_from([False] * 5 + [True]),
        "disable": st.sampled_from([False] * 9 + [True]),
        "d": st.sampled_from([8, 16]),
        "n": st.sampled_from([3, 4]),
    }
)

STYLES = ["pos", "kw_x", "kw_all", "kw_rev", "np_x"]

step_st = st.one_of(
    st.tuples(st.just("call"), st.sampled_from(STYLES), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("call"), st.sampled_from(STYLES), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("new_x"), st.sampled_from([3, 4, 5])),
    st.tuples(st.just("replace"), st.integers(0, 5), st.sampled_from(["copy", "new", "bf16"]), st.booleans()),
    st.tuples(st.just("replace_all"), st.sampled_from(["copy", "new"])),
    st.tuples(st.just("train"), st.integers(1, 20), st.sampled_from(STYLES[:4])),
    st.tuples(
        st.just("resize"), st.sampled_from([8, 16, 12]), st.sampled_from(["float32", "float32", "bfloat16"])
    ),
    st.tuples(st.just("drop")),
    st.tuples(st.just("drop_recreate")),
    st.tuples(st.just("swap")),
    st.tuples(st.just("numpy_params")),
    st.tuples(st.just("np_mutate"), st.integers(0, 5)),
    st.tuples(st.just("jit"), st.sampled_from([0, 1, 2]), st.booleans()),
    st.tuples(st.just("grad"), st.sampled_from([0, 2])),
    st.tuples(st.just("vmap"), st.sampled_from([0, 2])),
    st.tuples(st.just("bind"), st.booleans()),
    st.tuples(st.just("bind_call"), st.sampled_from([3, 4, 5])),
    st.tuples(st.just("clear")),
    st.tuples(st.just("rescale"), st.sampled_from([0.5, 0.5, 0.25, -0.0, 2, True])),
)


def _tol(dtype):
    return 3e-2 if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else 1e-4


class Mismatch(AssertionError):
    pass


class World:
    """The caller: its current weights, old ones it still holds, and the two functions."""

    def __init__(self, opts, rng):
        self.o = opts
        self.rng = rng
        fn, shapes = TEMPLATES[opts["template"]]
        self.fn, self.shapes = fn, shapes
        self.d, self.n, self.dtype = opts["d"], opts["n"], "float32"
        self.graveyard = []  # old arrays the caller still references
        self.p = self._params()
        self.alt = self._params()
        self.x = self._x()
        self.bound = None  # (bound function, params snapshot, kw?)
        kw = {}
        jit_kw = {}
        if opts["hoist"] == "argnums":
            kw["hoist_argnums"] = 0
        elif opts["hoist"] == "argnames":
            kw["hoist_argnames"] = "p"
        if opts["static"] == "argnums":
            kw["static_argnums"] = jit_kw["static_argnums"] = 2
        elif opts["static"] == "argnames":
            kw["static_argnames"] = jit_kw["static_argnames"] = "mode"
        if opts["donate"] is not None:
            kw["donate_argnums"] = jit_kw["donate_argnums"] = opts["donate"]
        kw["numerics"] = opts["numerics"]
        kw["schedule"] = opts["schedule"]
        kw["verify"] = opts["verify"]
        self.kw = kw
        self.opt = jaxrw.optimize(fn, **kw)
        self.ref = jax.jit(fn, **jit_kw)
        undonated = {k: v for k, v in jit_kw.items() if not k.startswith("donate")}
        self.ref_undonated = jax.jit(fn, **undonated)
        self.first = True
        self.calls = 0

    # -- data ---------------------------------------------------------------------------
    def _arr(self, shape, dtype=None):
        a = self.rng.standard_normal(shape).astype(np.float32) / np.sqrt(self.d)
        return jnp.asarray(a, dtype=dtype or self.dtype)

    def _params(self):
        def make(s):  # a shape, None, or a Python scalar (made anew: an equal, new object)
            return s if s is None else self._arr(s) if _is_shape(s) else type(s)(np.float64(s))

        return jax.tree_util.tree_map(make, self.shapes(self.d), is_leaf=_is_shape)

    def _x(self):
        return self._arr((self.n, self.d))

    def paths(self):
        return [path for path, _ in jax.tree_util.tree_flatten_with_path(self.p)[0]]

    # -- calling ------------------------------------------------------------------------
    @property
    def static(self):
        return self.o["static"] is not None

    def fresh(self, tree, which):
        """A copy of a donated argument (a new one each call), else the argument itself."""
        if self.o["donate"] == which:
            return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), tree)
        return tree

    def invoke(self, f, p, x, mode, style):
        if style == "np_x":
            x = np.asarray(x)
        if style in ("pos", "np_x"):
            return f(p, x, mode) if self.static else f(p, x)
        if style == "kw_x":
            return f(p, x=x, mode=mode) if self.static else f(p, x=x)
        if style == "kw_all":
            return f(p=p, x=x, mode=mode) if self.static else f(p=p, x=x)
        if style == "kw_rev":
            return f(x=x, mode=mode, p=p) if self.static else f(x=x, p=p)
        raise ValueError(style)

    def guarded(self, what, run_opt, run_ref, refused=None):
        """Run jaxrw's call with warnings recorded; if it raises, jax.jit must raise too, unless
        `refused(error)` says jaxrw's refusal is the documented one."""
        env = self.o["disable"] and self.first
        if env:
            os.environ["JAXRW_DISABLE"] = "1"
        try:
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                try:
                    got = run_opt()
                    got = jax.block_until_ready(got)
                    err = None
                except Exception as e:  # noqa: BLE001
                    got, err = None, e
        finally:
            if env:
                os.environ.pop("JAXRW_DISABLE", None)
            self.first = False
        bad = [str(w.message) for w in rec if "jaxrw" in str(w.message)]
        if bad:
            raise Mismatch(f"{what}: jaxrw warned: {bad}")
        try:
            want = jax.block_until_ready(run_ref())
            ref_err = None
        except Exception as e:  # noqa: BLE001
            want, ref_err = None, e
        if err is not None:
            if ref_err is None and refused is not None and refused(err):
                note(f"{what}: refused as documented: {err}")
                return None, None
            if ref_err is None:
                tb = "".join(traceback.format_exception(err))
                raise Mismatch(f"{what}: jaxrw raised but jax.jit did not:\n{tb}")
            note(f"{what}: both raised: {type(err).__name__} / {type(ref_err).__name__}")
            return None, None
        if ref_err is not None:
            raise Mismatch(f"{what}: jax.jit raised {ref_err!r}, jaxrw returned")
        self.compare(what, got, want)
        return got, want

    def compare(self, what, got, want):
        gl, gt = jax.tree_util.tree_flatten(got)
        wl, wt = jax.tree_util.tree_flatten(want)
        if gt != wt:
            raise Mismatch(f"{what}: output tree {gt} != {wt}")
        for g, w in zip(gl, wl, strict=True):
            g, w = np.asarray(g), np.asarray(w)
            if g.shape != w.shape or g.dtype != w.dtype:
                raise Mismatch(f"{what}: {g.shape}{g.dtype} != {w.shape}{w.dtype}")
            tol = _tol(w.dtype)
            rel = relative_error(g, w)
            scale = max(1.0, float(np.max(np.abs(w.astype(np.float64))))) if w.size else 1.0
            close = np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale)
            if not (rel <= tol and close):
                raise Mismatch(
                    f"{what}: relative error {rel:.3g} (tol {tol:g}); max abs diff "
                    f"{np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))):.3g} scale {scale:.3g}"
                )

    def check_alive(self, *trees, what=""):
        """No argument jaxrw was not asked to donate may be deleted."""
        for t in trees:
            for a in jax.tree_util.tree_leaves(t):
                if isinstance(a, jax.Array) and a.is_deleted():
                    raise Mismatch(f"{what}: a non-donated argument was deleted by jaxrw")

    def call(self, style, mode, p=None, x=None):
        p = self.p if p is None else p
        x = self.x if x is None else x
        if not self.static:
            mode = 0
        po, xo = self.fresh(p, 0), self.fresh(x, 1)
        pr, xr = self.fresh(p, 0), self.fresh(x, 1)
        self.calls += 1
        self.guarded(
            f"call#{self.calls}({style}, mode={mode})",
            lambda: self.invoke(self.opt, po, xo, mode, style),
            lambda: self.invoke(self.ref, pr, xr, mode, style),
        )
        keep = [t for t, w in ((po, 0), (xo, 1)) if self.o["donate"] != w]
        self.check_alive(*keep, what=f"call({style})")
        self.check_alive(self.p, self.alt, self.graveyard, what="caller's arrays")

    # -- steps --------------------------------------------------------------------------
    def step(self, s):
        kind = s[0]
        if kind == "call":
            self.call(s[1], s[2])
        elif kind == "new_x":
            self.graveyard.append(self.x)
            self.n = s[1]
            self.x = self._x()
        elif kind == "replace":
            paths = self.paths()
            path = paths[s[1] % len(paths)]
            old = leafpath.get(self.p, path)
            if s[2] == "copy":
                new = jnp.array(old, copy=True)
            elif s[2] == "new":
                new = self._arr(np.shape(old), dtype=jnp.asarray(old).dtype)
            else:  # another dtype for that leaf: a new signature
                new = jnp.asarray(old).astype(
                    jnp.bfloat16 if jnp.asarray(old).dtype != jnp.bfloat16 else jnp.float32
                )
            self.graveyard.append(old)
            if s[3]:  # in place, in the caller's dict (the same container objects)
                self.p = leafpath.set_inplace(self.p, path, new)
            else:
                self.p = leafpath.set_copy(self.p, path, new)
        elif kind == "replace_all":
            self.graveyard.append(self.p)
            if s[1] == "copy":
                self.p = jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), self.p)
            else:
                self.p = jax.tree_util.tree_map(
                    lambda a: self._arr(np.shape(a), jnp.asarray(a).dtype), self.p
                )
        elif kind == "train":  # an optimizer loop: new parameter arrays on every call
            for _ in range(s[1]):
                self.p = jax.tree_util.tree_map(lambda a: jnp.asarray(a) * 0.99 + 0.001, self.p)
                self.call(s[2], 0)
        elif kind == "resize":
            self.graveyard += [self.p, self.alt, self.x]
            self.d, self.dtype = s[1], s[2]
            self.p, self.alt, self.x = self._params(), self._params(), self._x()
            self.bound = None
        elif kind == "drop":
            self.graveyard.clear()
            gc.collect()
        elif kind == "drop_recreate":  # the caller drops its weights; new ones may reuse their ids
            shapes_dtypes = jax.tree_util.tree_map(lambda a: (np.shape(a), jnp.asarray(a).dtype), self.p)
            self.graveyard.clear()
            self.p = None
            gc.collect()
            self.p = jax.tree_util.tree_map(
                lambda sd: self._arr(sd[0], sd[1]),
                shapes_dtypes,
                is_leaf=lambda t: type(t) is tuple and len(t) == 2 and _is_shape(t[0]),
            )
        elif kind == "swap":
            self.p, self.alt = self.alt, self.p
        elif kind == "numpy_params":
            self.graveyard.append(self.p)
            self.p = jax.tree_util.tree_map(lambda a: np.array(a), self.p)
        elif kind == "np_mutate":  # numpy leaves are mutable: change one in place
            leaves = [a for a in jax.tree_util.tree_leaves(self.p) if isinstance(a, np.ndarray)]
            if leaves:
                a = leaves[s[1] % len(leaves)]
                a[...] = (self.rng.standard_normal(a.shape) / np.sqrt(self.d)).astype(a.dtype)
        elif kind == "jit":
            mode = s[1] if self.static else 0
            pw, xw = self.p, self.x
            if s[2]:  # params closed over (concrete inside), x traced
                fo = jax.jit(lambda x: self.invoke(self.opt, pw, x, mode, "pos"))
                fr = jax.jit(lambda x: self.invoke(self.ref, pw, x, mode, "pos"))
                xo, xr = self.fresh(xw, 1), self.fresh(xw, 1)
                self.guarded(f"jit-closure(mode={mode})", lambda: fo(xo), lambda: fr(xr))
            else:
                fo = jax.jit(lambda p, x: self.invoke(self.opt, p, x, mode, "pos"))
                fr = jax.jit(lambda p, x: self.invoke(self.ref, p, x, mode, "pos"))
                po, pr = self.fresh(pw, 0), self.fresh(pw, 0)
                xo, xr = self.fresh(xw, 1), self.fresh(xw, 1)
                self.guarded(f"jit(mode={mode})", lambda: fo(po, xo), lambda: fr(pr, xr))
            self.check_alive(self.p, self.x, what="jit")
        elif kind == "grad":
            mode = s[1] if self.static else 0
            pw, xw = self.p, self.x

            def loss(f):
                return lambda p, x: jnp.sum(self.invoke(f, p, x, mode, "pos").astype(jnp.float32) ** 2)

            po, pr = self.fresh(pw, 0), self.fresh(pw, 0)
            xo, xr = self.fresh(xw, 1), self.fresh(xw, 1)

            returned = []

            def ours():
                out = jax.grad(loss(self.opt), argnums=(0, 1))(po, xo)
                returned.append(True)
                return out

            def reference():
                try:
                    return jax.block_until_ready(jax.grad(loss(self.ref), argnums=(0, 1))(pr, xr))
                except RuntimeError as e:
                    # jax.jit donating under grad can delete a primal its backward pass reads
                    # (jax 0.12); where jaxrw did not fail alike, the program without donation decides
                    if not returned or self.o["donate"] is None or "deleted" not in str(e):
                        raise
                    note(f"grad: jax.jit with donation raised {e!r}; compared without donation")
                    g = jax.grad(loss(self.ref_undonated), argnums=(0, 1))
                    return g(self.fresh(pw, 0), self.fresh(xw, 1))

            self.guarded(f"grad(mode={mode})", ours, reference)
            self.check_alive(self.p, self.x, what="grad")
        elif kind == "vmap":
            mode = s[1] if self.static else 0
            pw = self.p
            xs = jnp.stack([self._x(), self._x(), self._x()])
            po, pr = self.fresh(pw, 0), self.fresh(pw, 0)
            xo, xr = self.fresh(xs, 1), self.fresh(xs, 1)
            self.guarded(
                f"vmap(mode={mode})",
                lambda: jax.vmap(lambda x: self.invoke(self.opt, po, x, mode, "pos"))(xo),
                lambda: jax.vmap(lambda x: self.invoke(self.ref, pr, x, mode, "pos"))(xr),
            )
            self.check_alive(self.p, what="vmap")
        elif kind == "bind":
            by_kw = s[1]
            snap = leafpath.copy_containers(self.p)
            pb = self.fresh(snap, 0)
            try:
                with warnings.catch_warnings(record=True) as rec:
                    warnings.simplefilter("always")
                    b = (
                        self.opt.bind(p=pb, x=self.fresh(self.x, 1))
                        if by_kw
                        else self.opt.bind(pb, self.fresh(self.x, 1))
                    )
                bad = [str(w.message) for w in rec if "jaxrw" in str(w.message)]
                if bad:
                    raise Mismatch(f"bind warned {bad}")
            except InvalidOptionError as e:
                hoist = self.o["hoist"]
                expected = (
                    hoist is None
                    or self.static
                    or (hoist == "argnums" and by_kw)
                    or (hoist == "argnames" and not by_kw)
                )
                if not expected:
                    raise Mismatch(f"bind raised unexpectedly: {e!r}") from e
                note(f"bind refused as documented: {e}")
                self.bound = None
                return
            # calls pass x as the binding did (a bound function keeps the structure it was bound with)
            self.bound = (b, pb, by_kw, self.d, self.dtype, self.x.shape[0])
        elif kind == "bind_call":
            if self.bound is None:
                return
            b, pb, kw, d, dtype, n = self.bound
            if self.o["donate"] == 0:
                return  # bound parameters that are donated: the binding consumed them
            x = jnp.asarray(self.rng.standard_normal((s[1], d)).astype(np.float32), dtype=dtype)
            xo, xr = self.fresh(x, 1), self.fresh(x, 1)

            def refused(e):
                # a bound function is specialized to the shapes it was bound with, as jax's compiled
                # executables are: another batch size may be refused, saying so
                return s[1] != n and isinstance(e, InvalidOptionError) and f"got {dtype}[{s[1]}," in str(e)

            self.guarded(
                f"bound call(n={s[1]}, kw={kw})",
                lambda: b(x=xo) if kw else b(xo),
                lambda: self.ref(pb, xr),
                refused=refused,
            )
            self.check_alive(pb, what="bound call")
        elif kind == "clear":
            self.opt.clear_cache()
        elif kind == "rescale":  # the scalar beside the weights: an equal new one, another, another type
            if isinstance(self.p, dict) and "s" in self.p:
                self.p = {**self.p, "s": type(s[1])(np.float64(s[1]))}
            elif isinstance(self.p, Struct):  # the meta field: a new treedef where it differs
                self.p = dataclasses.replace(self.p, k=type(s[1])(np.float64(s[1])))
        else:
            raise ValueError(kind)


def _opts(**changes):
    """A hoisted chain template's options with `changes` (the explicit examples below)."""
    base = {"template": "chain", "hoist": "argnums", "static": None, "donate": None, "numerics": "default"}
    base.update(schedule="auto", verify=False, disable=False, d=8, n=3)
    return {**base, **changes}


N = int(os.environ.get("CALLSEQ_EXAMPLES", "30"))


@settings(
    max_examples=N,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
@given(opts=options_st, steps=st.lists(step_st, min_size=1, max_size=16), rseed=st.integers(0, 2**16))
# the defects the first run found (tests/test_hoist_call_class.py pins them too)
@example(opts=_opts(hoist=None, donate=1, verify=True), steps=[("call", "pos", 0)], rseed=0)
@example(opts=_opts(), steps=[("numpy_params",), ("call", "pos", 0), ("np_mutate", 0)], rseed=0)
# a run of 200 examples (thirty-second session): a bound function called with another batch
# size (refused, as documented), and jax.jit with donation failing under grad where jaxrw does not
@example(opts=_opts(), steps=[("bind", False), ("call", "pos", 0), ("bind_call", 5)], rseed=0)
@example(opts=_opts(donate=1), steps=[("grad", 0)], rseed=0)
# the same without hoisting: jaxrw runs jax.jit's program and fails alike
@example(opts=_opts(hoist=None, donate=1), steps=[("grad", 0)], rseed=0)
# parameters in a namedtuple, one leaf replaced in place and by a copy (thirty-sixth session)
@example(
    opts=_opts(template="named"),
    steps=[("replace", 0, "new", True), ("replace", 1, "copy", False), ("drop_recreate",), ("swap",)],
    rseed=0,
)
# parameters in a registered dataclass: a field replaced in place and by a copy, its static field
# changed (thirty-seventh session)
@example(
    opts=_opts(template="struct"),
    steps=[("replace", 0, "new", True), ("rescale", 0.5), ("replace", 1, "copy", False), ("swap",)],
    rseed=0,
)
# a Python scalar beside the weights: equal new ones, other values and types (thirty-sixth session)
@example(
    opts=_opts(template="scaled"),
    steps=[("call", "pos", 0), ("rescale", 0.5), ("rescale", 0.25), ("rescale", 2), ("rescale", -0.0)],
    rseed=0,
)
def test_call_sequences_match_jax_jit(opts, steps, rseed):
    w = World(opts, np.random.default_rng(rseed))
    note(f"options: {w.kw} template={opts['template']} disable={opts['disable']}")
    w.call("pos", 0)
    for i, s in enumerate(steps):
        note(f"step {i}: {s}")
        w.step(s)
        if s[0] not in ("call", "train", "jit", "grad", "vmap", "bind_call"):
            w.call("pos", 1)  # every state change is followed by a call
    w.call("kw_all", 2)

"""Where optimize(fn) must behave as jax.jit(fn) does, found by a review that compared the two
call by call (the fourth review round): keyword names, configuration contexts, methods,
disable_jit, threads, donation under transformations, what a signature keeps alive."""

from __future__ import annotations

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.tolerance import relative_error
from tests.compiles import compiled_names


def _r(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_a_keyword_named_self_reaches_the_function():
    # optimize(f)(x, self=3.0): "got multiple values for argument 'self'", then a fallback
    def scale(x, self):
        return x * self

    x = jnp.ones(2)
    got = jaxrw.optimize(scale, strict=True)(x, self=3.0)
    np.testing.assert_array_equal(got, jax.jit(scale)(x, self=3.0))
    assert jaxrw.optimize(scale, strict=True).report(x, self=3.0) is not None


def _mixed_types(A, v, h):
    return (A @ A) @ v + h  # float32 + bfloat16: promoted by default, an error under "strict"


def _mixed_ranks(A, v, h):
    return (A @ A) @ A + v  # (n, n) + (n,): broadcast by default, an error under "raise"


@pytest.mark.parametrize(
    "fn, context",
    [
        (_mixed_types, lambda: jax.numpy_dtype_promotion("strict")),
        (_mixed_ranks, lambda: jax.numpy_rank_promotion("raise")),
    ],
    ids=["dtype", "rank"],
)
def test_promotion_contexts_are_part_of_the_signature(fn, context):
    # a signature built under the default promotion was reused inside the context: no error
    A, v = _r(0, 64, 64), _r(1, 64)
    args = (A, v, v.astype(jnp.bfloat16))
    opt = jaxrw.optimize(fn)
    np.testing.assert_allclose(opt(*args), jax.jit(fn)(*args), rtol=1e-2)  # built here
    with context():
        with pytest.raises(Exception) as jitted:
            jax.jit(fn)(*args)
        with pytest.raises(type(jitted.value)):
            opt(*args)


THREADS = """
import threading, warnings
import jax.numpy as jnp, jaxrw
warnings.simplefilter("error")  # a fallback's warning fails the thread
got = {}
def work(name, n, bias):
    f = jaxrw.optimize(lambda A, B, v: A @ B @ v + bias)
    args = (jnp.ones((n, n)), jnp.ones((n, n)), jnp.ones(n))
    f(*args)
    got[name] = f.report(*args).rewritten
ts = [threading.Thread(target=work, args=("a", 128, 0.0)), threading.Thread(target=work, args=("b", 96, 1.0))]
[t.start() for t in ts]; [t.join() for t in ts]
print(sorted(got.items()))
"""


def test_two_threads_making_the_first_rewrites_of_a_process():
    # egglog's rule declarations raced: one signature fell back with a KeyError
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[('a', True), ('b', True)]", out.stderr[-2000:]


@pytest.mark.parametrize("options", [{"verify": True}, {"hoist_argnums": 0}, {}])
def test_a_signature_keeps_no_argument_of_the_call_that_built_it(options):
    # the traced function closed over the whole call: arrays pinned, tracers leaked (checking_leaks)
    import gc
    import weakref

    def kept(x):
        return jnp.tanh(x) * 2

    f = jaxrw.optimize(kept, **options)
    x = _r(3, 1024)
    f(x)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None
    with jax.checking_leaks():
        jax.jit(jaxrw.optimize(kept, **options))(_r(4, 8))


def test_a_method_is_bound_to_its_instance():
    # Optimized was no descriptor: m.apply(W, x) called the function without `self`
    import functools

    class Model:
        scale = 2.0

        def __hash__(self):
            return 1

        @functools.partial(jaxrw.optimize, static_argnums=0)
        def apply(self, W, x):
            return W @ W @ x * self.scale

        @jaxrw.optimize
        def plain(W, x):  # noqa: N805 - reached through the class, unbound
            return W @ x

    m, W, x = Model(), _r(5, 8, 8), _r(6, 8)
    np.testing.assert_allclose(m.apply(W, x), W @ W @ x * 2.0, rtol=1e-5)
    np.testing.assert_allclose(Model.plain(W, x), W @ x, rtol=1e-5)
    assert isinstance(Model.__dict__["apply"], jaxrw.Optimized)


@pytest.mark.parametrize("first_outside", [False, True])
def test_disable_jit_runs_the_function_eagerly(first_outside):
    # it was traced: an eager-only check failed as a "compile stage" fault, and then every later
    # call of the instance ran jax.jit
    seen = []

    def f(A, v):
        seen.append(isinstance(v, jax.core.Tracer))
        if not bool(jnp.isfinite(v).all()):  # a check that only runs eagerly
            raise ValueError("non-finite input")
        return A @ A @ v

    A, v = _r(7, 32, 32), _r(8, 32)
    opt = jaxrw.optimize(f, strict=True)
    if first_outside:
        with pytest.raises(Exception):  # noqa: B017 - jax.jit's error for bool() of a tracer
            opt(A, v)
        opt = jaxrw.optimize(lambda A, v: A @ A @ v, strict=True)
        opt(A, v)
    with jax.disable_jit():
        seen.clear()
        got = jaxrw.optimize(f, strict=True)(A, v)
        assert seen == [False]
        np.testing.assert_allclose(got, A @ A @ v, rtol=1e-5)
        np.testing.assert_allclose(opt(A, v), A @ A @ v, rtol=1e-5)


def test_verify_compares_keys_and_infinities_quietly():
    # a typed PRNG key output raised TypeError in tolerance(); an Inf output warned from NumPy
    import warnings

    def split(key, A, v):
        return jax.random.split(key), A @ A @ v

    key, A, v = jax.random.key(0), _r(9, 16, 16), _r(10, 16)
    got = jaxrw.optimize(split, verify=True, strict=True)(key, A, v)
    want = jax.jit(split)(key, A, v)
    np.testing.assert_array_equal(jax.random.key_data(got[0]), jax.random.key_data(want[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jaxrw.optimize(lambda A, v: A @ A @ v / 0.0, verify=True, strict=True)(A, v)
    assert np.isinf(out).any()
    assert relative_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.0])) == 0.0


def test_grad_of_a_donating_function():
    # jax donated the forward pass's concrete v under grad; the rewritten A @ (A @ v) reused its
    # buffer for a residual: "Array has been deleted" where jax.grad(jax.jit(loss)) ran
    import warnings

    def loss(A, v):
        return jnp.sum(A @ A @ v)

    A, v = _r(11, 64, 64) / 8, _r(12, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jax: some donated buffers were not usable
        want = jax.grad(jax.jit(loss, donate_argnums=1))(A, v)
        opt = jaxrw.optimize(loss, donate_argnums=1, strict=True)
        got = jax.grad(opt)(A, v)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not v.is_deleted()


def test_a_kept_signature_under_eager_grad_is_not_traced_again(monkeypatch):
    # every call under an eager jax.grad traced a new inlining jit (about 2x jax.jit's time)
    import jaxrw.api as api

    traces = []
    inline = api.Optimized._inline
    monkeypatch.setattr(
        api.Optimized, "_inline", lambda self, *a, **k: traces.append(1) or inline(self, *a, **k)
    )

    def loss(A, B, v):
        return jnp.sum(jnp.tanh(A @ B @ v))

    A, v = _r(13, 32, 32) / 8, _r(14, 32)
    opt = jaxrw.optimize(loss)
    assert not opt.report(A, A, v).rewritten  # kept as written (the guard's margin)
    grad = jax.grad(opt, argnums=2)
    want = jax.grad(jax.jit(loss), argnums=2)(A, A, v)
    grad(A, A, v)
    traces.clear()
    for _ in range(5):
        np.testing.assert_allclose(grad(A, A, v), want, rtol=1e-5, atol=1e-6)
    assert not traces


@pytest.mark.parametrize("static", [False, True])
def test_a_leaf_that_is_no_array_is_a_type_error_that_says_where(static):
    # it was a ValueError naming only the value: code catching jax.jit's TypeError missed it
    from jaxrw.errors import InvalidOptionError

    def step(params, k, cfg):
        return params["w"] @ params["w"] * cfg["opt"]["lr"] * k

    f = jaxrw.optimize(step, static_argnums=1) if static else jaxrw.optimize(step)
    cfg = {"opt": {"lr": 0.1, "name": "adam"}}
    with pytest.raises(TypeError, match=r"argument 2 at \['opt'\]\['name'\]: .*'adam' of type str") as err:
        f({"w": _r(15, 4, 4)}, 2, cfg)
    assert isinstance(err.value, InvalidOptionError)
    with pytest.raises(TypeError, match=r"keyword argument 'cfg' at \['opt'\]\['name'\]"):
        f({"w": _r(15, 4, 4)}, 2, cfg=cfg)


def test_argnums_as_jax_jit_takes_them():
    # negative indices and NumPy integers were refused
    def f(A, v, scale):
        return A @ A @ v * scale

    A, v = _r(16, 8, 8), _r(17, 8)
    from jaxrw import compat

    for nums in (-1, np.int64(2), (np.int32(-1),)):
        opt = jaxrw.optimize(f, static_argnums=nums, strict=True)
        # the name jax.jit completes: jax 0.11 names none for a negative index
        named = ("scale",) if compat.JAX_VERSION >= (0, 12) or np.all(np.asarray(nums) >= 0) else ()
        assert opt.static_argnums == (2,) and opt.static_argnames == named
        np.testing.assert_allclose(opt(A, v, 2.0), jax.jit(f, static_argnums=nums)(A, v, 2.0), rtol=1e-5)
    assert jaxrw.optimize(f, donate_argnums=-2).donate_argnums == (1,)
    # hoisted arguments are completed the same way (the README says so; hoist_argnames=... showed
    # hoist_argnums == (): a new user's audit)
    by_name = jaxrw.optimize(f, hoist_argnames="A")
    assert (by_name.hoist_argnums, by_name.hoist_argnames) == ((0,), ("A",))
    assert jaxrw.optimize(f, hoist_argnums=-3).hoist_argnames == ("A",)
    with pytest.raises(jaxrw.JaxrwError, match="no \\*args"):
        jaxrw.optimize(lambda *xs: xs[0], static_argnums=-1)


def test_the_hoisted_quick_call_defers_to_disable_jit_and_to_the_donation_twin():
    # the class-level quick call of a hoisted signature skipped Optimized.__call__'s checks
    import warnings

    rng = np.random.default_rng(0)
    W, A = (jnp.asarray(rng.standard_normal((32, 32)) / 8, jnp.float32) for _ in range(2))

    def loss(W, A, v):
        return jnp.sum((W.T @ W) @ v + A @ A @ v)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jax: some donated buffers were not usable
        opt = jaxrw.optimize(loss, donate_argnums=2, hoist_argnums=0)
        for i in range(3):
            opt(W, A, _r(20 + i, 32))
        assert type(opt).__call__.__name__ == "hot_call"
        v = _r(30, 32)
        want = jax.grad(jax.jit(loss, donate_argnums=2), argnums=1)(W, A, v)
        np.testing.assert_allclose(jax.grad(opt, argnums=1)(W, A, v), want, rtol=1e-4, atol=1e-5)
    seen = []

    def f(p, x):
        seen.append(isinstance(x, jax.core.Tracer))
        return jnp.tanh(x @ (p["A"] @ p["B"]))

    p, x = {"A": W, "B": A}, _r(31, 4, 32)
    hoisted = jaxrw.optimize(f, hoist_argnums=0)
    for _ in range(3):
        hoisted(p, x)
    seen.clear()
    with jax.disable_jit():
        hoisted(p, x)
    assert seen == [False]


def test_a_bound_method_reaches_the_optimized_functions_attributes():
    import functools

    class M:
        @functools.partial(jaxrw.optimize, static_argnums=0)
        def f(self, x):
            return x @ x

        def __hash__(self):
            return 1

    m, x = M(), _r(32, 8, 8)
    m.f(x)
    assert m.f.report(m, x) is not None and m.f.__name__ == "f"
    m.f.clear_cache()


# --- a new user's try (thirty-ninth session): names and attributes --------------------------------


class _Scaled:
    """A callable object whose attributes share names with optimize's fields."""

    def __init__(self, W):
        self.W = W
        self.fn = jax.nn.relu  # optimize ran this instead of __call__: relu(x), silently
        self.schedule = lambda step: 1e-3  # a learning-rate schedule: a spurious fallback
        self._cache = {"seen": 1}  # a memo dict: every call raised AttributeError
        self.traces = []

    def __call__(self, x):
        return x @ self.W @ self.W


def test_a_callable_objects_attributes_do_not_replace_optimizes_own():
    obj = _Scaled(_r(0, 8, 8))
    x = _r(1, 4, 8)
    opt = jaxrw.optimize(obj, strict=True)
    np.testing.assert_allclose(opt(x), jax.jit(obj)(x), rtol=1e-5, atol=1e-5)
    assert obj._cache == {"seen": 1}  # jaxrw's signatures are not written into the user's dict
    assert opt.W is obj.W  # attributes optimize does not have still reach through, as jax.jit's
    assert opt.__name__ == jax.jit(obj).__name__


def test_optimize_of_an_optimized_function_keeps_its_own_options():
    def f(A, v):
        return A @ A @ v

    inner = jaxrw.optimize(f)
    outer = jaxrw.optimize(inner, strict=True, verify=True, numerics="strict")
    assert (outer.strict, outer.verify, outer.numerics) == (True, True, "strict")
    assert outer._cache is not inner._cache
    A, v = _r(2, 16, 16), _r(3, 16, 2)
    np.testing.assert_allclose(outer(A, v), f(A, v), rtol=1e-5, atol=1e-5)


def test_a_partial_is_named_as_jax_jit_names_it():
    import functools

    def loss(w, x):
        return jnp.sum((x @ w @ w) ** 2)

    step = functools.partial(loss, jnp.ones((4, 4)))
    assert jaxrw.optimize(step).__name__ == jax.jit(step).__name__ == "loss"


def test_the_compiled_program_and_trace_errors_name_the_users_function():
    def masked(x, mask=None):
        if mask is not None and mask.any():  # a Python bool of a tracer: the user's error
            x = jnp.where(mask, x, 0.0)
        return x @ x

    A = _r(4, 4, 4)
    for opts in ({}, {"verify": True}, {"hoist_argnums": 0}):
        opt = jaxrw.optimize(masked, **opts)
        opt(A)  # a first signature (kept as written: state "jit")
        with pytest.raises(jax.errors.TracerBoolConversionError) as got:
            opt(A, A > 0)
        line = str(got.value).splitlines()[1]
        assert "function masked at" in line and "argument mask" in line, (opts, line)


@pytest.mark.parametrize("opts", [{}, {"hoist_argnums": 0}], ids=["plain", "hoisted"])
def test_the_compiled_programs_are_named_as_the_users_function(opts):
    # every optimized function compiled as jit(inline): alike in compile logs, dumps and profiles
    def mix(W, x):
        return x @ W @ W

    W, x = _r(5, 16, 16), _r(6, 2, 16)
    names = compiled_names(lambda: jaxrw.optimize(mix, **opts)(W, x))
    assert "jit(mix)" in names and not names & {"jit(inline)", "jit(body)"}, names


def test_the_rewritten_program_keeps_the_users_named_scopes():
    # decode rebuilt every equation outside its source: profiles and HLO dumps lost the scopes
    def f(A, v):
        with jax.named_scope("attention"):
            h = A @ A @ A @ v  # rewritten as A @ (A @ (A @ v))
        with jax.named_scope("mlp"):
            return jnp.abs(h) + 1  # as written

    A, v = _r(7, 32, 32), _r(8, 32, 2)
    opt = jaxrw.optimize(f, strict=True)
    assert opt.report(A, v).rewritten
    text = opt.lower(A, v).as_text(debug_info=True)
    assert "jit(f)/mlp/abs" in text and "jit(f)/mlp/add" in text
    # a product only the rewrite made is named as jaxrw's; the chain's result as the user's
    assert "jit(f)/jaxrw/dot_general" in text and "jit(f)/attention/dot_general" in text
    assert relative_error(opt(A, v), jax.jit(f)(A, v)) < 1e-5


def test_a_callable_without_a_readable_signature_is_taken_as_jax_jit_takes_it():
    # optimize(max) raised jax's "Getting the signature of function ... failed" at decoration
    for wrap in (jax.jit, jaxrw.optimize):
        f = wrap(max)  # a builtin: inspect.signature cannot read it
        with pytest.raises(jax.errors.TracerBoolConversionError, match="function max"):
            f(jnp.ones(()), jnp.zeros(()))


_NOT_WEAKLY_REFERABLE = """
import operator, jax, jax.numpy as jnp, jaxrw
x = [jnp.arange(3.0), jnp.ones(2)]
first = jaxrw.optimize(operator.itemgetter(0))
print(first(x).tolist(), jax.jit(first)(x).tolist())
jaxrw.explain(operator.itemgetter(1), x)
total = jaxrw.optimize(operator.methodcaller("sum"))
print(float(total(x[0])), jax.grad(total)(x[0]).tolist())
"""


def test_a_callable_that_cannot_be_weakly_referenced_is_compiled_twice_safely():
    # a second jax.jit of operator.itemgetter(0) ends the interpreter (jax 0.12.1, SIGSEGV; jax.jit's
    # call of one raises TypeError), and explain and grad compiled the callable again: a subprocess,
    # so a crash fails this test alone
    done = subprocess.run([sys.executable, "-c", _NOT_WEAKLY_REFERABLE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[0.0, 1.0, 2.0] [0.0, 1.0, 2.0]", "3.0 [1.0, 1.0, 1.0]"]


def test_a_negative_index_names_what_jax_jit_names():
    # -1 of f(x, y, *, z) names no parameter in jax 0.12's jax.jit (it counts all of them): y
    # passed by keyword is neither donated nor static there; jaxrw took it as both (a review)
    from jaxrw import compat

    if compat.JAX_VERSION < (0, 12):  # its jax.jit donates nothing for -1 even by position
        pytest.skip("jax 0.11's jax.jit resolves negative indices otherwise")

    def f(x, y, *, z=1.0):
        return x @ x @ y * z

    x = jnp.ones((4, 4))
    seen = []
    for wrap in (jax.jit, jaxrw.optimize):
        y = jnp.ones((4, 4))
        wrap(f, donate_argnums=-1)(x, y=y)
        try:
            static_by_keyword = wrap(f, static_argnums=-1)(x, y=jnp.ones((4, 4))).shape == (4, 4)
        except ValueError:  # an array taken as a static value (jax 0.11's jax.jit names y)
            static_by_keyword = False
        y2 = jnp.ones((4, 4))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            wrap(f, donate_argnums=-1)(x, y2)  # by position it is donated
        seen.append((y.is_deleted(), static_by_keyword, y2.is_deleted()))
    assert seen[1] == seen[0] and seen[0][2]


class _Lying:
    """A callable object whose attribute lookup answers None for what it does not hold."""

    def __init__(self, W):
        self.W = W

    def __getattr__(self, name):
        return None

    def __call__(self, x):
        return x @ self.W @ self.W


@pytest.mark.parametrize("opts", [{}, {"verify": True}], ids=["plain", "verify"])
def test_odd_callables_are_named_as_jax_jit_names_them(opts):
    # a partial compiled as jit(inline) and verify's programs as jit(run)/jit(<lambda>); an object
    # whose __getattr__ answers None made the name copy raise TypeError at decoration (a review)
    import functools

    W, x = _r(9, 8, 8), _r(10, 2, 8)

    def loss(W, x):
        return x @ W @ W

    for fn, args in ((functools.partial(loss, W), (x,)), (_Lying(W), (x,))):
        want = []
        for wrap in (jax.jit, lambda f: jaxrw.optimize(f, **opts)):
            got: list = []
            call = functools.partial(lambda out, w, f, a: out.append(w(f)(*a)), got, wrap, fn, args)
            want.append(compiled_names(call))
            np.testing.assert_allclose(got[0], loss(W, x), rtol=1e-5, atol=1e-5)
        assert want[1] and want[1] <= want[0] | {"jit(loss_reference)"}, want


@pytest.mark.parametrize("hoist", [None, (1, 2)])
def test_float64_arrays_with_x64_turned_off_run_as_jax_jit_runs_them(hoist):
    # arrays made under x64, passed after it is turned off: jaxrw traced ShapeDtypeStructs of
    # them, which jax narrows to float32 (a float32 result where jax.jit's is float64) with a
    # warning per struct (12, 18 with hoisting; a new user's try, 42nd session)
    f = lambda x, w1, w2: x @ w1 + x @ w2  # noqa: E731
    with jax.enable_x64(True):
        args = tuple(jnp.full((8, 8), 0.5 + i, jnp.float64) for i in range(3))
    want = jax.jit(f)(*args)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt = jaxrw.optimize(f, hoist_argnums=hoist)
        got = opt(*args)
        opt(*args)
    assert got.dtype == want.dtype == jnp.float64
    np.testing.assert_array_equal(got, want)
    ours = [w for w in seen if "jaxrw" in str(w.message)]
    assert len(ours) == 1 and "float64 arrays while jax_enable_x64 is off" in str(ours[0].message)
    assert ours[0].filename == __file__  # the user's line, not contextlib's
    assert not [w for w in seen if "ShapeDtypeStruct" in str(w.message) or "zeros" in str(w.message)]
    with pytest.raises(jaxrw.JaxrwError, match="jax_enable_x64 is off"):
        jaxrw.optimize(f, strict=True)(*args)

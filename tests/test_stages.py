"""jax.jit's stages on an optimized function (lower, trace, eval_shape), donate_argnames, and
hoisted or donated arguments named either way (position or keyword), as jax.jit takes them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.hoist import HoistedCall


def _r(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _chain(a, b, v, *, scale=1.0):
    return ((a @ b) @ v) * scale  # a @ (b @ v) is 2n^2 instead of n^3 + n^2 multiply-adds


def _dot_results(text):
    """The result type of each dot in a lowered program's text."""
    return [line.rsplit("->", 1)[1].strip() for line in text.splitlines() if "stablehlo.dot_general" in line]


def test_lower_holds_the_rewritten_program_and_compiles_to_the_same_values():
    a, b, v = _r(0, 128, 128), _r(1, 128, 128), _r(2, 128, 1)
    opt = jaxrw.optimize(_chain, static_argnames="scale", strict=True)
    assert opt.report(a, b, v, scale=2.0).rewritten
    lowered = opt.lower(a, b, v, scale=2.0)
    text = lowered.as_text()
    # reassociated: both dots produce a vector, none the n x n product jax.jit's program has
    assert _dot_results(text) == ["tensor<128x1xf32>"] * 2
    assert _dot_results(jax.jit(_chain).lower(a, b, v).as_text())[0] == "tensor<128x128xf32>"
    got = lowered.compile()(a, b, v)
    want = jnp.asarray(_chain(*(np.asarray(x, np.float64) for x in (a, b, v)), scale=2.0))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_trace_and_eval_shape_agree_with_jax_jit():
    a, b, v = _r(3, 64, 64), _r(4, 64, 64), _r(5, 64, 3)
    opt = jaxrw.optimize(_chain, static_argnames="scale")
    jit = jax.jit(_chain, static_argnames="scale")
    assert opt.eval_shape(a, b, v, scale=3.0) == jit.eval_shape(a, b, v, scale=3.0)
    spec = jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)  # shapes only, as jax.jit takes them
    assert opt.eval_shape(spec, spec, spec).dtype == jnp.bfloat16
    traced = opt.trace(a, b, v)
    assert traced.out_info.shape == (64, 3)
    np.testing.assert_allclose(traced.lower().compile()(a, b, v), jit(a, b, v), rtol=1e-4, atol=1e-4)


def test_stages_after_clear_cache_stage_the_program_built_again():
    a, b, v = _r(6, 32, 32), _r(7, 32, 32), _r(8, 32, 1)
    opt = jaxrw.optimize(_chain)
    first = opt.lower(a, b, v).as_text()
    opt.clear_cache()
    assert opt.lower(a, b, v).as_text() == first
    assert opt.traces == 2  # traced again, not served from the first jit's trace cache


def test_lower_of_a_disabled_function_is_jax_jits_program(monkeypatch):
    monkeypatch.setenv("JAXRW_DISABLE", "1")
    a, b, v = _r(9, 64, 64), _r(10, 64, 64), _r(11, 64, 1)
    opt = jaxrw.optimize(_chain)
    opt(a, b, v)  # the first call reads JAXRW_DISABLE
    want = _dot_results(jax.jit(_chain).lower(a, b, v).as_text())
    assert _dot_results(opt.lower(a, b, v).as_text()) == want == ["tensor<64x64xf32>", "tensor<64x1xf32>"]


def test_lower_carries_donation_as_jax_jit_does():
    a, b, v = _r(12, 64, 64), _r(13, 64, 64), _r(14, 64, 64)
    donating = jaxrw.optimize(_chain, donate_argnums=2).lower(a, b, v).as_text()
    plain = jaxrw.optimize(_chain).lower(a, b, v).as_text()
    assert "tf.aliasing_output" in donating and "tf.aliasing_output" not in plain


_PASSINGS = [
    lambda g, a, b, v: g(a, b, v),
    lambda g, a, b, v: g(a, b, v=v),
    lambda g, a, b, v: g(a, b=b, v=v),
]


@pytest.mark.parametrize("call", _PASSINGS, ids=["positional", "keyword", "keywords"])
def test_donate_argnames_donates_however_the_argument_is_passed(call):
    a, b = _r(15, 64, 64), _r(16, 64, 64)
    opt = jaxrw.optimize(_chain, donate_argnames="v", strict=True)
    jit = jax.jit(_chain, donate_argnames="v")
    v, u = _r(17, 64, 64), _r(17, 64, 64)
    want = call(jit, a, b, u)
    np.testing.assert_allclose(call(opt, a, b, v), want, rtol=1e-4, atol=1e-4)
    assert v.is_deleted() and u.is_deleted()
    assert opt.donate_argnums == (2,) and opt.donate_argnames == ("v",)


@pytest.mark.parametrize("bad", [3, ["v", 1], b"v"])
def test_donate_argnames_must_be_names(bad):
    with pytest.raises(jaxrw.InvalidOptionError, match="donate_argnames"):
        jaxrw.optimize(_chain, donate_argnames=bad)


def test_donate_argnames_not_a_parameter_is_refused_as_jax_jit_refuses_it():
    with pytest.raises(ValueError, match="donate_argnames"):
        jaxrw.optimize(_chain, donate_argnames="w")


def _decoder(params, x):
    return jnp.tanh(x @ (params["A"] @ params["B"]))  # A @ B depends on the parameters only


def _params(seed):
    return {"A": _r(seed, 64, 64) / 8, "B": _r(seed + 1, 64, 64) / 8}


@pytest.mark.parametrize("opts", [{"hoist_argnums": 0}, {"hoist_argnames": "params"}])
def test_a_hoisted_argument_passed_the_other_way_is_hoisted(opts):
    # hoist_argnums=0 with params=... passed by keyword was not hoisted (the leaf's owner is the
    # name); jax.jit completes static and donated arguments from either spelling, and so does this
    opt = jaxrw.optimize(_decoder, **opts)
    p, x = _params(20), _r(22, 4, 64)
    for call in (lambda: opt(params=p, x=x), lambda: opt(p, x)):
        np.testing.assert_allclose(call(), _decoder(p, x), rtol=1e-4, atol=1e-5)
    assert all(isinstance(e.call, HoistedCall) for e in opt._cache.values())
    assert len(opt._cache) == 2


@pytest.mark.parametrize(
    "opts", [{"donate_argnums": 0}, {"donate_argnames": "params"}], ids=["argnums", "argnames"]
)
def test_a_donated_argument_passed_by_keyword_is_not_hoisted(opts):
    # donate_argnums=0 with params=... passed by keyword was hoisted (cached by identity) all the
    # same: a donated array is deleted by the call, and its id can be reused by a new array
    opt = jaxrw.optimize(_decoder, hoist_argnames="params", **opts)
    x = _r(23, 4, 64)
    for seed in (24, 26):
        p = _params(seed)
        want = _decoder(p, x)
        np.testing.assert_allclose(opt(params=p, x=x), want, rtol=1e-4, atol=1e-5)
    assert not any(isinstance(e.call, HoistedCall) for e in opt._cache.values())


def test_lower_of_a_new_signature_in_the_kept_state_is_the_rewritten_program():
    # a kept signature first puts the function in state "jit", whose call traces the function as
    # written for a signature met there: .lower() showed jax.jit's program for one jaxrw rewrites
    def chain(a, b, v):
        return (a @ b) @ v

    a, b = _r(30, 128, 128), _r(31, 128, 128)
    opt = jaxrw.optimize(chain)
    opt(a, b, _r(32, 128, 128))  # kept as written (no cheaper order for a square product)
    assert opt._fast_state == "jit"
    vec = _r(33, 128, 1)
    assert _dot_results(opt.lower(a, b, vec).as_text()) == ["tensor<128x1xf32>"] * 2
    assert opt.report(a, b, vec).rewritten
    np.testing.assert_allclose(opt(a, b, vec), chain(a, b, vec), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "opts", [{"donate_argnums": 1}, {"donate_argnames": "x"}], ids=["argnums", "argnames"]
)
def test_the_hoisted_quick_path_donates_an_argument_passed_by_keyword(opts):
    # the hot path's jit had donate_argnums only: x=... was donated on the first call alone
    opt = jaxrw.optimize(_decoder, hoist_argnums=0, **opts)
    jit = jax.jit(_decoder, **opts)
    p = _params(40)
    for seed in range(42, 46):
        x, y = _r(seed, 4, 64), _r(seed, 4, 64)
        np.testing.assert_allclose(opt(p, x=x), jit(p, x=y), rtol=1e-4, atol=1e-5)
        assert x.is_deleted() and y.is_deleted()


def test_both_spellings_given_are_each_taken_as_given_as_jax_jit_takes_them():
    def f(a, b, v):
        return a * b, v + b

    opts = {"donate_argnums": 0, "donate_argnames": "v"}
    opt, jit = jaxrw.optimize(f, **opts), jax.jit(f, **opts)
    assert (opt.donate_argnums, opt.donate_argnames) == ((0,), ("v",))
    b = _r(50, 8)
    a1, v1, a2, v2 = _r(51, 8), _r(52, 8), _r(51, 8), _r(52, 8)
    got, want = opt(a=a1, b=b, v=v1), jit(a=a2, b=b, v=v2)
    np.testing.assert_allclose(got[0], want[0]), np.testing.assert_allclose(got[1], want[1])
    assert (a1.is_deleted(), v1.is_deleted()) == (a2.is_deleted(), v2.is_deleted()) == (False, True)


def test_a_hoisted_and_donated_argument_leaves_the_others_hoisted():
    # named in both: it is passed as given on every call, and its new array each call did not
    # make the parameters look new (every call ran jax.jit's program, then the signature was
    # handed to it for good)
    opt = jaxrw.optimize(_decoder, hoist_argnums=(0, 1), donate_argnums=1)
    p = _params(60)
    for seed in range(62, 82):
        x = _r(seed, 4, 64)
        want = _decoder(p, x)
        np.testing.assert_allclose(opt(p, x), want, rtol=1e-4, atol=1e-5)
    (entry,) = opt._cache.values()
    assert entry.call.prologue_runs == 1 and entry.call.direct_runs == 0 and not entry.handed_off


@pytest.mark.parametrize(
    "opts, bound, called",
    [
        ({"hoist_argnames": "params"}, lambda p, x: ((p, x), {}), lambda x: ((x,), {})),
        ({"hoist_argnums": 0}, lambda p, x: ((), {"params": p, "x": x}), lambda x: ((), {"x": x})),
        ({"hoist_argnums": 0}, lambda p, x: ((p,), {"x": x}), lambda x: ((), {"x": x})),
    ],
    ids=["names-positional", "nums-keyword", "nums-mixed"],
)
def test_bind_takes_a_hoisted_argument_however_it_is_passed(opts, bound, called):
    p, x = _params(90), _r(92, 4, 64)
    args, kwargs = bound(p, x)
    f = jaxrw.optimize(_decoder, **opts).bind(*args, **kwargs)
    args, kwargs = called(_r(93, 4, 64))
    np.testing.assert_allclose(f(*args, **kwargs), _decoder(p, _r(93, 4, 64)), rtol=1e-4, atol=1e-5)


def test_bind_names_a_hoisted_argument_not_given():
    with pytest.raises(jaxrw.InvalidOptionError, match=r"hoisted arguments \['params'\] not given"):
        jaxrw.optimize(_decoder, hoist_argnames="params").bind(x=_r(94, 4, 64))


def test_bind_without_the_other_arguments_says_so():
    # bind(params) alone: the user's function raised its own "missing 1 required positional
    # argument" from inside jaxrw's trace
    with pytest.raises(jaxrw.InvalidOptionError, match=r"bind: missing .*'x'.*pass every argument once"):
        jaxrw.optimize(_decoder, hoist_argnums=0).bind(_params(95))


def test_bind_takes_the_arguments_of_a_wrapper_not_of_what_it_wraps():
    # functools.wraps points inspect.signature at the wrapped function: a decorator adding an
    # option was refused ("unexpected keyword argument 'scale'") where the call itself works
    def add_scale(fn):
        @functools.wraps(fn)
        def wrapper(params, x, scale=1.0):
            return fn(params, x) * scale

        return wrapper

    p, x = _params(96), _r(97, 4, 64)
    bound = jaxrw.optimize(add_scale(_decoder), hoist_argnums=0).bind(p, x, scale=2.0)
    np.testing.assert_allclose(bound(x, scale=2.0), 2.0 * _decoder(p, x), rtol=1e-4, atol=1e-5)


def test_a_signature_lowered_first_is_built_once_or_again_at_its_first_call_where_that_needs_arrays():
    a, b, v = _r(100, 64, 64), _r(101, 64, 64), _r(102, 64, 1)
    opt = jaxrw.optimize(_chain)
    opt.lower(a, b, v)
    opt(a, b, v)
    assert opt.traces == 1  # the lowering's build serves the calls
    # hoisting: a build under a trace has no concrete parameters to cache values for
    hoisted = jaxrw.optimize(_decoder, hoist_argnums=0)
    p, x = _params(103), _r(105, 4, 64)
    hoisted.lower(p, x)
    assert not hoisted._cache
    np.testing.assert_allclose(hoisted(p, x), _decoder(p, x), rtol=1e-4, atol=1e-5)
    (entry,) = hoisted._cache.values()
    assert isinstance(entry.call, HoistedCall) and entry.call.prologue_runs == 1


@pytest.mark.parametrize("strict", [False, True])
def test_a_rewritten_program_failing_in_a_lowering_falls_back_to_jax_jits(monkeypatch, strict):
    import jaxrw.rewrite.run as run

    real = run.decode

    def decode_failing_when_traced_again(*a, **k):
        fn, traced = real(*a, **k), []

        def program(*xs):
            traced.append(1)  # the build's own check traces it once
            if len(traced) > 1:
                raise RuntimeError("injected")
            return fn(*xs)

        return program

    monkeypatch.setattr(run, "decode", decode_failing_when_traced_again)
    a, b, v = _r(110, 64, 64), _r(111, 64, 64), _r(112, 64, 1)
    opt = jaxrw.optimize(_chain, strict=strict)
    if strict:
        with pytest.raises(jaxrw.RewriteStageError, match="injected"):
            opt.lower(a, b, v)
        return
    with pytest.warns(UserWarning, match="falling back to jax.jit.*injected"):
        text = opt.lower(a, b, v).as_text()
    assert _dot_results(text) == ["tensor<64x64xf32>", "tensor<64x1xf32>"]  # jax.jit's program
    np.testing.assert_allclose(opt(a, b, v), _chain(a, b, v), rtol=1e-4, atol=1e-4)


def test_report_and_explain_take_shapes_as_lower_does_and_the_call_reuses_that_build():
    a, b, v = _r(120, 96, 96), _r(121, 96, 96), _r(122, 96, 2)
    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    opt = jaxrw.optimize(_chain, static_argnames="scale", strict=True)
    from_shapes = opt.report(shape(a), b, v=shape(v), scale=2.0)  # shapes, arrays, keywords, statics
    assert opt.traces == 1 and from_shapes.rewritten
    np.testing.assert_allclose(opt(a, b, v=v, scale=2.0), _chain(a, b, v, scale=2.0), rtol=1e-4, atol=1e-4)
    assert opt.traces == 1  # the call reuses the build made from shapes
    from_arrays = jaxrw.optimize(_chain, static_argnames="scale").report(a, b, v=v, scale=2.0)
    assert from_shapes.cost_after == from_arrays.cost_after
    assert from_shapes.rules_fired == from_arrays.rules_fired
    ex = jaxrw.explain(_chain, shape(a), shape(b), shape(v))
    assert ex.status == "rewritten" and ex.signature[0].endswith("[96,96]")
    assert ex.jaxpr_after == jaxrw.explain(_chain, a, b, v).jaxpr_after
    with pytest.raises(jaxrw.InvalidOptionError, match=r"measure=True.*ShapeDtypeStruct.*measure=False"):
        jaxrw.explain(_chain, shape(a), b, v, measure=True)


def test_a_report_from_shapes_under_autotune_is_built_again_from_the_first_call():
    # autotune times candidates on arrays: a build from shapes has none, so the call builds again
    a, b, v = _r(127, 96, 96), _r(128, 96, 96), _r(129, 96, 2)
    opt = jaxrw.optimize(_chain, autotune=True)
    assert opt.report(*(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (a, b, v))).autotune is None
    np.testing.assert_allclose(opt(a, b, v), _chain(a, b, v), rtol=1e-4, atol=1e-4)
    assert opt.traces == 2 and opt.report(a, b, v).autotune is not None


def test_a_report_from_shapes_of_a_hoisting_function_is_built_again_from_the_first_call():
    hoisted = jaxrw.optimize(_decoder, hoist_argnums=0)
    p, x = _params(123), _r(124, 4, 64)
    shapes = jax.tree_util.tree_map(lambda t: jax.ShapeDtypeStruct(t.shape, t.dtype), (p, x))
    report = hoisted.report(*shapes)
    assert report.rewritten and not hoisted._cache  # no concrete parameters to keep values of
    np.testing.assert_allclose(hoisted(p, x), _decoder(p, x), rtol=1e-4, atol=1e-5)
    assert hoisted.report(p, x).cost_after == report.cost_after


def test_a_bound_function_names_a_bad_argument_as_jax_jit_names_it():
    def by_keyword(x, *, params):
        return _decoder(params, x)

    def named_values(params, values):  # named as the main jit's own first parameter
        return _decoder(params, values)

    p, x = _params(125), _r(126, 4, 64)
    with pytest.raises(TypeError, match=r"non-array argument") as by_jit:
        jax.jit(_decoder)(p, "text")
    assert "at path x." in str(by_jit.value)
    bound = [
        ("x.", jaxrw.optimize(_decoder, hoist_argnums=0).bind(p, x)),
        ("x.", jaxrw.optimize(by_keyword, hoist_argnames="params").bind(x, params=p)),
        ("fast[0].", jaxrw.optimize(named_values, hoist_argnums=0).bind(p, x)),  # not told apart
    ]
    for path, call in bound:
        np.testing.assert_allclose(call(x * 2), _decoder(p, x * 2), rtol=1e-4, atol=1e-5)
        with pytest.raises(TypeError, match=r"non-array argument") as by_jaxrw:
            call("text")
        assert f"at path {path}" in str(by_jaxrw.value)

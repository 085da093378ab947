"""Arrays split over devices along an inner axis (tensor-parallel layouts: column-split weights)
keep the program as written: the cost model prices no communication, and a rewrite there changed
output shardings, added collectives (0.4x of jax.jit on CPU devices) or built operands of
illegal sharding on Explicit meshes (a fallback). Split along the batch axis alone, rewritten
(a new user's try; docs/multi-gpu.md)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrw
from jaxrw.rewrite.run import StopReason

MESH = Mesh(np.array(jax.devices()[:4]), ("m",))


def _rand(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) / np.sqrt(s[0]) for s in shapes]


def _chain(x, A, B, v):
    return x @ A @ B @ v  # best as x @ (A @ (B @ v))


def _placed(specs, arrays):
    return [jax.device_put(a, NamedSharding(MESH, s)) for s, a in zip(specs, arrays, strict=True)]


@pytest.mark.parametrize(
    "specs",
    [(P(), P(), P("m"), P(None, "m")), (P(), P(None, "m"), P(), P())],
    ids=["v column-split", "A column-split"],
)
def test_a_tensor_parallel_call_is_kept_as_written_with_jax_jits_shardings(specs):
    args = _placed(specs, _rand(0, (64, 64), (64, 64), (64, 64), (64, 8)))
    opt = jaxrw.optimize(_chain, strict=True)
    got, want = opt(*args), jax.jit(_chain)(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
    report = opt.report(*args)
    assert not report.rewritten and report.stop_reason is StopReason.SHARDED
    assert "split 4 ways along axis 1" in report.guard_note


def test_a_batch_split_call_is_still_rewritten():
    x, A, B, v = _rand(1, (64, 64), (64, 64), (64, 64), (64, 8))
    x = jax.device_put(x, NamedSharding(MESH, P("m", None)))  # data parallel
    opt = jaxrw.optimize(_chain, strict=True)
    got = opt(x, A, B, v)
    exact = np.asarray(x, np.float64) @ np.asarray(A, np.float64) @ np.asarray(B, np.float64) @ np.asarray(v)
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4)
    assert opt.report(x, A, B, v).rewritten


def test_an_explicit_mesh_lora_layer_runs_without_a_fallback():
    # x@W + (x@A)@B factored built A@B of sharding (64@m, 64@m): decode failed, a fallback
    def lora(x, W, A, B):
        return x @ W + (x @ A) @ B

    mesh = jax.make_mesh(
        (4,), ("m",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:4]
    )
    x, W, A, B = _rand(2, (128, 64), (64, 64), (64, 8), (8, 64))
    with jax.set_mesh(mesh):
        W = jax.device_put(W, P(None, "m"))
        A = jax.device_put(A, P("m", None))
        B = jax.device_put(B, P(None, "m"))
        want = jax.jit(lora)(x, W, A, B)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = jaxrw.optimize(lora, strict=True)(x, W, A, B)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.sharding.spec == want.sharding.spec


def test_a_sharding_the_program_cannot_take_raises_jax_jits_error_once():
    # both operands split along the contracting axis of an Explicit mesh: jax.jit refuses it. The
    # error propagated, chained to jaxrw's failure on the same call ("During handling of the above
    # exception, another exception occurred"): the user read jax's message twice (a new user's audit)
    import traceback

    mesh = jax.make_mesh(
        (4,), ("m",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:4]
    )
    a, b, v = _rand(3, (8, 64), (64, 16), (16, 2))
    with jax.set_mesh(mesh):
        a, b = jax.device_put(a, P(None, "m")), jax.device_put(b, P("m", None))
        with pytest.raises(Exception) as jit_error:
            jax.jit(lambda a, b, v: (a @ b) @ v)(a, b, v)
        with pytest.raises(type(jit_error.value)) as raised:
            jaxrw.optimize(lambda a, b, v: (a @ b) @ v)(a, b, v)
    printed = "".join(traceback.format_exception(raised.value))
    assert "During handling" not in printed and "direct cause" not in printed


def test_a_function_with_a_debug_call_is_kept_too():
    # the program without its calls was rewritten again without the note (a review's repro)
    def printing(x, A, B, v):
        jax.debug.print("x {}", x.sum())
        return _chain(x, A, B, v)

    args = _placed((P(), P(None, "m"), P(), P()), _rand(3, (64, 64), (64, 64), (64, 64), (64, 8)))
    opt = jaxrw.optimize(printing, strict=True)
    np.testing.assert_allclose(opt(*args), jax.jit(printing)(*args), rtol=1e-5, atol=1e-5)
    report = opt.report(*args)
    assert not report.rewritten and report.stop_reason is StopReason.SHARDED


def test_a_mesh_axis_of_size_one_splits_nothing():
    # on an Explicit (4, 1) mesh, P('data', 'model') is data parallel: it was kept as tensor parallel
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    mesh = jax.make_mesh((4, 1), ("data", "model"), axis_types=explicit, devices=jax.devices()[:4])
    x, A, B, v = _rand(4, (64, 64), (64, 64), (64, 64), (64, 8))
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("data", "model"))
        opt = jaxrw.optimize(_chain, strict=True)
        got, want = opt(x, A, B, v), jax.jit(_chain)(x, A, B, v)
        assert opt.report(x, A, B, v).rewritten
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_explain_keeps_what_the_calls_keep():
    # explain's copy of the function lost the first call's note: it said "rewritten" (a review)
    args = _placed((P(), P(None, "m"), P(), P()), _rand(5, (64, 64), (64, 64), (64, 64), (64, 8)))
    opt = jaxrw.optimize(_chain)
    opt(*args)
    replicated = [jnp.ones((32, 64)), *_rand(6, (64, 64), (64, 64), (64, 8))]  # a new signature
    assert not opt.report(*replicated).rewritten
    assert opt.explain(*replicated).status == "kept"


def test_a_report_from_shapes_reads_their_shardings_and_the_call_keeps_jax_jits():
    # a tracer does not show a split placement: the report from ShapeDtypeStructs said rewritten,
    # and its build served the call, whose output lost jax.jit's column split
    args = _placed((P(), P(), P("m"), P(None, "m")), _rand(7, (64, 64), (64, 64), (64, 64), (64, 8)))
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in args]
    opt = jaxrw.optimize(_chain, strict=True)
    report = opt.report(*shapes)
    assert not report.rewritten and report.stop_reason is StopReason.SHARDED
    got, want = opt(*args), jax.jit(_chain)(*args)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)

"""Emission of a program's constants: left in the regions' code by default; with
JAXRW_BIND_CONSTANTS set, the large ones passed to the regions as packed buffers (bound to the
ThunkyProgram) and small ones left; results, memory and the dialect lowering."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from jaxrw.errors import InvalidOptionError
from jaxrw.rewrite.profiles import H200
from jaxrw.schedule import cuda_available, emit, lower_to_dialect, plan_program, thunky_available
from jaxrw.schedule.buffers import ARENA_ALIGN
from jaxrw.schedule.direct import DirectExecutor, ThunkyProgram
from jaxrw.schedule.emit import (
    BIND_CONSTANTS_VARIABLE,
    bind_constant_bytes,
    bound_constants,
    embedded_constant_bytes,
    pack_constants,
)
from jaxrw.schedule.timing import peak_bytes

from .programs import assert_matches_jit_directly

RNG = np.random.default_rng(0)
BIG = RNG.standard_normal((4, 128, 128)).astype(np.float32)  # 256 KiB: passed as a buffer
SMALL = RNG.standard_normal((8,)).astype(np.float32)  # 32 bytes: stays in the region's code
BIND_BYTES = 1 << 16


def _bind(monkeypatch) -> None:
    """Constants of BIND_BYTES or more passed as buffers for the test."""
    monkeypatch.setenv(BIND_CONSTANTS_VARIABLE, str(BIND_BYTES))


@pytest.fixture
def bind(monkeypatch):
    _bind(monkeypatch)


def _experts(x):
    """Four experts with closed-over weights, two independent branches of work."""
    ys = [jnp.tanh(x[i] @ BIG[i]) + jnp.asarray(SMALL).sum() for i in range(4)]
    return [jnp.stack(ys), x.sum(0) * 0.5]


def _plan(k: int = 2):
    specs = [jax.ShapeDtypeStruct((4, 16, 128), jnp.float32)]
    closed = jax.make_jaxpr(_experts)(*specs)
    return plan_program(closed, H200, streams=k), specs


def _call_jax_inputs(jaxpr) -> list[int]:
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "thunky.call_jax":
            found.append(len(eqn.invars))
        for body in eqn.params.values():  # nested bodies: thunky.jit, async_start, ...
            inner = getattr(body, "jaxpr", body)
            if hasattr(inner, "eqns"):
                found += _call_jax_inputs(inner)
    return found


@pytest.mark.parametrize("text, want", [("", None), (" ", None), ("65536", 65536), ("0", 0)])
def test_bind_setting_is_read_from_the_environment(text, want, monkeypatch):
    monkeypatch.setenv(BIND_CONSTANTS_VARIABLE, text)
    assert bind_constant_bytes() == want


@pytest.mark.parametrize("text", ["64k", "-1", "1.5", "yes"])
def test_bad_bind_setting_names_the_value_and_what_is_allowed(text, monkeypatch):
    monkeypatch.setenv(BIND_CONSTANTS_VARIABLE, text)
    want = rf"JAXRW_BIND_CONSTANTS must be a whole number.*got {re.escape(repr(text))}"
    with pytest.raises(InvalidOptionError, match=want):
        bind_constant_bytes()


def test_constants_stay_in_the_regions_code_by_default(monkeypatch):
    monkeypatch.delenv(BIND_CONSTANTS_VARIABLE, raising=False)
    plan, specs = _plan()
    assert bound_constants(plan) == []
    program = emit(plan)
    assert program.bound == () and program.bound_bytes == 0
    closed = jax.make_jaxpr(program)(*specs)
    assert not any(np.shape(c) == BIG[0].shape for c in closed.consts)  # not arguments either


def test_large_constants_are_bound_and_small_ones_stay(bind):
    plan, specs = _plan()
    bound = bound_constants(plan)
    sizes = sorted(np.asarray(plan.program.consts[c]).nbytes for c in bound)
    assert sizes and all(s >= BIND_BYTES for s in sizes)
    assert sum(sizes) >= BIG.nbytes  # BIG (or the slices of it the program reads) is bound
    program = emit(plan)
    # one float32 pack holds them all, each 256-byte aligned: the call takes one buffer, not four
    assert len(program.bound) == 1 and program.bound[0].dtype == jnp.float32
    assert sum(sizes) <= program.bound_bytes < sum(sizes) + len(sizes) * ARENA_ALIGN
    small = [c for c in plan.program.consts if c not in bound]
    assert small and all(np.asarray(plan.program.consts[c]).nbytes < BIND_BYTES for c in small)


def test_embedded_constant_bytes_counts_what_the_regions_compile_in(monkeypatch):
    monkeypatch.delenv(BIND_CONSTANTS_VARIABLE, raising=False)
    plan, _ = _plan()
    everything = embedded_constant_bytes(plan)
    assert everything >= BIG.nbytes  # BIG (or its slices) and SMALL, all in the regions' code
    _bind(monkeypatch)
    left = embedded_constant_bytes(plan)  # the small ones only
    assert left == everything - sum(np.asarray(plan.program.consts[c]).nbytes for c in bound_constants(plan))
    assert 0 < left < BIND_BYTES


def test_regions_read_bound_constants_as_buffers(bind):
    plan, specs = _plan()
    bound = set(bound_constants(plan))
    closed = jax.make_jaxpr(emit(plan))(*specs)
    counts = _call_jax_inputs(closed.jaxpr)
    assert len(counts) == len(plan.regions)
    prog = plan.program
    want = sum(
        len(r.reads)
        + len(r.writes)
        + len({a for i in r.ops for a in prog.ops[i].ins if isinstance(a, int) and a in bound})
        for r in plan.regions
    )
    assert sum(counts) == want
    # the pack is an argument of the traced program, not constants hidden in a region
    packed = emit(plan).bound[0]
    assert any(np.shape(c) == packed.shape for c in closed.consts)
    assert not any(np.shape(c) == np.shape(plan.program.consts[b]) for c in closed.consts for b in bound)


def test_packs_hold_each_constant_aligned_and_by_dtype():
    rng = np.random.default_rng(1)
    consts = {
        3: rng.standard_normal((5, 7)).astype(np.float32),
        1: rng.standard_normal((3,)).astype(jnp.bfloat16),
        8: rng.standard_normal((2, 3, 4)).astype(np.float32),
        2: np.arange(9, dtype=np.int32).reshape(3, 3),
    }
    packs = pack_constants(consts, [1, 2, 3, 8])
    assert [a.dtype for a in packs.arrays] == [jnp.bfloat16, np.int32, np.float32]  # first use
    spans = {}
    for c, (i, offset, shape) in packs.where.items():
        array = packs.arrays[i]
        assert (offset * array.dtype.itemsize) % ARENA_ALIGN == 0 and shape == consts[c].shape
        got = array[offset : offset + consts[c].size].reshape(shape)
        np.testing.assert_array_equal(got, consts[c])
        spans.setdefault(i, []).append((offset, offset + consts[c].size))
    for ranges in spans.values():  # no two constants of a pack overlap
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert pack_constants(consts, []).arrays == []


@pytest.mark.parametrize("bound", [False, True])
def test_emitted_program_lowers_to_the_dialect(bound, monkeypatch):
    if bound:
        _bind(monkeypatch)
    plan, specs = _plan(k=2)
    text = lower_to_dialect(plan, specs, compile_regions=True)
    assert "func.func @main" in text and text.count("thunky.async_start") == sum(
        s.kind == "start" for s in plan.steps
    )
    outs = jax.eval_shape(emit(plan), *specs)
    want = jax.eval_shape(_experts, *specs)
    assert [(o.shape, o.dtype) for o in outs] == [(w.shape, w.dtype) for w in want]


def _effectful_with_weights(x, w):
    io_callback(lambda: None, None, ordered=False)  # as a thunky program: no C++ fast path
    return [jnp.tanh(x @ w)]


def test_bound_arrays_are_appended_to_every_call_and_direct_calls():
    w = jnp.asarray(BIG[0])
    program = ThunkyProgram(jax.jit(_effectful_with_weights), bound=[w])
    x = jnp.asarray(RNG.standard_normal((16, 128)).astype(np.float32))
    want = np.tanh(np.asarray(x, np.float64) @ np.asarray(w, np.float64))
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(program(x)[0], np.float64), want, rtol=1e-4, atol=1e-5)
    assert isinstance(program._direct, DirectExecutor)
    # the bound array was checked once, when the executor was built; each call checks x alone
    assert program._direct._checked == program._direct._signature[:1]
    traced = jax.jit(lambda a: program(a)[0])(x)  # under a trace: the jitted function, same values
    np.testing.assert_allclose(np.asarray(traced, np.float64), want, rtol=1e-4, atol=1e-5)
    assert program.lower(x).compile() is not None


def test_peak_memory_leaves_out_bound_constants_as_jax_jit_leaves_out_its_own():
    w = jnp.asarray(BIG[0])
    x = jnp.asarray(RNG.standard_normal((16, 128)).astype(np.float32))
    program = ThunkyProgram(jax.jit(_effectful_with_weights), bound=[w])
    closed_over = jax.jit(lambda a: [jnp.tanh(a @ w)])
    got, base = peak_bytes(program, [x]), peak_bytes(closed_over, [x])
    assert got is not None and got == base  # x and the output; w counted in neither
    assert program.bound_bytes == w.nbytes


@pytest.mark.skipif(not (cuda_available() and thunky_available()), reason="needs CUDA and thunky")
@pytest.mark.gpu
@pytest.mark.parametrize("bound", [False, True])
def test_emitted_constants_give_jax_jit_results_on_gpu(bound, monkeypatch):
    if bound:
        _bind(monkeypatch)
    plan, specs = _plan(k=2)
    x = jnp.asarray(RNG.standard_normal((4, 16, 128)).astype(np.float32))
    assert_matches_jit_directly(emit(plan), _experts, [x], rtol=1e-5, atol=1e-5)

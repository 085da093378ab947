"""Failure isolation: an exception injected into any stage falls back to jax.jit with exactly one
warning naming the stage and the cause; strict=True raises a JaxrwError subclass instead."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
import jaxrw.schedule
from jaxrw.errors import JaxrwError, RewriteStageError
from jaxrw.rewrite import run


def _boom(*args, **kwargs):
    raise RuntimeError("injected fault")


def _decoded_fn_that_fails(*args, **kwargs):
    def fn(*xs):
        raise RuntimeError("injected fault")

    return fn


def _decoded_fn_wrong_type(*args, **kwargs):
    def fn(*xs):
        return [xs[0].astype(jnp.bfloat16)]  # the wrong dtype and shape for a @ b + a @ c

    return fn


# (stage, module, attribute to replace, replacement). Each replacement raises inside that stage.
FAULTS = [
    ("encode", run, "encode", _boom),
    ("rewrite", run, "saturate", _boom),
    ("extract", run, "node_costs", _boom),
    ("decode", run, "decode", _boom),
    ("decode", run, "decode", _decoded_fn_that_fails),  # the decoded program fails when traced
    ("schedule", jaxrw.schedule, "schedule_selection", _boom),
]
IDS = [f"{stage}-{fault.__name__}" for stage, _, _, fault in FAULTS]


def _program():
    def f(a, b, c):
        return jnp.tanh(a @ b + a @ c)  # factoring rewrites it, so every stage runs

    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal((16, 16)).astype(np.float32)) for _ in range(3)]
    return f, args


def _jaxrw_warnings(record):
    return [w for w in record if "jaxrw" in str(w.message)]


def _expect_one_fallback(opt, f, args, stage, cause):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = opt(*args)
        out2 = opt(*args)  # the cached fallback warns no more
    msgs = [str(w.message) for w in _jaxrw_warnings(record)]
    assert len(msgs) == 1, msgs
    # it points at the caller's line (a fixed stacklevel pointed inside jaxrw on the fast path)
    assert _jaxrw_warnings(record)[0].filename == __file__
    assert "falling back to jax.jit" in msgs[0] and f"{stage} stage failed" in msgs[0] and cause in msgs[0]
    want = jax.jit(f)(*args)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(want))


def test_the_program_is_rewritten_without_faults():
    f, args = _program()
    opt = jaxrw.optimize(f, strict=True, limits=jaxrw.Limits(min_gain=0))
    rep = opt.report(*args)
    assert rep.rewritten and rep.rules_fired  # so the faults below hit a pipeline that runs to decode


@pytest.mark.parametrize("stage, module, attr, fault", FAULTS, ids=IDS)
def test_fault_in_stage_falls_back_with_one_warning(monkeypatch, stage, module, attr, fault):
    monkeypatch.setattr(module, attr, fault)
    f, args = _program()
    opt = jaxrw.optimize(f, limits=jaxrw.Limits(min_gain=0))
    _expect_one_fallback(opt, f, args, stage, "injected fault")


@pytest.mark.parametrize("stage, module, attr, fault", FAULTS, ids=IDS)
def test_every_stage_that_fell_back_has_a_report_saying_why(monkeypatch, stage, module, attr, fault):
    # a fault while the program was built (encode..decode) left report() returning None; one in
    # the schedule stage, after the rewrite, left it saying "rewritten" while calls ran jax.jit
    monkeypatch.setattr(module, attr, fault)
    f, args = _program()
    opt = jaxrw.optimize(f, limits=jaxrw.Limits(min_gain=0))
    with pytest.warns(UserWarning, match="falling back"):
        rep = opt.report(*args)
    assert f"{stage} stage failed" in rep.fallback and "injected fault" in rep.fallback
    assert not rep.rewritten and rep.schedule == "jax.jit: fallback" and rep.n_equations > 0
    assert rep.to_dict()["fallback"] == rep.fallback and "fell back to jax.jit" in rep.guard_note
    assert "fell back to jax.jit" in repr(rep) and "injected fault" in repr(rep)
    if stage != "schedule":  # the schedule stage runs after the rewrite, which stopped as usual
        assert rep.stop_reason is jaxrw.StopReason.FAILED


@pytest.mark.parametrize("stage, module, attr, fault", FAULTS, ids=IDS)
def test_fault_in_stage_raises_under_strict(monkeypatch, stage, module, attr, fault):
    monkeypatch.setattr(module, attr, fault)
    f, args = _program()
    opt = jaxrw.optimize(f, strict=True, limits=jaxrw.Limits(min_gain=0))
    with pytest.raises(RewriteStageError, match="injected fault") as info:
        opt(*args)
    assert isinstance(info.value, JaxrwError)
    assert info.value.stage == stage and isinstance(info.value.cause, RuntimeError)


def test_a_decoded_program_of_the_wrong_type_is_refused(monkeypatch):
    monkeypatch.setattr(run, "decode", _decoded_fn_wrong_type)
    f, args = _program()
    _expect_one_fallback(jaxrw.optimize(f, limits=jaxrw.Limits(min_gain=0)), f, args, "decode", "differ")
    with pytest.raises(RewriteStageError, match="differ"):
        jaxrw.optimize(f, strict=True, limits=jaxrw.Limits(min_gain=0))(*args)


def test_a_failing_cost_model_is_an_extract_fault():
    class Broken:
        name = "broken"

        def node_cost(self, node, view):
            raise ZeroDivisionError("injected fault")

    f, args = _program()
    _expect_one_fallback(jaxrw.optimize(f, cost_model=Broken()), f, args, "extract", "injected fault")


def test_a_failing_extractor_is_an_extract_fault(monkeypatch):
    monkeypatch.setitem(jaxrw.rewrite.extract.EXTRACTORS, "faulty", _boom)
    f, args = _program()
    _expect_one_fallback(jaxrw.optimize(f, extractor="faulty"), f, args, "extract", "injected fault")


def test_a_fault_when_the_program_runs_falls_back(monkeypatch):
    """The decoded program passes its abstract check but fails in its first run."""
    real = run.decode

    def fail(x):
        raise RuntimeError("injected fault")

    def decode_failing_at_run_time(*a, **k):
        fn = real(*a, **k)

        def program(*xs):
            outs = fn(*xs)
            return [jax.pure_callback(fail, jax.ShapeDtypeStruct(o.shape, o.dtype), o) for o in outs]

        return program

    monkeypatch.setattr(run, "decode", decode_failing_at_run_time)
    f, args = _program()
    opt = jaxrw.optimize(f, limits=jaxrw.Limits(min_gain=0))
    _expect_one_fallback(opt, f, args, "compile", "injected")
    # every call runs jax.jit now: the reports say so (they said "rewritten"), a new signature's too
    rep = opt.report(*args)
    assert opt._fast_state == "broken" and not rep.rewritten and "injected" in rep.guard_note
    other = opt.report(*(np.tile(a, (2, 2)) for a in args))
    assert not other.rewritten and "earlier call" in other.guard_note
    with pytest.raises(RewriteStageError, match="injected") as info:
        jaxrw.optimize(f, strict=True, limits=jaxrw.Limits(min_gain=0))(*args)
    assert info.value.stage == "compile"


def _saturate_raising(monkeypatch, exc: BaseException):
    """An optimized a@a + a@a whose saturation raises `exc`, and its input."""
    import jaxrw.rewrite.run as run_mod

    def raising(*a, **k):
        raise exc

    monkeypatch.setattr(run_mod, "saturate", raising)
    return jaxrw.optimize(lambda a: a @ a + a @ a), jnp.ones((4, 4))


def test_a_rust_panic_in_egglog_falls_back(monkeypatch):
    """pyo3 turns a Rust panic into PanicException, a BaseException: it must not escape."""

    class FakePanic(BaseException):
        pass

    opt, a = _saturate_raising(monkeypatch, FakePanic("called `Option::unwrap()` on a `None` value"))
    with pytest.warns(UserWarning, match="rewrite stage failed: FakePanic"):
        out = opt(a)
    np.testing.assert_allclose(out, 2 * (a @ a))


def test_a_deadline_interrupt_inside_a_stage_is_passed_on(monkeypatch):
    """An Interrupt (the bench's optimization deadline) raised while a stage runs is not a stage
    failure: it reaches the caller instead of turning into a fallback."""
    from jaxrw.errors import Interrupt

    class Deadline(Interrupt):
        pass

    opt, a = _saturate_raising(monkeypatch, Deadline("optimization exceeded 1 s"))
    with pytest.raises(Deadline):
        opt.report(a)

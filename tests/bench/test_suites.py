"""Every benchmark case builds and runs at the small size under jax.jit, jaxrw and its hand-optimized
version, and each agrees with a float64 reference: the suites measure equivalent programs."""

from __future__ import annotations

import os

import jax
import pytest

from jaxrw.bench.case import CASES, SUITES, abstract_inputs, load_suites
from jaxrw.bench.runner import Options, run_case

load_suites()
QUICK = dict(repeats=1, sample_s=1e-4, warmup=0, in_jit=False)
SLOW = os.environ.get("JAXRW_SLOW_TESTS", "") not in ("", "0")


def _check(rec: dict) -> None:
    assert rec["status"] == "ok", rec.get("traceback") or rec["error"]
    v, tol = rec["variants"], rec["tolerance"]
    # the case itself is sound: jax.jit matches float64 within the dtype's tolerance
    assert v["jax.jit"]["rel_err"] <= tol, f"jax.jit vs float64: {v['jax.jit']['rel_err']:.3g} > {tol}"
    # the hand-optimized version computes the same function
    if "hand" in v:
        assert v["hand"]["rel_err"] <= tol, f"hand vs float64: {v['hand']['rel_err']:.3g} > {tol}"
    assert "jaxrw" in v, "; ".join(rec["notes"])
    assert v["jaxrw"]["rel_err"] <= max(tol, 2 * v["jax.jit"]["rel_err"]), v["jaxrw"]["rel_err"]
    assert rec["numerics_ok"]
    for name in v:
        assert v[name]["samples_s"] and all(s > 0 for s in v[name]["samples_s"])


def test_every_suite_has_cases():
    for suite in SUITES:
        assert [c for c in CASES.values() if c.suite == suite], suite


# A model case costs seconds here (optimization plus five compilations), so by default three
# representative models (and the cheaper streams cases) run under jaxrw; the others are checked
# under jax.jit and their hand-optimized versions against float64. JAXRW_SLOW_TESTS=1 runs every
# case under jaxrw (about 70 s more).
EXPENSIVE = ("small_decoders", "experts_mixed_64")
UNDER_JAXRW = ("nasrnn_const", "llama288", "gpt2_small")
FAST = [
    n
    for n, c in CASES.items()
    if not c.heavy and n not in EXPENSIVE and (c.suite != "models" or n in UNDER_JAXRW)
]
# a *_hoist case is its base case plus an optimize() option: the same jax.jit, hand and reference
REFERENCE_ONLY = [n for n in CASES if n not in FAST and not n.endswith("_hoist")]
BF16 = ["chain_mv", "trace_product", "ew_exp_log", "gated_mlp_args"]


@pytest.mark.parametrize("name", FAST)
def test_case_float32(name: str):
    _check(run_case(CASES[name], Options(size="small", dtype="float32", **QUICK)))


@pytest.mark.parametrize("name", BF16)
def test_case_bfloat16(name: str):
    _check(run_case(CASES[name], Options(size="small", dtype="bfloat16", **QUICK)))


@pytest.mark.parametrize("name", REFERENCE_ONLY)
def test_case_reference(name: str):
    """jax.jit and the hand-optimized version agree with float64 (jaxrw itself: slow tests)."""
    rec = run_case(CASES[name], Options(size="small", dtype="float32", jaxrw=False, **QUICK))
    assert rec["status"] == "ok", rec.get("traceback") or rec["error"]
    v, tol = rec["variants"], rec["tolerance"]
    assert v["jax.jit"]["rel_err"] <= tol
    assert "hand" not in v or v["hand"]["rel_err"] <= tol
    assert "jaxrw" not in v and rec["speedup"] is None


@pytest.mark.skipif(
    not SLOW, reason="optimizes every model fully (minutes on 2 cores); set JAXRW_SLOW_TESTS=1"
)
@pytest.mark.parametrize("name", [n for n in CASES if n not in FAST])
def test_case_full(name: str):
    _check(run_case(CASES[name], Options(size="small", dtype="float32", opt_timeout_s=0, **QUICK)))


def test_large_instances_build_lazily():
    """Large sizes are only built on demand; asking for an unknown size or dtype names the valid set."""
    from jaxrw.errors import InvalidOptionError

    case = CASES["chain_mv"]
    with pytest.raises(InvalidOptionError, match=r"'huge'.*\['small', 'large'\]"):
        case.instance("huge", "float32")
    with pytest.raises(InvalidOptionError, match=r"'float16'.*bfloat16"):
        case.instance("small", "float16")


@pytest.mark.parametrize("name", list(CASES))
def test_large_config_traces(name: str):
    """The large (GPU) configuration of every case builds and traces (abstractly: nothing is
    allocated), and its hand-optimized version returns the same shapes and dtypes."""
    case = CASES[name]

    def build():
        inst = case.instance("large", "float32")
        args = inst.args(1)
        out = inst.fn(*args)
        hand = inst.hand(*(inst.hand_prep(args) if inst.hand_prep else args)) if inst.hand else out
        return out, hand

    with abstract_inputs():
        out, hand = jax.eval_shape(build)
    assert jax.tree.structure(out) == jax.tree.structure(hand)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(hand), strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)


@pytest.mark.parametrize("name", ["llama288", "gpt_train_step"])
def test_the_reference_computes_in_float64_throughout(name: str):
    # the rope angle and AdamW's step count were float32 even in the float64 reference
    from jaxrw.bench.runner import _x64

    inst = CASES[name].instance("small", "float32")
    with _x64():
        up = jax.tree.map(lambda a: a.astype("float64") if a.dtype == "float32" else a, inst.args(0))
        types = {str(v.aval.dtype) for e in jax.make_jaxpr(inst.fn)(*up).eqns for v in e.outvars}
    assert "float32" not in types, types

"""No code runs from data: the package never evaluates generated source or unpickles, and what it
reads back (autotune cache, device profiles, fuzz regressions) is validated JSON, never trusted.
(tests/rewrite/test_autotune.py and test_profiles.py cover the unparsable-file cases.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
import jaxrw.rewrite.autotune as at
from jaxrw.bench.fuzzprog import build
from jaxrw.rewrite import profiles

PACKAGE = Path(jaxrw.__file__).parent
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "yaml"}


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if ".venv" not in p.parts)


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_eval_exec_or_unpickling(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {node.func.id}()"
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
            assert not names & FORBIDDEN_MODULES, f"{path.name}:{node.lineno} imports {names}"
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[0] not in FORBIDDEN_MODULES, f"{path.name}:{node.lineno}"
        if isinstance(node, ast.Call) and _called(node) == "import_module":
            arg = node.args[0] if node.args else None  # modules are named in the source, not by data
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), f"{path.name}:{node.lineno}"
        if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
            assert isinstance(node.value, ast.Constant) and node.value.value is False


# --- the autotune cache ----------------------------------------------------------------------------


@pytest.fixture
def tune_env(tmp_path, monkeypatch):
    """A private cache dir, one fixed program key, and fake timings (the original always slowest)."""
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(at, "program_key", lambda closed, extra="": "K")
    timed = []

    def fake_timing(fns, args, **kw):
        timed.append(sorted(fns))
        return {
            name: SimpleNamespace(median=1.0 if name == at.ORIGINAL else 0.5 + i)
            for i, name in enumerate(fns)
        }

    monkeypatch.setattr(at, "time_interleaved", fake_timing)
    return tmp_path / "autotune.json", timed


def _tuned(seed=0):
    rng = np.random.default_rng(seed)
    A, B, v = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((64, 64), (64, 64), (64, 4)))
    f = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, autotune=True)
    out = f(A, B, v)
    np.testing.assert_allclose(out, (A @ B) @ v, rtol=1e-3, atol=1e-2)
    return f.report(A, B, v)


def test_a_forged_winner_is_not_trusted(tune_env):
    path, timed = tune_env
    path.write_text(json.dumps({"K": {"winner": "f00dfeedf00dfeed", "times": {}}}))
    rep = _tuned()
    assert timed and not rep.autotune["cached"]  # measured again
    assert json.loads(path.read_text())["K"]["winner"] == rep.autotune["winner"] != "f00dfeedf00dfeed"


@pytest.mark.parametrize(
    "content",
    [
        json.dumps(["K", {"winner": "original"}]),  # not an object
        json.dumps({"K": {"winner": 5}}),  # a winner that is not a name
        json.dumps({"K": "original"}),  # an entry that is not an object
        json.dumps({"K": {"times": {}}}),  # no winner
    ],
)
def test_a_cache_of_the_wrong_shape_is_ignored_with_a_warning(tune_env, content):
    path, timed = tune_env
    path.write_text(content)
    with pytest.warns(UserWarning, match="ignoring corrupted autotune cache"):
        rep = _tuned()
    assert timed and not rep.autotune["cached"]
    assert isinstance(json.loads(path.read_text())["K"]["winner"], str)  # rewritten, valid


# --- device profiles ------------------------------------------------------------------------------

GOOD = {"name": "p", "kind": "cpu", "matmul_flops": {"float32": 1e11}, "vector_flops": 1e10,
        "bandwidth": 1e10, "launch_s": 1e-6}  # fmt: skip


@pytest.mark.parametrize(
    "data",
    [
        [GOOD],
        {**GOOD, "bandwidth": float("nan")},
        {**GOOD, "matmul_flops": {"float32": "fast"}},
        {**GOOD, "matmul_flops": ["float32", 1e11]},
        {**GOOD, "launch_s": 5.0},
        {**GOOD, "gemm_efficiency": {"x": 0.5}},
    ],
    ids=["list", "nan", "string-rate", "list-rates", "launch", "bad-bucket"],
)
def test_a_malformed_profile_is_never_used(tmp_path, monkeypatch, data):
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    (tmp_path / "profile-cpu.json").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="ignoring malformed profile"):
        assert profiles.default_profile("cpu") is profiles.CPU


def test_a_valid_saved_profile_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    (tmp_path / "profile-cpu.json").write_text(json.dumps(GOOD))
    assert profiles.default_profile("cpu").bandwidth == 1e10


# --- fuzz regressions -----------------------------------------------------------------------------


def test_a_spec_can_name_only_interpreter_operations():
    spec = {
        "values": [["in", [], {"shape": [2], "dtype": "float32"}], ["__class__", [0], {}]],
        "outputs": [1],
    }
    with pytest.raises(ValueError, match="unknown operation '__class__'"):
        build(spec)(jnp.ones(2))

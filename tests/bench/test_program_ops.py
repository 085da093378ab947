"""report.program_ops (the bench diagnostics' count of equations per primitive) and
bench/decisions_cpu.py's option variants, on this CPU."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.bench.report import program_ops
from jaxrw.rewrite.profiles import H200


def _decisions_script():
    path = Path(__file__).resolve().parents[2] / "bench" / "decisions_cpu.py"
    spec = importlib.util.spec_from_file_location("decisions_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_program_ops_counts_what_the_optimized_function_runs():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32))
    opt = jaxrw.optimize(lambda x, a, b: x @ a + x @ b, schedule="xla")
    opt.report(x, x + 1, x - 1)
    ops = program_ops(opt, (x, x + 1, x - 1))
    assert ops["dot_general"] == 1 and ops["add"] == 1  # factored: x @ (a + b)
    kept = jaxrw.optimize(lambda x: jnp.tanh(x), schedule="xla")
    kept.report(x)
    assert program_ops(kept, (x,)) == {"tanh": 1}


def test_program_ops_is_none_where_jaxrw_fell_back():
    opt = jaxrw.optimize(lambda x: x * 2, rules="no-such-rule")  # an error at build: jax.jit runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.report(jnp.ones(4))
    assert program_ops(opt, (jnp.ones(4),)) is None


def test_decision_variants_name_a_field_of_limits_or_of_the_profile():
    script = _decisions_script()
    assert script._options("default", "h200") == {"profile": H200}
    assert script._options("iterations=48", "h200")["limits"] == {"iterations": 48}
    assert script._options("concat_chains=off", "h200")["profile"].concat_chains is False
    assert script._options("bandwidth=2e12", "h200")["profile"].bandwidth == 2e12
    with pytest.raises(SystemExit, match="not a field"):
        script._options("no_such=1", "h200")

"""Differential fuzzing: random well-typed programs through `optimize` agree with jax.jit.

300 examples per run (derandomized, so CI is reproducible); `make fuzz` runs 10,000. A failure
is shrunk by hypothesis to a minimal spec: add it to tests/fuzz/regressions.json.
"""

from __future__ import annotations

import json

import jax
from hypothesis import HealthCheck, given, settings

from jaxrw.bench.fuzz import check
from jaxrw.bench.fuzzgen import programs

settings.register_profile(
    "jaxrw-fuzz",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)
FUZZ = settings.get_profile("jaxrw-fuzz")


def _assert_ok(spec: dict) -> None:
    out = check(spec)
    assert out.status == "ok", (
        f"{out.status}: {out.message}\nspec = {json.dumps(spec)}\n"
        "(add this spec to tests/fuzz/regressions.json once fixed)"
    )


@settings(FUZZ, max_examples=270)
@given(programs(max_steps=5))
def test_optimize_agrees_with_jit(spec):
    _assert_ok(spec)


@settings(FUZZ, max_examples=30)
@given(programs(max_steps=5, dtypes=("float64", "int32")))
def test_optimize_agrees_with_jit_in_float64(spec):
    with jax.enable_x64(True):
        _assert_ok(spec)

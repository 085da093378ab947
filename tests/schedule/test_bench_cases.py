"""Plans of every jaxrw.bench case (small size): valid, emitted programs trace; the streams suite
(the scheduler's own workloads) also simulates to jax's result where it is quick to."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite.profiles import H200
from jaxrw.schedule import check, emit, plan_program, simulate
from jaxrw.schedule.plan import ScheduleError

bench = pytest.importorskip("jaxrw.bench.case")

try:
    CASES = [c for c in bench.select("all") if "float32" in c.dtypes]
except Exception as e:  # noqa: BLE001 - the suites are another module's; skip if they do not load
    CASES = []
    REASON = f"jaxrw.bench cases unavailable: {type(e).__name__}: {e}"
else:
    REASON = "no bench cases"


def _flat(case):
    inst = case.instance("small", "float32")
    args = inst.args(0)
    leaves, tree = jax.tree_util.tree_flatten(args)

    def fn(*xs):
        return jax.tree_util.tree_leaves(inst.fn(*jax.tree_util.tree_unflatten(tree, xs)))

    return fn, leaves


@pytest.mark.skipif(not CASES, reason=REASON)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bench_case_plans_validate_and_trace(case):
    fn, leaves = _flat(case)
    specs = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*specs)
    if closed.effects:  # jax.debug calls: such a program runs under XLA's schedule, never planned
        with pytest.raises(ScheduleError, match="programs with effects cannot be scheduled"):
            plan_program(closed, H200)
        return
    for k in (1, 4):
        plan = plan_program(closed, H200, streams=k)
        check(plan)
    text = str(jax.make_jaxpr(emit(plan))(*specs))
    assert text.count("thunky.call_jax") == len(plan.regions)
    if case.suite == "streams" and len(closed.jaxpr.eqns) <= 120:  # bigger ones take long on a CPU
        want = [np.asarray(w) for w in fn(*leaves)]
        for g, w in zip(simulate(plan, leaves, seed=0, jit=True), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

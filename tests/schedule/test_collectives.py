"""Collective plans of shard_map programs on 4 virtual CPU devices, and the validator's checks.

The plans match their jaxprs (collective kinds, participants, ring bytes); the validator accepts
them, and catches each mutation that would break a multi-GPU run: collectives swapped on one device
(NCCL deadlock), a consumer moved before its collective's done, a buffer reused under an in-flight
collective. No run on the devices is compared: plans are not emitted (no multi-GPU CUDA here).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrw.errors import JaxrwError
from jaxrw.schedule.collective_checks import check, validate
from jaxrw.schedule.collectives import (
    KINDS,
    CollectiveError,
    LinkCosts,
    live_ranges,
    plan_collectives,
)
from jaxrw.schedule.plan import ScheduleError, Step

N = 4
EXAMPLES = int(os.environ.get("JAXRW_HYPOTHESIS_EXAMPLES", "12"))
pytestmark = pytest.mark.skipif(
    len(jax.devices()) < N, reason=f"needs {N} virtual devices (XLA_FLAGS from tests/conftest.py)"
)
RING = [(i, (i + 1) % N) for i in range(N)]
F32 = 4


def _mesh():
    return jax.make_mesh((N,), ("x",))


def _put(mesh, shape, spec, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jax.device_put(x, NamedSharding(mesh, spec))


def _smap(body, mesh, in_specs, out_specs):
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def _body_collectives(fn, *args):
    """Collective primitives of the shard_map body, straight from the jaxpr: (name, in bytes, out bytes)."""
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "shard_map"]

    def nbytes(vs):
        return sum(int(np.prod(v.aval.shape)) * v.aval.dtype.itemsize for v in vs)

    return [
        (e.primitive.name, nbytes(e.invars), nbytes(e.outvars))
        for e in eqn.params["jaxpr"].eqns
        if e.primitive.name in KINDS
    ]


# -- programs: each returns (fn, args) ------------------------------------------------------------


def row_parallel(mesh):
    """x @ W with the contraction dimension sharded, then psum of the partial products."""
    fn = _smap(lambda x, w: jax.lax.psum(x @ w, "x"), mesh, (P(None, "x"), P("x", None)), P())
    return fn, (_put(mesh, (8, 16), P(None, "x")), _put(mesh, (16, 8), P("x", None), 1))


def gather_matmul(mesh):
    fn = _smap(
        lambda x, w: jax.lax.all_gather(x, "x", tiled=True) @ w, mesh, (P("x", None), P()), P("x", None)
    )
    return fn, (_put(mesh, (64, 8), P("x", None)), _put(mesh, (8, 8), P(), 1))


def scatter(mesh):
    fn = _smap(
        lambda x, w: jax.lax.psum_scatter(x @ w, "x", scatter_dimension=0, tiled=True),
        mesh,
        (P(None, "x"), P("x", None)),
        P("x", None),
    )
    return fn, (_put(mesh, (8, 16), P(None, "x")), _put(mesh, (16, 8), P("x", None), 1))


def ring_step(mesh):
    fn = _smap(lambda x: jax.lax.ppermute(x * 2.0, "x", RING) + 1.0, mesh, (P("x"),), P("x"))
    return fn, (_put(mesh, (64,), P("x")),)


def overlap(mesh):
    """psum of a matmul, with an independent matmul chain that can run while the psum is in flight."""

    def body(a, w, b, v):
        y = jax.lax.psum(a @ w, "x")
        u = jnp.tanh(b @ v) @ v
        return y + u

    specs = (P(None, "x"), P("x", None), P(), P())
    args = (
        _put(mesh, (8, 16), P(None, "x")),
        _put(mesh, (16, 8), P("x", None), 1),
        _put(mesh, (8, 8), P(), 2),
        _put(mesh, (8, 8), P(), 3),
    )
    return _smap(body, mesh, specs, P()), args


PROGRAMS = {"row_parallel": row_parallel, "gather_matmul": gather_matmul, "scatter": scatter}
PROGRAMS |= {"ring_step": ring_step, "overlap": overlap}

# a random program: branches of (a * k) @ w, each followed by one collective and a compute consumer
OPS = {
    "psum": lambda y: jax.lax.psum(y, "x"),
    "all_gather": lambda y: jax.lax.all_gather(y, "x", tiled=True),
    "psum_scatter": lambda y: jax.lax.psum_scatter(y, "x", tiled=True),
    "ppermute": lambda y: jax.lax.ppermute(y, "x", RING),
    "all_to_all": lambda y: jax.lax.all_to_all(y, "x", 0, 0, tiled=True),
}
# kind and bytes each device sends, for a local (8, 8) float32 operand (256 bytes), ring formulas
EXPECT = {
    "psum": ("all_reduce", 2 * (N - 1) / N * 256),
    "all_gather": ("all_gather", (N - 1) / N * 256 * N),
    "psum_scatter": ("reduce_scatter", (N - 1) / N * 256),
    "ppermute": ("ppermute", 256),
    "all_to_all": ("all_to_all", (N - 1) / N * 256),
}


def branches(mesh, names):
    def body(a, w):
        return tuple(jnp.tanh(OPS[n]((a * (i + 1.0)) @ w)).sum(0, keepdims=True) for i, n in enumerate(names))

    fn = _smap(body, mesh, (P(None, "x"), P("x", None)), tuple(P("x") for _ in names))
    return fn, (_put(mesh, (8, 8 * N), P(None, "x")), _put(mesh, (8 * N, 8), P("x", None), 1))


def _flat(make, *extra):
    fn, args = make(_mesh(), *extra)
    return (fn, *args)


def _copy(plan):
    new = dataclasses.replace(plan, lanes=dict(plan.lanes))
    for d, lane in plan.lanes.items():
        new.lanes[d] = dataclasses.replace(lane, steps=list(lane.steps), slots=dict(lane.slots))
    return new


def _problems(plan):
    return "\n".join(validate(plan)[0])


# -- plans of the example programs ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_plans_pass_and_match_the_jaxpr(name):
    mesh = _mesh()
    fn, args = PROGRAMS[name](mesh)
    plan = plan_collectives(fn, *args)
    peaks = check(plan)
    assert sorted(peaks) == sorted(d.id for d in mesh.devices.flat)
    assert all(p > 0 for p in peaks.values())
    prims = _body_collectives(fn, *args)
    assert sorted(c.prim for c in plan.collectives) == sorted(p for p, _, _ in prims)
    assert len(plan.lanes) == N
    for lane in plan.lanes.values():
        starts = [s for s in lane.steps if s.kind == "start"]
        assert len(starts) == len(prims) == sum(s.kind == "done" for s in lane.steps)
        assert all(s.stream == 1 for s in starts)
        assert all(s.stream == 0 for s in lane.steps if s.kind == "run")
    for c in plan.collectives:
        (_, nin, nout) = next(p for p in prims if p[0] == c.prim)
        assert c.groups == ((0, 1, 2, 3),) and c.axes == ("x",)
        full = nout if c.kind == "all_gather" else nin
        factor = {"all_reduce": 2 * (N - 1) / N, "ppermute": 1.0}.get(c.kind, (N - 1) / N)
        assert c.nbytes == full
        assert all(c.moved_bytes(d) == pytest.approx(factor * full) for d in plan.lanes)
    text = repr(plan)
    assert "unmeasured" in text and "participants" in text and "d3" in text
    assert all(c.kind in text for c in plan.collectives)


def test_row_parallel_bytes_and_time():
    plan = plan_collectives(*_flat(row_parallel))
    (c,) = plan.collectives
    assert (c.kind, c.nbytes, c.moved_bytes(0)) == ("all_reduce", 8 * 8 * F32, 1.5 * 8 * 8 * F32)
    link = plan.link
    assert c.time_s(link, 0) == pytest.approx(link.launch_s + 6 * link.hop_s + 384 / link.bandwidth)
    assert LinkCosts().bandwidth > 0 and plan.predicted_s > 0


def test_independent_compute_overlaps_the_collective():
    plan = plan_collectives(*_flat(overlap))
    check(plan)
    steps = plan.lanes[0].steps
    start = next(k for k, s in enumerate(steps) if s.kind == "start")
    done = next(k for k, s in enumerate(steps) if s.kind == "done")
    assert any(s.kind == "run" for s in steps[start + 1 : done]), plan
    assert plan.predicted_s < plan.serial_s
    # the psum's operand stays live until its done, past its last compute use
    (c,) = plan.collectives
    (v,) = plan.collective_region(c.id).reads
    assert live_ranges(plan, plan.lanes[0])[v][1] == done


def test_ppermute_every_device_sends_once():
    plan = plan_collectives(*_flat(ring_step))
    (c,) = plan.collectives
    assert c.senders == frozenset(range(N))
    assert [c.moved_bytes(d) for d in range(N)] == [16 * F32] * N


def test_no_shard_map_is_an_error():
    with pytest.raises(ScheduleError, match="one shard_map"):
        plan_collectives(lambda x: x + 1.0, np.ones(3, np.float32))


@pytest.mark.parametrize("wrap", ["fori_loop", "cond"])
def test_collectives_inside_control_flow_are_refused(wrap):
    # the plan saw one opaque scan/cond op and no collective: "0 collectives", and times that left
    # the traffic out, accepted by check
    def body(a):
        step = lambda c: jax.lax.ppermute(c * 0.5, "x", RING)  # noqa: E731
        if wrap == "fori_loop":
            return jax.lax.fori_loop(0, 3, lambda i, c: step(c), a)
        return jax.lax.cond(a.sum() > 0, step, lambda c: c, a)

    mesh = _mesh()
    f = _smap(body, mesh, P("x"), P("x"))
    with pytest.raises(ScheduleError, match="ppermute.*not modelled"):
        plan_collectives(f, _put(mesh, (16, 64), P("x")))


# -- random programs and mutations ----------------------------------------------------------------

NAMES = st.lists(st.sampled_from(sorted(OPS)), min_size=2, max_size=4)
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def programs(draw):
    names = draw(NAMES)
    order = draw(st.permutations(range(len(names))))
    return [names[i] for i in order]


@SETTINGS
@given(names=programs(), device=st.integers(0, N - 1), data=st.data())
def test_random_programs_pass_and_mutations_are_caught(names, device, data):
    fn, args = branches(_mesh(), names)
    plan = plan_collectives(fn, *args)
    check(plan)
    assert sorted(c.kind for c in plan.collectives) == sorted(EXPECT[n][0] for n in names)
    for c in plan.collectives:
        n = next(n for n in names if EXPECT[n][0] == c.kind)
        assert c.moved_bytes(device) == pytest.approx(EXPECT[n][1])
    lane = plan.lanes[device]
    starts = [k for k, s in enumerate(lane.steps) if s.kind == "start"]

    # 1. two collectives swapped on one device: the devices disagree on the issue order
    i, j = sorted(data.draw(st.permutations(range(len(starts))))[:2])
    bad = _copy(plan)
    steps = bad.lanes[device].steps
    steps[starts[i]], steps[starts[j]] = steps[starts[j]], steps[starts[i]]
    with pytest.raises(CollectiveError, match="different order") as err:
        check(bad)
    assert isinstance(err.value, JaxrwError) and "deadlock" in str(err.value)

    # 2. a consumer moved before its collective's done (the done moved after the consumer)
    c = plan.collectives[data.draw(st.integers(0, len(plan.collectives) - 1))]
    out = plan.collective_region(c.id).writes
    done = next(k for k, s in enumerate(lane.steps) if s.kind == "done" and s.event == c.id)
    use = next(
        k
        for k, s in enumerate(lane.steps)
        if s.kind == "run" and k > done and set(plan.regions[s.regions[0]].reads) & set(out)
    )
    bad = _copy(plan)
    steps = bad.lanes[device].steps
    steps.insert(use + 1, steps.pop(done))
    assert f"c{c.id} ({c.kind}), before its done" in _problems(bad)
    with pytest.raises(CollectiveError, match="before its done"):
        check(bad)

    # 3. a buffer reused under an in-flight collective: its result put in its operand's bytes
    bad = _copy(plan)
    (operand,) = plan.collective_region(c.id).reads
    (result,) = out
    slots = bad.lanes[device].slots
    slots[result] = dataclasses.replace(slots[operand], shape=slots[result].shape)
    assert f"held by in-flight collective c{c.id}" in _problems(bad)
    with pytest.raises(CollectiveError, match="in-flight"):
        check(bad)


@SETTINGS
@given(names=programs(), device=st.integers(0, N - 1))
def test_other_broken_lanes_are_caught(names, device):
    plan = plan_collectives(*_flat(branches, names))
    lane = plan.lanes[device]
    # a compute region moved before the region producing what it reads
    runs = [k for k, s in enumerate(lane.steps) if s.kind == "run"]
    bad = _copy(plan)
    bad.lanes[device].steps.insert(0, bad.lanes[device].steps.pop(runs[-1]))
    assert "before" in _problems(bad)
    # a participant set that differs between devices
    bad = _copy(plan)
    bad.lanes[device] = dataclasses.replace(lane, peers={**lane.peers, 0: (device,)})
    assert "participants differ" in _problems(bad)
    # a collective never awaited
    bad = _copy(plan)
    bad.lanes[device].steps = [s for s in lane.steps if not (s.kind == "done" and s.event == 0)]
    assert "never done" in _problems(bad)
    # an unknown step
    bad = _copy(plan)
    bad.lanes[device].steps.append(Step("wait"))
    assert "unknown step kind" in _problems(bad)


@pytest.mark.parametrize(
    "body",
    [
        lambda a: jax.lax.psum(a, "x") * 2.0,
        lambda a: jax.nn.relu(jax.lax.psum(a, "x")),
        lambda a: jax.lax.pmean(a, "x"),
    ],
    ids=["scaled", "relu", "pmean"],
)
def test_literals_after_a_collective_plan(body):
    # a literal operand of an op placed after a collective was hashed (TypeError: TypedNdArray)
    mesh = _mesh()
    plan = plan_collectives(_smap(body, mesh, P("x"), P()), _put(mesh, (8, 4), P("x")))
    check(plan)
    (c,) = plan.collectives
    assert c.kind == "all_reduce"


def test_the_table_names_each_collective_by_its_equation():
    mesh = _mesh()
    f = _smap(lambda a: jnp.tanh(jax.lax.psum(jnp.tanh(a), "x")), mesh, P("x"), P())
    plan = plan_collectives(f, _put(mesh, (8, 4), P("x")))
    (c,) = plan.collectives
    assert plan.program.ops[c.op].name.startswith("psum") and c.op != c.id
    assert f"c{c.id} (e{c.op})" in repr(plan)  # it printed e{c.id}


def _two_axis_plan():
    """A psum over y (groups {0,1} {2,3}) and one over x ({0,2} {1,3}) on a 2x2 mesh."""
    mesh = jax.make_mesh((2, 2), ("x", "y"))
    a, b = (_put(mesh, (8, 8), P("x", "y"), seed=s) for s in (0, 1))
    body = lambda a, b: (jax.lax.psum(a * 2, "y"), jax.lax.psum(b * 3, "x"))  # noqa: E731
    f = jax.shard_map(
        body, mesh=mesh, in_specs=(P("x", "y"), P("x", "y")), out_specs=(P("x", None), P(None, "y"))
    )
    return plan_collectives(f, a, b)


def _issue_in_order(plan, devices, order):
    """A copy of `plan` whose lanes in `devices` run their compute first, then start the
    collectives in `order` (data dependencies still hold: each operand is ready before any start)."""
    bad = _copy(plan)
    for d in devices:
        steps = plan.lanes[d].steps
        runs = [s for s in steps if s.kind == "run"]
        starts = {s.event: s for s in steps if s.kind == "start"}
        dones = [s for s in steps if s.kind == "done"]
        bad.lanes[d] = dataclasses.replace(plan.lanes[d], steps=runs + [starts[c] for c in order] + dones)
    return bad


def test_a_wait_cycle_across_axes_is_caught():
    # no two devices share both psums, so the pairwise order check passed this deadlock
    plan = _two_axis_plan()
    check(plan)
    c_y, c_x = (c.id for c in plan.collectives)
    bad = _issue_in_order(plan, (1, 2), (c_x, c_y))
    with pytest.raises(CollectiveError, match="wait on each other in a cycle"):
        check(bad)
    # one device issuing the other way round is no cycle: every group can still meet
    check(_issue_in_order(plan, (0,), (c_x, c_y)))
    check(_issue_in_order(plan, (0, 1, 2, 3), (c_x, c_y)))

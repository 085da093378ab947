"""Plans of `jax.shard_map` programs with collectives on a communication stream, checked on the CPU.

`plan_collectives(fn, *args)` traces `fn`, takes its one `shard_map` body and gives every device of
the mesh a lane of steps (`plan.Step`): compute regions (maximal runs of non-collective equations)
`run` on the compute stream 0; each collective (psum/pmax/pmin as all_reduce, all_gather,
reduce_scatter, ppermute, all_to_all) is a region `start`ed on the communication stream 1 (its
event is the collective's id) after its producer, and awaited (`done`) just before its first
consumer, so independent compute runs between start and done (the overlap). Equations are ordered
for that: collectives as soon as they are ready, compute that does not wait on an in-flight
collective before compute that does. The communication stream is FIFO, as a NCCL stream is.

Every value that crosses a region boundary gets a buffer with a live range in lane steps; a buffer
handed to a collective stays live until its `done`. `collective_checks.check(plan)` verifies each
lane (reads after writes, consumers after `done`, no buffer reused under an in-flight collective)
and that every device issues the collectives it shares with another device in the same order with
the same participants (a mismatch deadlocks NCCL); it returns peak bytes per lane.

Times: compute from the device Profile's roofline (`program.build_program`), collectives from
`LinkCosts`, whose values are unmeasured placeholders. Emission is not built: running a plan through
thunky needs several CUDA GPUs, which this workplace does not lend (docs/multi-gpu.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import jax
import numpy as np
from jax.extend.core import jaxprs_in_params

from .. import compat
from ..rewrite.profiles import H200, Profile
from .buffers import Slot, aligned
from .plan import H200_STREAMS, ScheduleError, Step, StreamCosts, _cluster_time, _table, _vals
from .program import Lit, Program, build_program
from .validate import PlanError

__all__ = (
    "KINDS LinkCosts H200_NVLINK Collective LaneRegion Lane CollectivePlan CollectiveError "
    "plan_collectives plan_from_jaxpr live_ranges"
).split()

COMPUTE, COMM = 0, 1  # the two streams of a lane
START = -1  # lane time of the program inputs (before the first step)

# collective primitive -> kind (jax 0.12 names; `psum` becomes `psum_invariant` under check_vma)
KINDS = dict.fromkeys(("psum", "psum_invariant", "pmax", "pmin"), "all_reduce") | {
    "all_gather_invariant": "all_gather"
}
KINDS |= {k: k for k in ("all_gather", "reduce_scatter", "ppermute", "all_to_all")}
# communicating primitives this model does not price or order yet
UNMODELLED = frozenset(
    {"psend", "precv", "pbroadcast", "pbroadcast_dynamic", "ragged_all_to_all", "all_gather_reduced"}
    | {"unreduced_psum", "unreduced_pmax", "unreduced_pmin", "unreduced_reduce_scatter"}
)


@dataclass(frozen=True)
class LinkCosts:
    """A link model for one collective: launch + hops x hop_s + bytes sent per device / bandwidth.

    UNMEASURED placeholders for NVLink 4 on H200 (no multi-GPU machine was lent): 900 GB/s per GPU
    both ways is 450 GB/s each way, of which NCCL rings are assumed to reach 80%; a few µs per
    launch and per ring hop. NCCL's share of SMs is not priced (compute runs at full speed while a
    collective is in flight). Replace with `jaxrw calibrate` figures from a multi-GPU machine."""

    bandwidth: float = 360e9  # bytes/s one device sends (placeholder)
    hop_s: float = 2e-6  # latency per ring step (placeholder)
    launch_s: float = 5e-6  # NCCL kernel launch and protocol setup (placeholder)


H200_NVLINK = LinkCosts()


class CollectiveError(PlanError):
    """A collective plan breaks a lane-ordering, buffer or cross-device rule; the message lists each."""


@dataclass(frozen=True)
class Collective:
    """One collective equation of the body, as every device of its groups issues it."""

    id: int
    op: int  # index in the body program
    prim: str
    kind: str
    axes: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]  # participant device ids, in rank order, per group
    nbytes: int  # the buffer the ring formula applies to: reduced, gathered result, scattered input
    senders: frozenset[int] = frozenset()  # ppermute: devices that send (the others only receive)

    @property
    def size(self) -> int:
        return len(self.groups[0])

    def participants(self, device: int) -> tuple[int, ...]:
        return next((g for g in self.groups if device in g), ())

    def moved_bytes(self, device: int) -> float:
        """Bytes this device sends: ring all-reduce 2(N-1)/N, gather/scatter/all-to-all (N-1)/N,
        ppermute 1x (0 for a device that only receives)."""
        n = self.size
        if self.kind == "ppermute":
            return float(self.nbytes) if n > 1 and device in self.senders else 0.0
        return (2.0 if self.kind == "all_reduce" else 1.0) * (n - 1) / n * self.nbytes

    def hops(self) -> int:
        n = self.size
        return 0 if n <= 1 else {"all_reduce": 2 * (n - 1), "ppermute": 1}.get(self.kind, n - 1)

    def time_s(self, link: LinkCosts, device: int) -> float:
        if self.size <= 1:
            return 0.0
        return link.launch_s + self.hops() * link.hop_s + self.moved_bytes(device) / link.bandwidth


@dataclass(frozen=True)
class LaneRegion:
    """A compute region (stream 0) or one collective (stream 1); the same on every lane (SPMD)."""

    id: int
    kind: str  # "compute" | "collective"
    ops: tuple[int, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    stream: int
    time_s: float
    collective: int = -1


@dataclass
class Lane:
    """One device: its steps, the participants it expects per collective, and its buffers."""

    device: int
    steps: list[Step]
    peers: dict[int, tuple[int, ...]]  # collective id -> participants this device expects
    slots: dict[int, Slot] = field(default_factory=dict)  # value -> where it lives on this device
    time_s: float = 0.0


@dataclass
class CollectivePlan:
    program: Program  # the shard_map body, one device's view (shapes are per-device shards)
    mesh: dict[str, int]
    regions: list[LaneRegion]
    collectives: list[Collective]
    lanes: dict[int, Lane]
    link: LinkCosts = H200_NVLINK
    predicted_s: float = 0.0  # slowest lane, collectives overlapped with independent compute
    serial_s: float = 0.0  # the same work with no overlap

    def collective_region(self, cid: int) -> LaneRegion:
        return next(r for r in self.regions if r.collective == cid)

    def __repr__(self) -> str:
        us = 1e6
        mesh = ", ".join(f"{k}: {v}" for k, v in self.mesh.items())
        n_comp = sum(r.kind == "compute" for r in self.regions)
        lines = [
            f"CollectivePlan: mesh {{{mesh}}}, {len(self.lanes)} lanes, {n_comp} compute regions (stream "
            f"{COMPUTE}), {len(self.collectives)} collectives (stream {COMM}); predicted "
            f"{self.predicted_s * us:.1f} µs, serial {self.serial_s * us:.1f} µs "
            "(link model: unmeasured placeholders)"
        ]
        first = next(iter(self.lanes), 0)
        rows = [("collective", "kind", "prim", "axes", "participants", "bytes", "sent/device", "µs", "r")]
        for c in self.collectives:
            groups = " ".join("{" + ",".join(map(str, g)) + "}" for g in c.groups)
            sent, t = max(c.moved_bytes(d) for d in self.lanes), c.time_s(self.link, first) * us
            rid = self.collective_region(c.id).id
            rows.append((f"c{c.id} (e{c.op})", c.kind, c.prim, ",".join(c.axes), groups, str(c.nbytes)))
            rows[-1] += (f"{sent:.0f}", f"{t:.1f}", f"r{rid}")
        lines += _table(rows) if self.collectives else ["  no collectives"]
        rows = [("region", "kind", "stream", "ops", "µs", "reads -> writes")]
        for r in self.regions:
            flow = f"{_vals(r.reads)} -> {_vals(r.writes)}"
            rows.append((f"r{r.id}", r.kind, str(r.stream), str(len(r.ops)), f"{r.time_s * us:.1f}", flow))
        lines += _table(rows)
        peaks = _peaks(self)
        rows = [("lane", "µs", "peak bytes", "steps")]
        for d, ln in self.lanes.items():
            same = d != first and ln.steps == self.lanes[first].steps
            text = f"as d{first}" if same else "; ".join(_step_text(s) for s in ln.steps)
            rows.append((f"d{d}", f"{ln.time_s * us:.1f}", str(peaks[d]), text))
        lines += _table(rows)
        if first in self.lanes:
            lane = self.lanes[first]
            live = live_ranges(self, lane)
            rows = [("buffer", "slot", "bytes", "live steps", "held by")]
            for v, s in lane.slots.items():
                a, b, held = live[v]
                by, nb = ",".join(f"c{c}" for c in held) or "-", str(self.program.nbytes(v))
                rows.append((f"v{v}", f"{s.storage}+{s.offset}", nb, f"{a}..{b}", by))
            lines.append(f"  buffers of lane d{first} (lanes have the same layout unless mutated):")
            lines += _table(rows)
        return "\n".join(lines)


def _step_text(s: Step) -> str:
    where = f" on stream {s.stream}" if s.kind == "start" else ""
    return f"run r{s.regions[0]}" if s.kind == "run" else f"{s.kind} c{s.event}{where}"


# -- building -------------------------------------------------------------------------------------


def plan_collectives(fn: Any, *args: Any, **options: Any) -> CollectivePlan:
    """The plan of the one `shard_map` in `fn` traced at `args` (arrays or ShapeDtypeStructs whose
    shardings match the shard_map's in_specs, as jax 0.12 requires); options as plan_from_jaxpr's."""
    return plan_from_jaxpr(jax.make_jaxpr(fn)(*args), **options)


def plan_from_jaxpr(
    closed: Any, *, profile: Profile = H200, link: LinkCosts = H200_NVLINK, costs: StreamCosts = H200_STREAMS
) -> CollectivePlan:
    """The plan of the one `shard_map` equation in `closed` (searched through jit calls)."""
    found = _shard_maps(closed.jaxpr)
    if len(found) != 1:
        raise ScheduleError(f"expected one shard_map in the program, found {len(found)}")
    eqn = found[0]
    mesh = eqn.params["mesh"]
    names = tuple(mesh.axis_names)
    sizes = tuple(int(mesh.shape[a]) for a in names)
    try:
        ids = np.vectorize(lambda d: d.id)(mesh.devices)
    except (AttributeError, ValueError):  # an AbstractMesh: devices numbered in mesh order
        ids = np.arange(math.prod(sizes)).reshape(sizes)
    body = eqn.params["jaxpr"]  # NamedAxisEffects are the collectives themselves: dropped to price it
    prog = build_program(compat.ClosedJaxpr(body.replace(effects=set()), ()), profile)
    colls = _collectives(prog, ids, names)
    order = _order(prog, {c.op for c in colls})
    regions, steps = _regions(prog, order, colls, costs)
    plan = CollectivePlan(prog, dict(zip(names, sizes, strict=True)), regions, colls, {}, link)
    for d in (int(x) for x in ids.reshape(-1)):
        plan.lanes[d] = Lane(d, list(steps), {c.id: c.participants(d) for c in colls})
        _place(plan, plan.lanes[d])
    _predict(plan)
    return plan


def _shard_maps(jaxpr: Any) -> list[Any]:
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            out.append(eqn)
        elif eqn.primitive.name in compat.INLINED_CALLS:
            out += _shard_maps(compat.call_body(eqn).jaxpr)
    return out


def _nested_collectives(params: dict) -> set[str]:
    """Collectives in the bodies an op carries (a scan, while, cond or call), at any depth."""
    found: set[str] = set()
    for jaxpr in jaxprs_in_params(params):  # the jaxpr of a ClosedJaxpr too
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in KINDS or eqn.primitive.name in UNMODELLED:
                found.add(eqn.primitive.name)
            found |= _nested_collectives(eqn.params)
    return found


def _collectives(prog: Program, ids: np.ndarray, names: tuple[str, ...]) -> list[Collective]:
    out: list[Collective] = []
    for op in prog.ops:
        if op.name in UNMODELLED:
            raise ScheduleError(f"collective {op.name} is not modelled by collective plans")
        inner = _nested_collectives(op.params)
        if inner:  # one op here, so their traffic would be left out of every time
            raise ScheduleError(
                f"collectives {sorted(inner)} inside {op.name} are not modelled by collective plans"
            )
        if op.name not in KINDS:
            continue
        kind = KINDS[op.name]
        p = op.params
        axes = p.get("axes", p.get("axis_name"))
        axes = tuple(axes) if isinstance(axes, tuple | list) else (axes,)
        if any(not isinstance(a, str) for a in axes):
            raise ScheduleError(f"{op.name} over positional axes {axes} is not modelled")
        moved = np.moveaxis(ids, [names.index(a) for a in axes], range(ids.ndim - len(axes), ids.ndim))
        rows = moved.reshape(-1, math.prod(ids.shape[names.index(a)] for a in axes))
        sub = p.get("axis_index_groups")
        groups = [tuple(int(row[i]) for i in g) for row in rows for g in (sub or [range(len(row))])]
        ins = [a for a in op.ins if not isinstance(a, Lit)]
        nbytes = sum(prog.nbytes(v) for v in (op.outs if kind == "all_gather" else ins))
        senders = frozenset()
        if kind == "ppermute":
            senders = frozenset(g[src] for g in groups for src, _ in p["perm"])
        out.append(Collective(len(out), op.index, op.name, kind, axes, tuple(groups), nbytes, senders))
    return out


def _order(prog: Program, coll_ops: set[int]) -> list[int]:
    """A topological order of the body's ops: ready collectives first, then compute that does not
    read an in-flight collective's result, then (awaiting it) the earliest remaining op."""
    made = prog.producer
    deps = {op.index: {made[a] for a in op.ins if not isinstance(a, Lit) and a in made} for op in prog.ops}
    users: dict[int, list[int]] = {i: [] for i in deps}
    for i, ds in deps.items():
        for p in ds:
            users[p].append(i)
    missing = {i: len(ds) for i, ds in deps.items()}
    ready = {i for i, n in missing.items() if n == 0}
    done: list[int] = []
    inflight: list[int] = []  # collective ops not yet awaited, in start order
    while ready:
        colls = [i for i in ready if i in coll_ops]
        free = [i for i in ready if i not in coll_ops and not deps[i] & set(inflight)]
        i = min(colls or free or ready)
        if i in coll_ops:
            inflight.append(i)
        elif deps[i] & set(inflight):  # awaiting one collective awaits the earlier ones (FIFO stream)
            del inflight[: max(inflight.index(c) for c in deps[i] & set(inflight)) + 1]
        ready.discard(i)
        done.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                ready.add(u)
    return done


def _regions(
    prog: Program, order: list[int], colls: list[Collective], costs: StreamCosts
) -> tuple[list[LaneRegion], list[Step]]:
    """Cut `order` into compute regions and collective regions, with the lane's steps."""
    by_op = {c.op: c for c in colls}
    made_by = {o: c for c in colls for o in prog.ops[c.op].outs}
    outputs = {v for v in prog.outputs if not isinstance(v, Lit)}
    regions: list[LaneRegion] = []
    steps: list[Step] = []
    current: list[int] = []
    inflight: list[int] = []  # collective ids started, not yet done, in start order

    def used_after(v: int, ops: set[int]) -> bool:
        return v in outputs or any(u not in ops for u in prog.users.get(v, []))

    def flush() -> None:
        if not current:
            return
        ops = set(current)
        made = {o for i in current for o in prog.ops[i].outs}
        ins = {a for i in current for a in prog.ops[i].ins if not isinstance(a, Lit)}
        reads = tuple(sorted(v for v in ins - made if v not in prog.consts))
        writes = tuple(sorted(v for v in made if used_after(v, ops)))
        t = _cluster_time(prog, current, costs)
        regions.append(LaneRegion(len(regions), "compute", tuple(current), reads, writes, COMPUTE, t))
        steps.append(Step("run", (regions[-1].id,)))
        current.clear()

    for i in order:
        op = prog.ops[i]
        if i in by_op:
            flush()
            c = by_op[i]
            reads = tuple(a for a in op.ins if not isinstance(a, Lit) and a not in prog.consts)
            regions.append(LaneRegion(len(regions), "collective", (i,), reads, op.outs, COMM, 0.0, c.id))
            steps.append(Step("start", (regions[-1].id,), COMM, c.id))
            inflight.append(c.id)
            continue
        made = [made_by[a].id for a in op.ins if not isinstance(a, Lit) and a in made_by]  # a Lit: no hash
        need = [inflight.index(m) for m in made if m in inflight]
        if need:
            flush()
            upto = max(need) + 1  # the stream is FIFO: earlier collectives are finished too
            steps += [Step("done", (), COMM, c) for c in inflight[:upto]]
            del inflight[:upto]
        current.append(i)
    flush()
    steps += [Step("done", (), COMM, c) for c in inflight]
    return regions, steps


def _place(plan: CollectivePlan, lane: Lane) -> None:
    """Slots of one lane: inputs stay in their own storage; every other crossing value goes to a
    per-dtype arena, first-fit, sharing bytes only with values whose live ranges are disjoint."""
    prog = plan.program
    live = live_ranges(plan, lane)
    placed: dict[str, list[tuple[int, int, int, int]]] = {}  # storage -> (start, end, first, last)
    for v in sorted(live, key=lambda x: (live[x][0], x)):
        shape, dt = prog.shape(v), str(prog.dtype(v))
        if v in prog.inputs:
            lane.slots[v] = Slot(f"in:{prog.inputs.index(v)}", 0, shape, dt)
            continue
        first, last, _ = live[v]
        size = max(1, math.prod(shape))
        busy = sorted((a, b) for a, b, f, la in placed.get(dt, []) if not (la < first or last < f))
        off = 0
        for a, b in busy:
            if off + size <= a:
                break
            off = max(off, aligned(b, prog.dtype(v)))
        placed.setdefault(dt, []).append((off, off + size, first, last))
        lane.slots[v] = Slot(f"arena:{dt}", off, shape, dt)


def _predict(plan: CollectivePlan) -> None:
    """Per lane: the compute stream runs its regions in order; the FIFO comm stream runs each
    collective once started and free; `done` waits for it. Peers are assumed to arrive together."""
    colls = {c.id: c for c in plan.collectives}
    for d, lane in plan.lanes.items():
        t = comm = 0.0
        finish: dict[int, float] = {}
        for s in lane.steps:
            if s.kind == "run":
                t += plan.regions[s.regions[0]].time_s
            elif s.kind == "start":
                comm = max(t, comm) + colls[s.event].time_s(plan.link, d)
                finish[s.event] = comm
            else:
                t = max(t, finish.get(s.event, t))
        lane.time_s = max(t, comm)
    plan.predicted_s = max((ln.time_s for ln in plan.lanes.values()), default=0.0)
    compute = sum(r.time_s for r in plan.regions)
    plan.serial_s = max(
        (compute + sum(c.time_s(plan.link, d) for c in plan.collectives) for d in plan.lanes), default=0.0
    )


# -- validation -----------------------------------------------------------------------------------


def live_ranges(plan: CollectivePlan, lane: Lane) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """value -> (first, last, collectives holding it): lane times (step indices, START for inputs,
    len(steps) for outputs). A collective's result is live from its start; its operands until its
    done (never done: to the end)."""
    prog = plan.program
    end = len(lane.steps)
    done = {s.event: k for k, s in enumerate(lane.steps) if s.kind == "done"}
    first: dict[int, int] = {v: START for v in prog.inputs}
    last: dict[int, int] = {}
    held: dict[int, list[int]] = {}
    for k, s in enumerate(lane.steps):
        if s.kind not in ("run", "start"):
            continue
        r = plan.regions[s.regions[0]]
        until = k if s.kind == "run" else done.get(s.event, end)
        for v in r.reads:
            last[v] = max(last.get(v, START), until)
            if s.kind == "start":
                held.setdefault(v, []).append(s.event)
        for v in r.writes:
            first.setdefault(v, k)
    for v in prog.outputs:
        if not isinstance(v, Lit) and v not in prog.consts:
            last[v] = end
    return {v: (f, max(f, last.get(v, f)), tuple(held.get(v, ()))) for v, f in first.items()}


def _peaks(plan: CollectivePlan) -> dict[int, int]:
    """Most bytes live at once per lane (inputs, crossing values and outputs, by live range)."""
    out: dict[int, int] = {}
    for d, lane in plan.lanes.items():
        live = live_ranges(plan, lane)
        nb = plan.program.nbytes
        deltas = sorted(x for v, (f, la, _) in live.items() for x in ((f, nb(v)), (la + 1, -nb(v))))
        out[d] = max(accumulate(n for _, n in deltas), default=0)  # at one time, frees come first
    return out

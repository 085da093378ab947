"""Plan: a program as regions on streams with explicit buffers, priced against XLA's own schedule.

A region becomes one `thunky.call_jax`. Regions are few and large on purpose: without graph capture
every kernel thunky launches costs host time (DESIGN.md, Scheduler). The planner coarsens the op DAG
into branch clusters, list-schedules them on k lanes, cuts the timeline into stages (all cross-lane
edges cross a stage boundary, where side streams are joined), makes one region per stage and lane,
then places every value that crosses a region boundary in a buffer: program inputs (and leading-axis
views of them), outputs (branch results written in place into a stacked output), donated inputs
reused for outputs, and a scratch arena per dtype reused by stage live range.

The plan is data: `repr(plan)` is a table, `plan.to_dict()` is JSON-able, and `validate.check`
verifies it without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOptionError, JaxrwError
from ..rewrite.cost import speedup
from ..rewrite.profiles import Profile
from .buffers import ARENA_ALIGN, Buffer, Slot, Storage, place
from .program import Lit, Program, build_program

__all__ = [
    "StreamCosts",
    "H200_STREAMS",
    "ScheduleError",
    "ScheduleUnavailableError",
    "Slot",
    "Storage",
    "Buffer",
    "Region",
    "Step",
    "Plan",
    "plan_program",
    "ARENA_ALIGN",
]


class ScheduleError(JaxrwError):
    """The program cannot be scheduled with thunky (effects, empty or sub-byte buffers, ...)."""


class ScheduleUnavailableError(ScheduleError):
    """schedule="streams" was asked for where thunky or a CUDA device is missing."""


@dataclass(frozen=True)
class StreamCosts:
    """What the two executors cost beyond the kernels themselves, in seconds.

    Fitted to H200 run f8 (2026-12-04, jax 0.12.0.1, bench/results/h200-2026-12-04f8-schedule.json):
    XLA's time and thunky's on one and on four streams for the 11 scheduler cases, 33 times, mean
    |log error| 0.24. Both executors pay a call (jax.jit's dispatch; thunky's program called through
    its executable, schedule/direct.py) and a little per input or buffer crossing the program's
    boundary; thunky launches each kernel from the host (a floor for a whole stage, shared by all
    streams); XLA graph-captures its kernels. Overlapped bandwidth-bound branches are priced as
    `contention`. Before direct.py, jax's Python dispatch made a thunky call cost ~40 µs plus ~9 µs per
    buffer (the fit to run q, 2026-12-03), ~12 µs of host time per argument (run f6)."""

    xla_kernel_s: float = 1.65e-6
    xla_call_s: float = 13e-6
    xla_input_s: float = 1.9e-6
    thunky_kernel_s: float = 1.7e-6
    thunky_call_s: float = 9.5e-6
    region_s: float = 1.4e-6
    buffer_s: float = 1.9e-6
    sync_s: float = 2.4e-6
    contention: float = 0.64
    light_s: float = 2e-6  # clusters cheaper than this join a neighbour instead of standing alone
    min_gain: float = 0.10  # `auto` unmeasured wants this predicted gain before using thunky
    # `auto` times a plan of two or more streams against XLA (using it only when measured faster)
    # from this predicted gain: these costs miss the measured times by 24% on average (run f8), and
    # there the planner's two streams predicted 1.06x ran 1.48x (f9). One-stream plans still need
    # min_gain: nothing runs alongside, and each trial is a compilation
    trial_gain: float = 0.0
    # ... and of at most this many regions: thunky compiles each region apart, and bert_base's 37
    # cost auto 20 s (float32) and 5 s (bfloat16) of optimization for a plan predicted at 1.02x (run g2/g3)
    trial_regions: int = 8


H200_STREAMS = StreamCosts()


@dataclass
class Region:
    id: int
    ops: tuple[int, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    stage: int
    stream: int
    time_s: float
    kernels: int
    temp_bytes: int  # XLA temporaries inside the region's own executable (estimate)


@dataclass(frozen=True)
class Step:
    """One statement of the main stream: `run` a region, `start` regions on a side stream (an event),
    or wait until an event is `done`. Stream 0 is the main stream; side stream s >= 1 is thunky's
    computation stream s - 1 (thunky numbers the extra streams from 0)."""

    kind: str
    regions: tuple[int, ...] = ()
    stream: int = 0
    event: int = -1


@dataclass
class Plan:
    program: Program
    regions: list[Region]
    steps: list[Step]
    buffers: dict[int, Buffer]
    storages: dict[str, Storage]
    out_storage: dict[int, str]  # flat output index -> storage holding it (absent: computed outside)
    donate: tuple[int, ...] = ()
    xla_s: float = 0.0
    thunky_s: float = 0.0
    overlap_s: float = 0.0  # XLA's kernels with independent branches overlapped (graph-captured), best k
    peak_bytes: int = 0
    scratch_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def streams(self) -> int:
        return len({r.stream for r in self.regions})

    @property
    def stages(self) -> int:
        return len({r.stage for r in self.regions})

    @property
    def predicted_speedup(self) -> float:
        return speedup(self.xla_s, self.thunky_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "regions": [
                dict(
                    id=r.id,
                    stage=r.stage,
                    stream=r.stream,
                    ops=len(r.ops),
                    kernels=r.kernels,
                    time_s=r.time_s,
                    reads=list(r.reads),
                    writes=list(r.writes),
                    temp_bytes=r.temp_bytes,
                )
                for r in self.regions
            ],
            "steps": [
                dict(kind=s.kind, regions=list(s.regions), stream=s.stream, event=s.event) for s in self.steps
            ],
            "buffers": [
                dict(
                    value=b.value,
                    kind=b.kind,
                    storage=b.slot.storage,
                    offset=b.slot.offset,
                    shape=list(b.slot.shape),
                    dtype=b.slot.dtype,
                    writers=list(b.writers),
                    readers=list(b.readers),
                    parent=b.parent,
                )
                for b in self.buffers.values()
            ],
            "storages": [
                dict(name=s.name, kind=s.kind, dtype=s.dtype, shape=list(s.shape), bytes=s.nbytes)
                for s in self.storages.values()
            ],
            "out_storage": {str(k): v for k, v in self.out_storage.items()},
            "streams": self.streams,
            "stages": self.stages,
            "donate": list(self.donate),
            "xla_s": self.xla_s,
            "overlap_s": self.overlap_s,
            "thunky_s": self.thunky_s,
            "predicted_speedup": self.predicted_speedup,
            "peak_bytes": self.peak_bytes,
            "scratch_bytes": self.scratch_bytes,
            "notes": list(self.notes),
        }

    def __repr__(self) -> str:
        us = 1e6
        lines = [
            f"Plan: {len(self.regions)} regions, {self.streams} streams, {self.stages} stages; predicted "
            f"XLA {self.xla_s * us:.1f} µs, thunky {self.thunky_s * us:.1f} µs "
            f"({self.predicted_speedup:.2f}x), "
            f"XLA overlapped {self.overlap_s * us:.1f} µs; peak {_mib(self.peak_bytes)} "
            f"(scratch {_mib(self.scratch_bytes)})"
        ]
        regions = [("region", "stage", "stream", "ops", "kernels", "time µs", "reads -> writes")]
        regions += [
            (
                f"r{r.id}",
                str(r.stage),
                str(r.stream),
                str(len(r.ops)),
                str(r.kernels),
                f"{r.time_s * us:.1f}",
                f"{_vals(r.reads)} -> {_vals(r.writes)}",
            )
            for r in self.regions
        ]
        lines += _table(regions)
        lines.append("  steps: " + "; ".join(_step_text(s) for s in self.steps))
        storages = [("storage", "kind", "dtype", "shape", "MiB")]
        storages += [
            (st.name, st.kind, st.dtype, str(list(st.shape)), f"{st.nbytes / 2**20:.2f}")
            for st in self.storages.values()
        ]
        lines += _table(storages)
        buffers = [("buffer", "kind", "storage", "offset", "shape", "writers", "readers")]
        buffers += [
            (
                f"v{b.value}",
                b.kind,
                b.slot.storage,
                str(b.slot.offset),
                str(list(b.slot.shape)),
                _regs(b.writers),
                _regs(b.readers),
            )
            for b in self.buffers.values()
        ]
        lines += _table(buffers)
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned columns (the first row is the header), indented by two spaces."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _vals(vs: tuple[int, ...]) -> str:
    text = ",".join(f"v{v}" for v in vs[:6])
    return text + (f",+{len(vs) - 6}" if len(vs) > 6 else "") if vs else "-"


def _regs(rs: tuple[int, ...]) -> str:
    return ",".join(f"r{r}" for r in rs) or "-"


def _step_text(s: Step) -> str:
    if s.kind == "run":
        return f"run r{s.regions[0]}"
    if s.kind == "start":
        return f"start e{s.event} on stream {s.stream}: " + ",".join(f"r{r}" for r in s.regions)
    return f"done e{s.event}"


# -- planning -------------------------------------------------------------------------------------


def plan_program(
    closed: Any,
    profile: Profile,
    *,
    costs: StreamCosts = H200_STREAMS,
    streams: int | None = None,
    max_streams: int = 8,
    donate: tuple[int, ...] = (),
) -> Plan:
    """The cheapest predicted plan for `closed` (a ClosedJaxpr or a built Program).

    `streams=k` forces k lanes; otherwise k in 1, 2, 4, 8 (up to `max_streams`) is priced and the
    cheapest kept. `donate` lists flat input indices whose buffers the caller gives up."""
    if streams is not None and (isinstance(streams, bool) or not isinstance(streams, int) or streams < 1):
        raise InvalidOptionError(
            f"streams={streams!r}: a number of streams ≥ 1, or None to price 1, 2, 4 and 8"
        )
    try:
        prog = closed if isinstance(closed, Program) else build_program(closed, profile)
    except ValueError as e:
        raise ScheduleError(f"cannot schedule this program: {e}") from e
    compute = [op.index for op in prog.ops if not op.free]
    clusters = _coarsen(prog, compute, costs)
    ks = [streams] if streams else [k for k in (1, 2, 4, 8) if k <= max(1, max_streams)]
    best: Plan | None = None
    overlap = math.inf
    for k in ks if streams else (*ks, 16):
        plan = _plan_for(prog, clusters, k, profile, costs, tuple(donate))
        overlap = min(overlap, plan.overlap_s)
        if k in ks and (best is None or plan.thunky_s < best.thunky_s * 0.999):
            best = plan
    assert best is not None
    best.overlap_s = overlap
    return best


def _deps(prog: Program, op_ids: list[int]) -> dict[int, set[int]]:
    """op -> ops it reads from (through join parts; views and inputs add none)."""
    pos = set(op_ids)
    out: dict[int, set[int]] = {}
    for i in op_ids:
        preds: set[int] = set()
        for a in prog.ops[i].ins:
            if not isinstance(a, Lit):
                preds.update(w for w in prog.writers(a) if w in pos)
        out[i] = preds
    return out


def _coarsen(prog: Program, op_ids: list[int], costs: StreamCosts) -> list[list[int]]:
    """Merge chains and light ops into branch clusters; returns clusters in topological order."""
    deps = _deps(prog, op_ids)
    members = {i: [i] for i in op_ids}
    preds = {i: set(deps[i]) for i in op_ids}
    succs: dict[int, set[int]] = {i: set() for i in op_ids}
    for i, ps in preds.items():
        for p in ps:
            succs[p].add(i)

    def cost(c: int) -> float:
        return sum(prog.ops[i].time_s + prog.ops[i].kernels * costs.xla_kernel_s for i in members[c])

    def merge(a: int, b: int) -> None:
        members[b].extend(members.pop(a))
        for p in preds.pop(a):
            succs[p].discard(a)
            if p != b:
                succs[p].add(b)
                preds[b].add(p)
        for s in succs.pop(a):
            preds[s].discard(a)
            if s != b:
                preds[s].add(b)
                succs[b].add(s)
        preds[b].discard(a)
        succs[b].discard(a)

    changed = True
    while changed:
        changed = False
        for c in sorted(members):
            if c not in members:
                continue
            if len(preds[c]) == 1:
                (p,) = preds[c]
                if succs[p] == {c} or cost(c) < costs.light_s:
                    merge(c, p)
                    changed = True
                    continue
            if len(succs[c]) == 1 and cost(c) < costs.light_s:
                (s,) = succs[c]
                merge(c, s)
                changed = True
    order = _topo(members, preds)
    return [sorted(members[c]) for c in order]


def _topo(members: dict[int, list[int]], preds: dict[int, set[int]]) -> list[int]:
    done: set[int] = set()
    order: list[int] = []
    pending = sorted(members, key=lambda c: min(members[c]))
    while pending:
        rest = []
        for c in pending:
            if preds[c] <= done:
                order.append(c)
                done.add(c)
            else:
                rest.append(c)
        if len(rest) == len(pending):
            raise ScheduleError("internal: the cluster graph has a cycle")
        pending = rest
    return order


def _plan_for(
    prog: Program,
    clusters: list[list[int]],
    k: int,
    profile: Profile,
    costs: StreamCosts,
    donate: tuple[int, ...],
) -> Plan:
    lanes, start = _list_schedule(prog, clusters, k, costs)
    stages = _stages(prog, clusters, lanes, start) if clusters else []
    regions: list[Region] = []
    steps: list[Step] = []
    event = 0
    for s, lane_ops in enumerate(stages):
        used = [(lane, sorted(ops)) for lane, ops in sorted(lane_ops.items()) if ops]
        main = max(used, key=lambda lo: sum(prog.ops[i].time_s for i in lo[1]))
        side = [lo for lo in used if lo is not main]
        starts, dones = [], []
        for n, (_lane, ops) in enumerate(side, start=1):
            regions.append(_region(prog, len(regions), ops, s, n, costs))
            starts.append(Step("start", (regions[-1].id,), n, event))
            dones.append(Step("done", (), n, event))
            event += 1
        regions.append(_region(prog, len(regions), main[1], s, 0, costs))
        steps.extend([*starts, Step("run", (regions[-1].id,)), *dones])
    plan = Plan(prog, regions, steps, {}, {}, {}, donate)
    place(plan)
    _predict(plan, profile, costs)
    return plan


def _cluster_time(prog: Program, ops: list[int], costs: StreamCosts) -> float:
    return sum(prog.ops[i].time_s + prog.ops[i].kernels * costs.xla_kernel_s for i in ops)


def _list_schedule(
    prog: Program, clusters: list[list[int]], k: int, costs: StreamCosts
) -> tuple[list[int], list[float]]:
    """Lane and start time of each cluster: highest bottom level first, onto the lane where it can
    start earliest (an edge between lanes costs one synchronization)."""
    owner = {i: c for c, ops in enumerate(clusters) for i in ops}
    deps = _deps(prog, [i for ops in clusters for i in ops])
    cpreds = [{owner[p] for i in ops for p in deps[i]} - {c} for c, ops in enumerate(clusters)]
    csuccs: list[set[int]] = [set() for _ in clusters]
    for c, ps in enumerate(cpreds):
        for p in ps:
            csuccs[p].add(c)
    t = [_cluster_time(prog, ops, costs) for ops in clusters]
    bottom = [0.0] * len(clusters)
    for c in reversed(range(len(clusters))):
        bottom[c] = t[c] + max((bottom[s] for s in csuccs[c]), default=0.0)
    lane = [-1] * len(clusters)
    start = [0.0] * len(clusters)
    finish = [0.0] * len(clusters)
    free = [0.0] * k
    placed: set[int] = set()
    while len(placed) < len(clusters):
        ready = [c for c in range(len(clusters)) if c not in placed and cpreds[c] <= placed]
        c = max(ready, key=lambda x: (bottom[x], -x))
        best = (math.inf, 0)
        for ln in range(k):
            st = max([free[ln], *[finish[p] + (0.0 if lane[p] == ln else costs.sync_s) for p in cpreds[c]]])
            if st < best[0] - 1e-12:
                best = (st, ln)
        start[c], lane[c] = best
        finish[c] = start[c] + t[c]
        free[lane[c]] = finish[c]
        placed.add(c)
    return lane, start


def _stages(
    prog: Program, clusters: list[list[int]], lanes: list[int], start: list[float]
) -> list[dict[int, list[int]]]:
    """Cut the lanes into stages so that every edge between lanes crosses a stage boundary."""
    owner = {i: c for c, ops in enumerate(clusters) for i in ops}
    deps = _deps(prog, list(owner))
    stages: list[dict[int, list[int]]] = [{}]
    stage_of: dict[int, int] = {}
    for c in sorted(range(len(clusters)), key=lambda x: (start[x], x)):  # a topological order
        preds = {owner[p] for i in clusters[c] for p in deps[i]} - {c}
        if any(stage_of[p] == len(stages) - 1 and lanes[p] != lanes[c] for p in preds):
            stages.append({})
        stages[-1].setdefault(lanes[c], []).extend(clusters[c])
        stage_of[c] = len(stages) - 1
    return stages


def _region(prog: Program, rid: int, ops: list[int], stage: int, stream: int, costs: StreamCosts) -> Region:
    t = _cluster_time(prog, ops, costs)
    kernels = sum(prog.ops[i].kernels for i in ops)
    return Region(rid, tuple(ops), (), (), stage, stream, t, kernels, 0)


def _predict(plan: Plan, profile: Profile, costs: StreamCosts) -> None:
    prog = plan.program
    compute = [op for op in prog.ops if not op.free]
    call = costs.xla_call_s + costs.xla_input_s * len(prog.inputs)  # jax.jit's dispatch, either mode
    plan.xla_s = call + sum(op.time_s + op.kernels * costs.xla_kernel_s for op in compute)
    total = costs.thunky_call_s
    plan.overlap_s = call
    for s in sorted({r.stage for r in plan.regions}):
        rs = [r for r in plan.regions if r.stage == s]
        host = sum(r.kernels for r in rs) * costs.thunky_kernel_s
        if len(rs) == 1:
            t = rs[0].time_s
        else:
            ops = [prog.ops[i] for r in rs for i in r.ops]
            work = sum(op.time_s * op.busy for op in ops)
            moved = sum(op.nbytes for op in ops) / (profile.bandwidth * costs.contention)
            t = max(max(r.time_s for r in rs), work, moved)
        plan.overlap_s += t
        total += max(t, host) + costs.sync_s * (len(rs) - 1) + costs.region_s * len(rs)
    crossing = {
        b.slot.storage for b in plan.buffers.values() if b.kind in ("input", "view", "output", "donated")
    }
    plan.thunky_s = total + costs.buffer_s * len(crossing)
    arena = sum(s.nbytes for s in plan.storages.values() if s.kind == "arena")
    temps = sum(r.temp_bytes for r in plan.regions)
    io = sum(s.nbytes for s in plan.storages.values() if s.kind in ("input", "output"))
    plan.scratch_bytes = arena + temps
    plan.peak_bytes = io + plan.scratch_bytes
    if not plan.regions:
        plan.notes.append("no computation: every output is an input, a view or a constant")

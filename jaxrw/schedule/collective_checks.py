"""Checks of collective plans (`collectives.CollectivePlan`) on the CPU: per lane, reads after
writes, consumers after their collective's `done`, no buffer written while an in-flight collective
holds it; across lanes, the collectives two devices share issued in the same order with the same
participants, and no cycle of devices waiting on each other (either deadlocks NCCL)."""

from __future__ import annotations

import math

from .collectives import (
    COMM,
    COMPUTE,
    CollectiveError,
    CollectivePlan,
    Lane,
    _peaks,
    _step_text,
    live_ranges,
)

__all__ = ["check", "validate"]


class _Order:
    """Happens-before on one lane: compute steps in order; a collective runs after every compute
    step before its start and after every collective started earlier (FIFO stream), and finishes
    before every compute step after its done."""

    def __init__(self, lane: Lane):
        self.start = {s.event: k for k, s in enumerate(lane.steps) if s.kind == "start"}
        self.done = {s.event: k for k, s in enumerate(lane.steps) if s.kind == "done"}

    def before(self, a: tuple[str, int], b: tuple[str, int]) -> bool:
        """a, b: ("input", -1) | ("run", step) | ("coll", collective id)."""
        if a[0] == "input":
            return True
        if a[0] == "run":
            return a[1] < (b[1] if b[0] == "run" else self.start.get(b[1], -1))
        if b[0] == "run":
            return self.done.get(a[1], math.inf) < b[1]
        sa, sb = self.start.get(a[1], math.inf), self.start.get(b[1], -1)
        return sa < sb or self.done.get(a[1], math.inf) < sb


def validate(plan: CollectivePlan) -> tuple[list[str], dict[int, int]]:
    """Every check; (problems, peak bytes per lane). Problems are returned, not raised."""
    problems: list[str] = []
    for lane in plan.lanes.values():
        if _check_steps(plan, lane, problems):
            _check_reads(plan, lane, problems)
            _check_buffers(plan, lane, problems)
    _check_issue_order(plan, problems)
    return problems, _peaks(plan)


def check(plan: CollectivePlan) -> dict[int, int]:
    """Validate `plan`; raise CollectiveError listing every problem, else return peak bytes per lane."""
    problems, peaks = validate(plan)
    if problems:
        listed = "\n  ".join(problems[:30])
        raise CollectiveError(f"invalid collective plan ({len(problems)} problems):\n  {listed}")
    return peaks


def _check_steps(plan: CollectivePlan, lane: Lane, problems: list[str]) -> bool:
    """Each compute region runs once on stream 0; each collective starts once on stream 1, then is
    done once. Returns False when the lane is too broken for the other checks."""
    n, d = len(problems), lane.device
    ran, started, finished = set[int](), set[int](), set[int]()
    for k, s in enumerate(lane.steps):
        r = plan.regions[s.regions[0]] if s.regions and 0 <= s.regions[0] < len(plan.regions) else None
        if s.kind == "run":
            if r is None or r.kind != "compute" or s.stream != COMPUTE or r.id in ran:
                problems.append(f"lane d{d} step {k}: a run step executes a new compute region on stream 0")
            else:
                ran.add(r.id)
        elif s.kind == "start":
            if r is None or r.collective != s.event or s.stream != COMM or s.event in started:
                problems.append(f"lane d{d} step {k}: start c{s.event} must issue it once on stream {COMM}")
            started.add(s.event)
        elif s.kind == "done":
            if s.event not in started or s.event in finished:
                problems.append(f"lane d{d} step {k}: done c{s.event} without a start, or twice")
            finished.add(s.event)
        else:
            problems.append(f"lane d{d} step {k}: unknown step kind {s.kind!r}")
    for r in plan.regions:
        if r.kind == "compute" and r.id not in ran:
            problems.append(f"lane d{d}: compute region r{r.id} never runs")
        if r.kind == "collective" and r.collective not in started:
            problems.append(f"lane d{d}: collective c{r.collective} is never issued")
        elif r.kind == "collective" and r.collective not in finished:
            problems.append(f"lane d{d}: collective c{r.collective} is never done (async_done missing)")
    return len(problems) == n


def _check_reads(plan: CollectivePlan, lane: Lane, problems: list[str]) -> None:
    d = lane.device
    order = _Order(lane)
    writers = {  # value -> ("run", region id) | ("coll", collective id)
        v: ("coll", r.collective) if r.kind == "collective" else ("run", r.id)
        for r in plan.regions
        for v in r.writes
    }
    run_at = {s.regions[0]: k for k, s in enumerate(lane.steps) if s.kind == "run"}
    kinds = {c.id: c.kind for c in plan.collectives}
    for k, s in enumerate(lane.steps):
        if s.kind == "done":
            continue
        r = plan.regions[s.regions[0]]
        me = ("run", k) if s.kind == "run" else ("coll", s.event)
        for v in r.reads:
            if v in plan.program.inputs:
                continue
            w = writers.get(v)
            src = ("run", run_at.get(w[1], math.inf)) if w and w[0] == "run" else w
            if src is not None and order.before(src, me):  # type: ignore[arg-type]
                continue
            what = f"lane d{d}: step {k} ({_step_text(s)}) reads v{v}"
            if w and w[0] == "coll" and me[0] == "run" and order.start.get(w[1], math.inf) < k:
                when = f"at step {order.done[w[1]]}" if w[1] in order.done else "(never done)"
                problems.append(
                    f"{what}, the result of collective c{w[1]} ({kinds[w[1]]}), before its done {when}"
                )
            else:
                by = "nothing" if w is None else (f"r{w[1]}" if w[0] == "run" else f"c{w[1]}")
                problems.append(f"{what} before it is written (by {by})")


def _check_buffers(plan: CollectivePlan, lane: Lane, problems: list[str]) -> None:
    """Values sharing bytes of a storage must have disjoint live ranges; a collective's operand is
    live until its done, so a write into it while the collective is in flight is reported as such."""
    d, live, order = lane.device, live_ranges(plan, lane), _Order(lane)
    kinds = {c.id: c.kind for c in plan.collectives}
    for v in live:
        if v not in lane.slots:
            problems.append(f"lane d{d}: v{v} crosses a region boundary but has no buffer")
    vals = sorted((v for v in live if v in lane.slots), key=lambda v: (lane.slots[v].storage, v))
    for i, a in enumerate(vals):
        sa = lane.slots[a]
        for b in vals[i + 1 :]:
            sb = lane.slots[b]
            if sb.storage != sa.storage:
                break
            (a0, a1), (b0, b1) = sa.byte_range, sb.byte_range
            if a1 <= b0 or b1 <= a0 or {a, b} <= set(plan.program.inputs):  # inputs are read-only
                continue
            (fa, la, ha), (fb, lb, hb) = live[a], live[b]
            if la < fb or lb < fa:
                continue
            for held, h, w, wfirst in ((a, ha, b, fb), (b, hb, a, fa)):
                c = next((c for c in h if order.start[c] <= wfirst <= order.done.get(c, math.inf)), None)
                if c is not None and w not in plan.program.inputs:
                    problems.append(
                        f"lane d{d}: v{w} is written at step {wfirst} into the bytes of v{held}, held by "
                        f"in-flight collective c{c} ({kinds[c]}) until its done (step {order.done.get(c)})"
                    )
                    break
            else:
                problems.append(
                    f"lane d{d}: v{a} (steps {fa}..{la}) and v{b} (steps {fb}..{lb}) share bytes of "
                    f"{sa.storage} while both are live"
                )


def _check_issue_order(plan: CollectivePlan, problems: list[str]) -> None:
    """Participants agree on each collective, and any two devices issue the collectives they share
    in the same order (NCCL matches collectives by issue order: a mismatch deadlocks)."""
    kinds = {c.id: c.kind for c in plan.collectives}
    issued = {d: [s.event for s in ln.steps if s.kind == "start"] for d, ln in plan.lanes.items()}
    seen: set[tuple[int, ...]] = set()  # (collective, device, device) pairs already reported
    for d, lane in plan.lanes.items():
        for c, peers in sorted(lane.peers.items()):
            if peers and d not in peers:
                problems.append(f"collective c{c} ({kinds.get(c)}): device {d} is not among its participants")
            for e in peers:
                other = plan.lanes[e].peers.get(c) if e in plan.lanes else None
                if other != peers and (c, *sorted((d, e))) not in seen:
                    seen.add((c, *sorted((d, e))))
                    problems.append(
                        f"collective c{c} ({kinds.get(c)}): participants differ: device {d} expects "
                        f"{list(peers)}, device {e} expects {list(other or ())}"
                    )
    devices = sorted(plan.lanes)
    for i, d in enumerate(devices):
        for e in devices[i + 1 :]:
            mine = [c for c in issued[d] if e in plan.lanes[d].peers.get(c, ())]
            theirs = [c for c in issued[e] if d in plan.lanes[e].peers.get(c, ())]
            if mine != theirs:
                a, b = (", ".join(f"c{c} {kinds.get(c)}" for c in cs) for cs in (mine, theirs))
                problems.append(
                    f"collectives issued in a different order on device {d} ({a}) and device {e} ({b}): "
                    "NCCL would deadlock"
                )
    if not problems:
        _check_wait_cycles(plan, issued, kinds, problems)


def _check_wait_cycles(
    plan: CollectivePlan, issued: dict[int, list[int]], kinds: dict[int, str], problems: list[str]
) -> None:
    """Orders that agree pairwise can still deadlock on a 2-D mesh: d0 waits in a collective over
    one axis for d1, which waits in one over the other axis for d3, and so on around a cycle. Runs
    each device's collectives in issue order (one FIFO stream), each finishing once every member
    of its group has reached it, and reports the devices left waiting."""
    peers = {d: lane.peers for d, lane in plan.lanes.items()}
    queues = {d: [(c, frozenset(peers[d].get(c) or (d,))) for c in cs] for d, cs in issued.items()}
    heads = dict.fromkeys(queues, 0)
    ready = True
    while ready:
        ready = False
        for d, q in queues.items():
            if heads[d] == len(q):
                continue
            head = q[heads[d]]  # (collective, group): ready once it heads every member's queue
            if all(
                e in queues and heads[e] < len(queues[e]) and queues[e][heads[e]] == head for e in head[1]
            ):
                for e in head[1]:
                    heads[e] += 1
                ready = True
    stuck = {d: queues[d][k] for d, k in heads.items() if k < len(queues[d])}
    if stuck:
        waits = "; ".join(
            f"device {d} in c{c} ({kinds.get(c)}) with {sorted(g)}" for d, (c, g) in sorted(stuck.items())
        )
        problems.append(f"collectives wait on each other in a cycle ({waits}): NCCL would deadlock")

"""Check a Plan without a GPU: ordering, synchronization, memory, and an executable simulation.

The ordering model is the one thunky programs run under: the main stream runs its steps in order;
regions started on a side stream run after every earlier main-stream step and before any main step
that follows the `done` of their event; nothing else orders two streams. Program inputs are written
before the first step; outputs are read after the last. `check` proves, for that model, that every
read follows its writes, that two values sharing memory are never live at once, and that every
event is joined; `simulate` runs the regions on NumPy memory in a random order the model allows,
so a missing edge or an overlapping buffer shows up as a wrong result.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .plan import Plan, ScheduleError
from .program import Lit

__all__ = ["PlanError", "Ordering", "ValidationReport", "check", "validate", "simulate"]

START, END = -1, -2  # virtual regions: writes the inputs / reads the outputs


class PlanError(ScheduleError):
    """A plan breaks an ordering, synchronization or memory rule; the message lists each problem."""


class Ordering:
    """Happens-before between regions (and the virtual START/END) as defined by the plan's steps."""

    def __init__(self, plan: Plan, problems: list[str]):
        self.pos: dict[int, int] = {}  # main-stream region -> step index
        self.task: dict[int, tuple[int, int]] = {}  # side region -> (event, index in its task)
        self.start: dict[int, int] = {}  # event -> step index
        self.done: dict[int, int] = {}
        self.stream: dict[int, int] = {}
        outstanding: dict[int, int] = {}  # stream -> event
        for k, s in enumerate(plan.steps):
            if s.kind == "run":
                if len(s.regions) != 1 or s.stream != 0:
                    problems.append(f"step {k}: a run step executes one region on stream 0")
                for r in s.regions:
                    self._place(r, problems)
                    self.pos[r] = k
            elif s.kind == "start":
                if s.stream < 1:
                    problems.append(
                        f"step {k}: event e{s.event} starts on stream {s.stream}; side streams are >= 1"
                    )
                if s.event in self.start:
                    problems.append(f"step {k}: event e{s.event} started twice")
                if s.stream in outstanding:
                    problems.append(f"step {k}: stream {s.stream} still runs e{outstanding[s.stream]}")
                outstanding[s.stream] = s.event
                self.start[s.event] = k
                self.stream[s.event] = s.stream
                for n, r in enumerate(s.regions):
                    self._place(r, problems)
                    self.task[r] = (s.event, n)
            elif s.kind == "done":
                if s.event not in self.start:
                    problems.append(f"step {k}: done e{s.event} before its start")
                elif s.event in self.done:
                    problems.append(f"step {k}: event e{s.event} joined twice")
                else:
                    self.done[s.event] = k
                    outstanding.pop(self.stream[s.event], None)
            else:
                problems.append(f"step {k}: unknown step kind {s.kind!r}")
        for e in self.start:
            if e not in self.done:
                problems.append(f"event e{e} is never joined (async_done missing)")
        for r in plan.regions:
            if r.id not in self.pos and r.id not in self.task:
                problems.append(f"region r{r.id} is in no step")
            elif r.id in self.task and r.stream != self.stream[self.task[r.id][0]]:
                problems.append(
                    f"region r{r.id} says stream {r.stream} but runs on {self.stream[self.task[r.id][0]]}"
                )

    def _place(self, r: int, problems: list[str]) -> None:
        if r in self.pos or r in self.task:
            problems.append(f"region r{r} appears in two steps")

    def hb(self, a: int, b: int) -> bool:
        """True when region `a` finishes before region `b` starts, on every execution."""
        known = (START, END, *self.pos, *self.task)
        if a not in known or b not in known:
            return False
        if a == START:
            return b != START
        if b == END:
            return a != END and (a in self.pos or self.done.get(self.task[a][0], math.inf) < math.inf)
        if a == END or b == START or a == b:
            return False
        if a in self.pos and b in self.pos:
            return self.pos[a] < self.pos[b]
        if a in self.pos:
            return self.pos[a] < self.start[self.task[b][0]]
        ea, na = self.task[a]
        if b in self.pos:
            return self.done.get(ea, math.inf) < self.pos[b]
        eb, nb = self.task[b]
        if ea == eb:
            return na < nb
        return self.done.get(ea, math.inf) < self.start[eb]


@dataclass
class ValidationReport:
    problems: list[str] = field(default_factory=list)
    peak_bytes: int = 0
    scratch_bytes: int = 0
    arena_live_bytes: int = 0  # most arena bytes live at once (a lower bound on the arena)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(plan: Plan) -> ValidationReport:
    """Validate `plan`; raise PlanError listing every problem found."""
    rep = validate(plan)
    if rep.problems:
        raise PlanError(f"invalid plan ({len(rep.problems)} problems):\n  " + "\n  ".join(rep.problems[:30]))
    return rep


def validate(plan: Plan) -> ValidationReport:
    """All checks; problems are returned, not raised."""
    rep = ValidationReport()
    order = Ordering(plan, rep.problems)
    prog = plan.program
    bufs = plan.buffers
    regions = {r.id: r for r in plan.regions}
    n_order = len(rep.problems)
    # each region has what it needs: its operands are its own results, reads, constants or literals
    for r in plan.regions:
        made = {o for i in r.ops for o in prog.ops[i].outs}
        for i in r.ops:
            for a in prog.ops[i].ins:
                if not (isinstance(a, Lit) or a in made or a in r.reads or a in prog.consts):
                    rep.problems.append(
                        f"r{r.id}: op {i} ({prog.ops[i].name}) reads v{a}, which it neither "
                        "computes nor reads from a buffer"
                    )
        for v in r.writes:
            if v not in made:
                rep.problems.append(f"r{r.id} writes v{v} but does not compute it")
            if v not in bufs:
                rep.problems.append(f"r{r.id} writes v{v}, which has no buffer")
    if len(rep.problems) > n_order:
        return rep
    # every read after its writes
    for r in plan.regions:
        for v in r.reads:
            b = bufs.get(v)
            if b is None:
                rep.problems.append(f"r{r.id} reads v{v}, which has no buffer")
                continue
            writers = _writers(plan, v)
            if not writers:
                rep.problems.append(f"r{r.id} reads v{v} ({b.kind}), which nothing writes")
            for w in writers:
                if not order.hb(w, r.id):
                    cross = w >= 0 and w != r.id and (regions[w].stream != r.stream or r.stream != 0)
                    why = " (another stream: no async_done orders them)" if cross else ""
                    where = "the program starts" if w < 0 else f"r{w} has written it"
                    rep.problems.append(f"r{r.id} reads v{v} before {where}{why}")
    # outputs complete before the end
    for j, name in plan.out_storage.items():
        v = prog.outputs[j]
        for w in _writers(plan, v):
            if not order.hb(w, END):
                rep.problems.append(f"output {j} (v{v}) written by r{w}, which is never joined")
        if bufs[v].slot.storage != name:
            rep.problems.append(
                f"output {j} (v{v}) is said to be in {name} but lives in {bufs[v].slot.storage}"
            )
    for j, v in enumerate(prog.outputs):
        if j in plan.out_storage or isinstance(v, Lit):
            continue
        if v not in prog.inputs and v not in prog.consts and v not in prog.views:
            rep.problems.append(f"output {j} (v{v}) is computed by a region but has no output buffer")
    _check_memory(plan, order, rep)
    return rep


def _writers(plan: Plan, v: int) -> tuple[int, ...]:
    b = plan.buffers[v]
    if b.kind in ("input", "view"):
        return (START,)
    return b.writers


def _accesses(plan: Plan, v: int) -> set[int]:
    b = plan.buffers[v]
    acc = set(_writers(plan, v)) | set(b.readers)
    if any(plan.program.outputs[j] == v for j in plan.out_storage):
        acc.add(END)
    # a join part is read whenever its join is
    if b.kind == "part" and b.parent is not None:
        acc |= set(plan.buffers[b.parent].readers)
        if plan.buffers[b.parent].kind == "output":
            acc.add(END)
    return acc


def _related(plan: Plan, a: int, b: int) -> bool:
    """a is b, or one contains the other (a view of an input, a part of a join)."""

    def chain(v: int) -> set[int]:
        out = {v}
        while (
            v in plan.buffers
            and plan.buffers[v].kind in ("view", "part")
            and plan.buffers[v].parent is not None
        ):
            v = plan.buffers[v].parent
            out.add(v)
        return out

    return bool(chain(a) & chain(b)) and (a in chain(b) or b in chain(a))


def _check_memory(plan: Plan, order: Ordering, rep: ValidationReport) -> None:
    prog = plan.program
    by_storage: dict[str, list[int]] = {}
    for v, b in plan.buffers.items():
        st = plan.storages.get(b.slot.storage)
        if st is None:
            rep.problems.append(f"v{v} lives in unknown storage {b.slot.storage}")
            continue
        if b.slot.dtype != st.dtype or str(prog.dtype(v)) != b.slot.dtype or b.slot.shape != prog.shape(v):
            rep.problems.append(
                f"v{v}: slot {b.slot.dtype}{list(b.slot.shape)} does not match the value "
                f"{prog.dtype(v)}{list(prog.shape(v))} or storage {st.dtype}"
            )
        if b.slot.offset < 0 or b.slot.offset + b.slot.size > st.size:
            rep.problems.append(
                f"v{v}: elements [{b.slot.offset}, {b.slot.offset + b.slot.size}) outside "
                f"{st.name} of {st.size}"
            )
        by_storage.setdefault(b.slot.storage, []).append(v)
    for name, vs in by_storage.items():
        vs = sorted(vs, key=lambda v: plan.buffers[v].slot.byte_range)
        for i, a in enumerate(vs):
            ra = plan.buffers[a].slot.byte_range
            for b in vs[i + 1 :]:
                rb = plan.buffers[b].slot.byte_range
                if rb[0] >= ra[1]:
                    break
                read_only = {plan.buffers[a].kind, plan.buffers[b].kind} <= {"input", "view"}
                if read_only or _related(plan, a, b):
                    continue
                if not (_ordered(plan, order, a, b) or _ordered(plan, order, b, a)):
                    rep.problems.append(f"v{a} and v{b} share bytes of {name} while both are live")
    # peak memory
    arena = sum(s.nbytes for s in plan.storages.values() if s.kind == "arena")
    temps = sum(r.temp_bytes for r in plan.regions)
    io = sum(s.nbytes for s in plan.storages.values() if s.kind in ("input", "output"))
    rep.scratch_bytes = arena + temps
    rep.peak_bytes = io + arena + temps
    if plan.peak_bytes and plan.peak_bytes != rep.peak_bytes:
        rep.problems.append(f"plan says peak {plan.peak_bytes} bytes; its buffers need {rep.peak_bytes}")
    stage = {r.id: r.stage for r in plan.regions}
    live_by_stage: dict[int, int] = {}
    for v, b in plan.buffers.items():
        if b.kind != "scratch":
            continue
        acc = [stage[r] for r in _accesses(plan, v) if r >= 0]
        for s in range(min(acc), max(acc) + 1) if acc else ():
            live_by_stage[s] = live_by_stage.get(s, 0) + _nbytes(b)
    rep.arena_live_bytes = max(live_by_stage.values(), default=0)
    if rep.arena_live_bytes > arena:
        rep.problems.append(f"arena holds {arena} bytes but {rep.arena_live_bytes} are live at once")


def _nbytes(b: Any) -> int:
    lo, hi = b.slot.byte_range
    return hi - lo


def _ordered(plan: Plan, order: Ordering, a: int, b: int) -> bool:
    """Every access of value a happens before every write of value b (or both are the same region
    using one identical buffer in place)."""
    same = plan.buffers[a].slot == plan.buffers[b].slot
    for w in _writers(plan, b):
        for x in _accesses(plan, a):
            if not (order.hb(x, w) or (same and x == w and w >= 0)):
                return False
    return True


# -- simulation -----------------------------------------------------------------------------------


def simulate(plan: Plan, args: Sequence[Any], *, seed: int = 0, jit: bool = False) -> list[np.ndarray]:
    """Run the plan on NumPy memory in a random order the steps allow; return the flat outputs.

    Outputs and scratch start as garbage (NaN or random bits), so a read of unwritten memory or of
    memory another value overwrote changes the result. `jit=True` compiles each region whole, as
    thunky does (slower for one-off programs, faster for big regions)."""
    prog = plan.program
    rng = random.Random(seed)
    problems: list[str] = []
    order = Ordering(plan, problems)
    if problems:
        raise PlanError("cannot simulate: " + "; ".join(problems))
    mem: dict[str, np.ndarray] = {}
    for name, st in plan.storages.items():
        if st.kind == "input":
            mem[name] = np.array(args[st.index], dtype=st.dtype).reshape(-1).copy()
        else:
            mem[name] = _garbage(st.size, np.dtype(st.dtype), rng)

    def view(v: int) -> np.ndarray:
        s = plan.buffers[v].slot
        return mem[s.storage][s.offset : s.offset + s.size].reshape(s.shape)

    pending = [r.id for r in plan.regions]
    regions = {r.id: r for r in plan.regions}
    while pending:
        ready = [r for r in pending if not any(order.hb(o, r) for o in pending if o != r)]
        rid = rng.choice(ready)
        pending.remove(rid)
        r = regions[rid]
        fn = prog.compute_fn(r.ops, r.reads, r.writes)
        outs = (jax.jit(fn) if jit else fn)(*[np.array(view(v)) for v in r.reads])
        for v, val in zip(r.writes, outs, strict=True):
            view(v)[...] = np.asarray(val)
    result = []
    for j, v in enumerate(prog.outputs):
        if j in plan.out_storage:
            result.append(np.array(view(v)))
        else:
            result.append(np.asarray(prog.outside(v, list(args))))
    return result


def _garbage(n: int, dtype: np.dtype, rng: random.Random) -> np.ndarray:
    nan = np.full(n, np.nan, dtype=dtype) if jax.numpy.issubdtype(dtype, jax.numpy.floating) else None
    if nan is not None and np.isnan(nan.astype(np.float32)).all():  # float4_e2m1fn has no NaN
        return nan
    raw = np.frombuffer(rng.randbytes(n * dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype).copy() if dtype.kind != "b" else (raw % 2).astype(bool)

"""Buffers of a plan: where every value that crosses a region boundary lives, and for how long.

Program inputs (and leading-axis views of them) stay where the caller put them; outputs get their
own storage, unless a donated input of the same shape is free by then; branch results that a join
stacks are written in place into the joined buffer; everything else goes to a scratch arena per
dtype, first-fit by stage live range (two values share bytes only when one is dead before the other
is written), with offsets aligned like XLA's own temporaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .program import Lit, Program

if TYPE_CHECKING:
    from .plan import Plan, Region

__all__ = ["Storage", "Slot", "Buffer", "place", "ARENA_ALIGN", "aligned"]

ARENA_ALIGN = 256  # bytes: XLA aligns its own temporaries this way; kernels may rely on it


def aligned(offset: int, dtype: np.dtype) -> int:
    """The first element offset at or after `offset` that is ARENA_ALIGN-byte aligned for `dtype`."""
    unit = max(1, ARENA_ALIGN // np.dtype(dtype).itemsize)
    return -(-offset // unit) * unit


@dataclass(frozen=True)
class Storage:
    """A base buffer: a program input, an output, or the scratch arena of one dtype."""

    name: str  # "in:3", "out:0", "arena:float32"
    kind: str  # "input" | "output" | "arena"
    dtype: str
    shape: tuple[int, ...]
    index: int = -1  # flat input or output index

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Slot:
    """Where a value lives: `size` elements at element `offset` of a storage, viewed as `shape`."""

    storage: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def byte_range(self) -> tuple[int, int]:
        item = np.dtype(self.dtype).itemsize
        return self.offset * item, (self.offset + self.size) * item


@dataclass
class Buffer:
    """A value that crosses a region boundary (or the thunky boundary) and the memory it uses."""

    value: int
    kind: str  # "input" | "view" | "output" | "part" | "scratch" | "donated"
    slot: Slot
    writers: tuple[int, ...] = ()  # regions
    readers: tuple[int, ...] = ()
    parent: int | None = None  # the value whose memory contains this one (input of a view, join of a part)


def place(plan: Plan) -> None:
    """Reads and writes of every region, and a slot for every value that crosses a boundary."""
    prog = plan.program
    outputs = [o for o in prog.outputs if not isinstance(o, Lit)]
    # a region that reads a join it writes parts of evaluates the join itself (it reads its
    # inputs before it writes, so it cannot read the parts back from memory)
    for r in plan.regions:
        mine = {o for i in r.ops for o in prog.ops[i].outs}
        extra = set()
        for i in r.ops:
            for a in prog.ops[i].ins:
                if not isinstance(a, Lit) and a in prog.joins and any(p in mine for p, _ in prog.joins[a]):
                    extra.update(prog.join_ops[a])
        r.ops = tuple(sorted(set(r.ops) | extra))
    region_of = {i: r.id for r in plan.regions for i in r.ops}
    reads: dict[int, set[int]] = {r.id: set() for r in plan.regions}
    writes: dict[int, set[int]] = {r.id: set() for r in plan.regions}

    def producer_region(v: int) -> int | None:
        pid = prog.producer.get(v)
        return None if pid is None else region_of.get(pid)

    needed_joins = {o for o in outputs if o in prog.joins}
    for r in plan.regions:
        for i in r.ops:
            for a in prog.ops[i].ins:
                if isinstance(a, Lit) or a in prog.consts or producer_region(a) == r.id:
                    continue
                reads[r.id].add(a)
                if a in prog.joins:
                    needed_joins.add(a)
                elif producer_region(a) is not None:
                    writes[producer_region(a)].add(a)
    for j in needed_joins:
        for p, _ in prog.joins[j]:
            writes[producer_region(p)].add(p)
    for o in outputs:
        pr = producer_region(o)
        if pr is not None and o not in prog.joins:
            writes[pr].add(o)
    for r in plan.regions:
        r.reads, r.writes = tuple(sorted(reads[r.id])), tuple(sorted(writes[r.id]))
        r.temp_bytes = _temp_bytes(prog, r)

    readers: dict[int, list[int]] = {}
    for r in plan.regions:
        for v in r.reads:
            readers.setdefault(v, []).append(r.id)
    writers = {
        v: [r.id for r in plan.regions if v in r.writes] for v in {v for r in plan.regions for v in r.writes}
    }
    stage = {r.id: r.stage for r in plan.regions}
    storages = plan.storages
    buffers = plan.buffers

    for i, v in enumerate(prog.inputs):
        storages[f"in:{i}"] = Storage(f"in:{i}", "input", str(prog.dtype(v)), prog.shape(v), i)
    in_index = {v: i for i, v in enumerate(prog.inputs)}
    for v in sorted(set(readers) | set(writers)):
        if v in in_index:
            buffers[v] = Buffer(v, "input", Slot(f"in:{in_index[v]}", 0, prog.shape(v), str(prog.dtype(v))))
        elif v in prog.views:
            base, off = prog.views[v]
            buffers[v] = Buffer(
                v, "view", Slot(f"in:{in_index[base]}", off, prog.shape(v), str(prog.dtype(v))), parent=base
            )

    # outputs: their own storage, or a donated input of the same shape once nothing else reads it
    hosted: set[int] = set()
    for j, o in enumerate(prog.outputs):
        if isinstance(o, Lit) or o in buffers or not (o in writers or o in prog.joins):
            continue
        host = _donated_host(plan, o, writers.get(o, []), readers, hosted, stage)
        if host is not None:
            hosted.add(host)
            name = f"in:{host}"
            buffers[o] = Buffer(
                o, "donated", Slot(name, 0, prog.shape(o), str(prog.dtype(o))), parent=prog.inputs[host]
            )
        else:
            name = f"out:{j}"
            storages[name] = Storage(name, "output", str(prog.dtype(o)), prog.shape(o), j)
            buffers[o] = Buffer(o, "output", Slot(name, 0, prog.shape(o), str(prog.dtype(o))))
        plan.out_storage[j] = name
    for j, o in enumerate(prog.outputs):  # repeated outputs share the first one's storage
        if (
            j not in plan.out_storage
            and not isinstance(o, Lit)
            and o in buffers
            and buffers[o].kind in ("output", "donated")
        ):
            plan.out_storage[j] = buffers[o].slot.storage

    # scratch: joins that are not outputs, then every other crossing value, first-fit by live range
    live: dict[int, tuple[int, int]] = {}
    for v in set(readers) | set(writers) | needed_joins:
        if v in buffers or (v in prog.part_of and prog.part_of[v][0] in needed_joins):
            continue
        ws = writers.get(v, []) or [w for p, _ in prog.joins.get(v, []) for w in writers.get(p, [])]
        parts = [p for p, _ in prog.joins.get(v, [])]
        acc = ws + readers.get(v, []) + [r for p in parts for r in readers.get(p, []) + writers.get(p, [])]
        live[v] = (min(stage[r] for r in acc), max(stage[r] for r in acc))
    arena_end: dict[str, int] = {}
    placed: list[tuple[int, str, int, int, int, int]] = []  # value, dtype, start, end, s0, s1
    for v in sorted(live, key=lambda x: (-prog.nbytes(x), x)):
        dt = str(prog.dtype(v))
        size = int(math.prod(prog.shape(v)))
        s0, s1 = live[v]
        busy = sorted((a, b) for (_, d, a, b, t0, t1) in placed if d == dt and not (t1 < s0 or s1 < t0))
        off = 0
        for a, b in busy:
            if off + size <= a:
                break
            off = max(off, aligned(b, prog.dtype(v)))
        placed.append((v, dt, off, off + size, s0, s1))
        arena_end[dt] = max(arena_end.get(dt, 0), off + size)
        buffers[v] = Buffer(v, "scratch", Slot(f"arena:{dt}", off, prog.shape(v), dt))
    for dt, n in arena_end.items():
        storages[f"arena:{dt}"] = Storage(f"arena:{dt}", "arena", dt, (n,))
    # parts live inside their join
    for j in needed_joins:
        js = buffers[j].slot
        for p, off in prog.joins[j]:
            buffers[p] = Buffer(
                p, "part", Slot(js.storage, js.offset + off, prog.shape(p), str(prog.dtype(p))), parent=j
            )
    for v, b in buffers.items():
        ws = writers.get(v, [])
        if v in prog.joins:
            ws = [w for p, _ in prog.joins[v] for w in writers.get(p, [])]
        b.writers, b.readers = tuple(sorted(set(ws))), tuple(sorted(set(readers.get(v, []))))


def _donated_host(
    plan: Plan,
    o: int,
    out_writers: list[int],
    readers: dict[int, list[int]],
    hosted: set[int],
    stage: dict[int, int],
) -> int | None:
    prog = plan.program
    if o in prog.joins or len(out_writers) != 1:
        return None
    (w,) = out_writers
    for i in plan.donate:
        x = prog.inputs[i]
        if i in hosted or prog.shape(x) != prog.shape(o) or prog.dtype(x) != prog.dtype(o):
            continue
        uses = [
            (r, v) for v, rs in readers.items() for r in rs if v == x or prog.views.get(v, (None,))[0] == x
        ]
        if all(stage[r] < stage[w] or (r == w and v == x) for r, v in uses):
            return i
    return None


def _temp_bytes(prog: Program, r: Region) -> int:
    """Peak bytes of kernel results that stay inside the region (XLA's temporaries there)."""
    last: dict[int, int] = {}
    for i in r.ops:
        for a in prog.ops[i].ins:
            if not isinstance(a, Lit):
                last[a] = i
    live, peak = 0, 0
    ends: dict[int, int] = {}
    for i in r.ops:
        op = prog.ops[i]
        for o in op.outs:
            if o in r.writes or op.kernels == 0 or o not in last:
                continue
            live += prog.nbytes(o)
            ends[last[o]] = ends.get(last[o], 0) + prog.nbytes(o)
        peak = max(peak, live)
        live -= ends.pop(i, 0)
    return peak

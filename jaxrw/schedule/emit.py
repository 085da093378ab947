"""Emit a Plan as a `thunky.jit` program the user calls like a function of the flat inputs.

The emitted function is one `jax.jit`: fresh Refs for the outputs (donated inputs become Refs that
hold an output in place), one `thunky.jit` body that runs the plan's steps (`call_jax` per region on
views of the buffers; `async_start`/`async_done` for side streams), and the outputs read back.

The program's constants (weights closed over, or folded when it was optimized) stay in the regions'
code, as jax.jit keeps them in its own: thunky compiles each region with them embedded
(`hoist_constants_as_args=False`). On the H200 (bench/HISTORY.md, sixteenth lease, h5)
experts_equal's thunky program ran 211 µs a call with its 128 MiB of bfloat16 weights embedded,
270 µs with them passed as one packed buffer (XLA's own program: 280 µs), 307 µs as 64 buffers
(why the packed buffer costs 59 µs is not established). Embedding costs optimization time: 27 s
against 9 s for that case (XLA's compile: 2-4 s).

`JAXRW_BIND_CONSTANTS=<bytes>` (read when a program is emitted) passes constants of at least that
size as buffers instead, packed into one flat buffer per dtype (each at an offset aligned like an
arena slot) that the regions read through views, since each argument of the executable costs host
time on every call (~1.3 µs on the H200 host, called directly). The `ThunkyProgram` holds the
packs and appends them to every call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InvalidOptionError
from .buffers import aligned
from .direct import ThunkyProgram
from .plan import Plan

__all__ = [
    "emit",
    "BIND_CONSTANTS_VARIABLE",
    "bind_constant_bytes",
    "embedded_constant_bytes",
    "ConstantPacks",
    "pack_constants",
]

BIND_CONSTANTS_VARIABLE = "JAXRW_BIND_CONSTANTS"


def bind_constant_bytes() -> int | None:
    """From JAXRW_BIND_CONSTANTS: None (unset or empty) leaves every constant in the regions' code
    (faster calls, slower optimization; see above); a size passes constants of at least that many
    bytes as packed buffers and leaves smaller ones in the code."""
    text = os.environ.get(BIND_CONSTANTS_VARIABLE, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise InvalidOptionError(
            f"{BIND_CONSTANTS_VARIABLE} must be a whole number of bytes (e.g. 65536), or empty to leave "
            f"constants in the code; got {text!r}"
        )
    return int(text)


def _layout(plan: Plan) -> tuple[list[str], list[str], list[str], set[str]]:
    """Storage names in argument order: inputs read, outputs, arenas; and inputs that host outputs."""
    used = {b.slot.storage for b in plan.buffers.values()}
    st = plan.storages
    ins = sorted((n for n in used if st[n].kind == "input"), key=lambda n: st[n].index)
    outs = sorted((n for n in used if st[n].kind == "output"), key=lambda n: st[n].index)
    arenas = sorted(n for n in used if st[n].kind == "arena")
    hosted = {b.slot.storage for b in plan.buffers.values() if b.kind == "donated"}
    return ins, outs, arenas, hosted


def _constants_read(plan: Plan) -> dict[int, set[int]]:
    """Region id -> the program's constants its ops read."""
    prog = plan.program
    return {
        r.id: {a for i in r.ops for a in prog.ops[i].ins if isinstance(a, int) and a in prog.consts}
        for r in plan.regions
    }


def _passed(value: Any, least: int | None) -> bool:
    """Whether a constant goes to the regions as a buffer under the setting `least` (bytes)."""
    return least is not None and _nbytes(value) >= least


def region_constants(plan: Plan) -> dict[int, list[int]]:
    """Region id -> the constants it reads that are passed as buffers, in value order."""
    consts, least = plan.program.consts, bind_constant_bytes()
    return {
        rid: sorted(c for c in read if _passed(consts[c], least))
        for rid, read in _constants_read(plan).items()
    }


def bound_constants(plan: Plan) -> list[int]:
    """The program's constants that regions read and that are passed as buffers, in value order."""
    return _union(region_constants(plan))


def embedded_constant_bytes(plan: Plan) -> int:
    """Bytes of the constants the regions read that stay in their code (not passed as buffers):
    what thunky compiles into them."""
    consts, least = plan.program.consts, bind_constant_bytes()
    read = set().union(*_constants_read(plan).values())
    return sum(_nbytes(consts[c]) for c in read if not _passed(consts[c], least))


def _union(used: dict[int, list[int]]) -> list[int]:
    return sorted({c for cs in used.values() for c in cs})


@dataclass(frozen=True)
class ConstantPacks:
    """Bound constants packed by dtype: `arrays` (flat, one per dtype, on the host) and, per
    constant, `where[c]` = (index of its pack, element offset, shape)."""

    arrays: list[np.ndarray]
    where: dict[int, tuple[int, int, tuple[int, ...]]]


def pack_constants(consts: dict[int, Any], bound: Sequence[int]) -> ConstantPacks:
    """`bound` constants of `consts` packed into one flat array per dtype (in order of first use),
    each at an offset aligned like an arena slot (buffers.aligned), the padding zero."""
    values = {c: np.asarray(consts[c]) for c in bound}
    dtypes = list(dict.fromkeys(v.dtype for v in values.values()))
    where: dict[int, tuple[int, int, tuple[int, ...]]] = {}
    ends = [0] * len(dtypes)
    for c, v in values.items():
        i = dtypes.index(v.dtype)
        offset = aligned(ends[i], v.dtype)
        where[c] = (i, offset, v.shape)
        ends[i] = offset + v.size
    arrays = [np.zeros(n, d) for n, d in zip(ends, dtypes, strict=True)]
    for c, (i, offset, _) in where.items():
        arrays[i][offset : offset + values[c].size] = values[c].ravel()
    return ConstantPacks(arrays, where)


def _nbytes(value: Any) -> int:
    """Size of a constant, without copying a device array to the host."""
    return int(value.nbytes) if hasattr(value, "nbytes") else np.asarray(value).nbytes


def _view(flat: Any, offset: int, shape: tuple[int, ...]) -> Any:
    """The contiguous part of a flat Ref at `offset` (elements), shaped `shape`."""
    size = int(np.prod(shape))
    view = flat if offset == 0 and size == flat.shape[0] else flat.at[offset : offset + size]
    return view if len(shape) == 1 else view.reshape(*shape)


def _kernel(plan: Plan, used: dict[int, list[int]], packs: ConstantPacks) -> Callable[..., None]:
    """The `thunky.jit` body: arguments are the input storages, output storages (Refs), the packs
    of bound constants (`used` per region: region_constants), then arenas."""
    from jax.experimental import thunky

    prog = plan.program
    ins, outs, arenas, _ = _layout(plan)
    names = ins + outs
    regions = {r.id: r for r in plan.regions}

    def body(*refs: Any) -> None:
        n_packs = len(packs.arrays)
        base = dict(zip(names + arenas, refs[: len(names)] + refs[len(names) + n_packs :], strict=True))
        pack_refs = refs[len(names) : len(names) + n_packs]

        def const(c: int) -> Any:
            i, offset, shape = packs.where[c]
            return _view(pack_refs[i], offset, shape)

        def ref(v: int) -> Any:
            s = plan.buffers[v].slot
            st = plan.storages[s.storage]
            b = base[s.storage]
            if s.offset == 0 and s.shape == st.shape:
                return b
            flat = b if len(st.shape) == 1 else b.reshape(st.size)
            return _view(flat, s.offset, s.shape)  # a slice: an integer index would be traced

        def run(rid: int) -> None:
            r = regions[rid]
            reads = [*r.reads, *used[rid]]  # a constant read is a value like any other here
            compute = prog.compute_fn(r.ops, reads, r.writes)
            n = len(reads)

            def region(*rs: Any) -> None:
                vals = compute(*[x[...] for x in rs[:n]])
                for o, val in zip(rs[n:], vals, strict=True):
                    o[...] = val

            region.__name__ = f"jaxrw_region_{rid}"
            read_refs = [ref(v) for v in r.reads] + [const(c) for c in used[rid]]
            thunky.call_jax(region, *read_refs, *[ref(v) for v in r.writes])

        tokens: dict[int, Any] = {}
        for step in plan.steps:
            if step.kind == "run":
                run(step.regions[0])
            elif step.kind == "start":

                def task(rids: tuple[int, ...] = step.regions) -> None:
                    for rid in rids:
                        run(rid)

                tokens[step.event] = thunky.async_start(task, stream_id=step.stream - 1)
            else:
                thunky.async_done(tokens.pop(step.event))

    scratch = tuple(jax.ShapeDtypeStruct(plan.storages[n].shape, plan.storages[n].dtype) for n in arenas)
    return thunky.jit(body, scratch_shapes=scratch)


def emit(plan: Plan, donate: Sequence[int] = (), out_tree: Any = None) -> ThunkyProgram:
    """The plan as a function of the flat inputs returning the flat outputs (a list, or `out_tree`
    unflattened): a ThunkyProgram around one jax.jit, which takes the bound constants after the
    inputs. Tracing it works anywhere thunky imports; running it needs CUDA."""
    prog = plan.program
    ins, outs, _arenas, hosted = _layout(plan)
    used = region_constants(plan)
    packs = pack_constants(prog.consts, _union(used))
    kernel = _kernel(plan, used, packs)
    storages = plan.storages
    n_in = len(prog.inputs)

    def scheduled(*args: Any) -> Any:
        args, consts = args[:n_in], args[n_in:]
        in_refs = [
            jax.new_ref(args[storages[n].index]) if n in hosted else args[storages[n].index] for n in ins
        ]
        out_refs = [jax.new_ref(jnp.empty(storages[n].shape, storages[n].dtype)) for n in outs]
        kernel(*in_refs, *out_refs, *consts)
        held = dict(zip(ins, in_refs, strict=True)) | dict(zip(outs, out_refs, strict=True))
        result = [
            held[plan.out_storage[j]][...] if j in plan.out_storage else jnp.asarray(prog.outside(v, args))
            for j, v in enumerate(prog.outputs)
        ]
        return result if out_tree is None else jax.tree_util.tree_unflatten(out_tree, result)

    scheduled.__name__ = "jaxrw_scheduled"
    values = [jnp.asarray(a) for a in packs.arrays]  # on the device once, not per call
    return ThunkyProgram(jax.jit(scheduled, donate_argnums=tuple(donate)), bound=values)

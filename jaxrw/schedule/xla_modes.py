"""XLA's own GPU schedules that `schedule="auto"` weighs: command-buffer (CUDA graph) settings.

XLA:GPU records runs of at least `xla_gpu_graph_min_graph_size` (default 5) capturable kernels
into CUDA graphs and launches the rest one by one from the host. Programs of many small kernels
(decode steps, small GEMM chains) are bound by those launches on the H200's host: recording every
run ("xla-graphs") measured 1.1-1.3x on small matvec cases, and letting the graph's independent
kernels overlap as well ("xla-concurrent") 1.3-1.4x on the llama2.c decode step
(bench/HISTORY.md). Neither changes the arithmetic: the same HLO runs,
launched differently. Options passed to a jit cannot be nested in another jit's trace
(`TopLevel` keeps such calls on the plain program).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = [
    "XLA_MODES",
    "XLA_REGIONS",
    "jit_mode",
    "tuned_jit",
    "without_frame",
    "TopLevel",
    "is_nested_options_error",
    "launch_s",
]

XLA_MODES: dict[str, dict[str, Any]] = {
    "xla-graphs": {"xla_gpu_graph_min_graph_size": 1},
    "xla-concurrent": {
        "xla_gpu_command_buffer_scheduling_mode": "CONCURRENT",
        "xla_gpu_graph_min_graph_size": 1,
    },
}
# the most host time per kernel these modes saved on the H200 host (llama288's decode step, 124
# kernels: 1095 µs without graphs, ~600 µs with XLA's default ones); an upper bound for `launch_s`
LAUNCH_S_PER_KERNEL = 5e-6
# concurrent regions only: measured no gain on the H200's expert cases (kept for bench/schedule_h200.py)
XLA_REGIONS = {"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT_REGIONS"}


def jit_mode(fn: Callable, mode: str, donate: Sequence[int] = (), **jit_kwargs: Any) -> Any:
    """jax.jit of `fn` compiled under XLA mode `mode` ("xla" or a key of XLA_MODES)."""
    options = XLA_MODES.get(mode)
    if options:
        jit_kwargs["compiler_options"] = options
    jit_kwargs.setdefault("donate_argnums", tuple(donate))
    return jax.jit(fn, **jit_kwargs)


def tuned_jit(fn: Callable, mode: str, plain: Any = None, **jit_kwargs: Any) -> Any:
    """A callable jax.jit of `fn` under XLA mode `mode`: for "xla" the plain jit; else a TopLevel of
    the jit with the mode's options and `plain` (the jit without them, made here unless given),
    which runs inside another jit's trace."""
    plain = jax.jit(fn, **jit_kwargs) if plain is None else plain
    if mode == "xla":
        return plain
    return TopLevel(jit_mode(fn, mode, **jit_kwargs), plain)


def without_frame(f: Any) -> tuple[Callable, Callable | None]:
    """(what to call, what to call instead inside another jit's trace, or None) for a tuned_jit
    result: a TopLevel's jit with options and its plain twin, so a hot call path can catch
    `is_nested_options_error` itself instead of paying TopLevel's Python frame on every call."""
    return (f.tuned, f.plain) if isinstance(f, TopLevel) else (f, None)


def is_nested_options_error(e: BaseException) -> bool:
    """The error jax raises when a jit with compiler options is traced inside another jit."""
    return isinstance(e, ValueError) and "can only be passed to top-level" in str(e)


class TopLevel:
    """Calls `tuned` (a jit with compiler options); inside another jit's trace, where jax rejects
    those options, calls `plain` (the same program without them) instead."""

    __slots__ = ("tuned", "plain")

    def __init__(self, tuned: Callable, plain: Callable):
        self.tuned, self.plain = tuned, plain

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.tuned(*args, **kwargs)
        except ValueError as e:
            if not is_nested_options_error(e):
                raise
            return self.plain(*args, **kwargs)


def launch_s(program: Any) -> float:
    """The most kernel-launch time per call XLA's modes could save on `program` (schedule.Program):
    its kernels times LAUNCH_S_PER_KERNEL. Auto does not compile the modes when this is under its
    margin of the measured call (an 8192-wide matrix chain: 2 kernels in 2.9 ms)."""
    return LAUNCH_S_PER_KERNEL * sum(op.kernels for op in program.ops if not op.free)

"""How the benchmarks measure: `jaxrw.rewrite.measure` (one implementation for autotune,
calibration, the cost check and the benchmarks; its docstring describes the method)."""

from __future__ import annotations

from ..rewrite.measure import Timing, block, compile_and_warm, measure

__all__ = ["Timing", "measure", "block", "compile_and_warm"]

"""How close a rewritten program's results must be to the original's: the tolerance per dtype and
the relative error that `verify`, the benchmarks and the tests measure."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .errors import VerificationError

__all__ = ["tolerance", "relative_error", "check_outputs"]


def tolerance(dtype: Any) -> float:
    """Relative (norm-wise) error allowed between rewritten and original results for a dtype.
    float32 allows TF32 rounding: GPUs run float32 matmuls as TF32 under jax's default precision."""
    dt = np.dtype(dtype)
    if dt == np.float64 or dt == np.complex128:
        return 1e-9
    if dt.kind in "fc" and dt.itemsize >= 4:
        return 5e-3
    if dt.kind in "fc" or str(dt) == "bfloat16":
        return 5e-2
    return 0.0


def relative_error(got: Any, want: Any, nonfinite_kind: bool = True) -> float:
    """||got - want|| / ||want|| in float64, complex128 for complex values (0 when both are zero;
    inf when shapes differ or NaN/Inf appear in one but not the other, or, with `nonfinite_kind`,
    differ in kind: NaN against ±Inf)."""
    g, w = np.asarray(got), np.asarray(want)
    wide = np.complex128 if np.iscomplexobj(g) or np.iscomplexobj(w) else np.float64  # keep imaginary parts
    g, w = g.astype(wide), w.astype(wide)
    if g.shape != w.shape:
        return float("inf")
    gf, wf = np.isfinite(g), np.isfinite(w)
    if not np.array_equal(gf, wf):
        return float("inf")
    if nonfinite_kind and not np.array_equal(g[~gf], w[~wf], equal_nan=True):
        return float("inf")
    num = np.linalg.norm(g[gf] - w[gf])  # Inf - Inf is never computed
    den = np.linalg.norm(w[wf])
    if den == 0:
        return float(num)
    return float(num / den)


def check_outputs(got: Any, want: Any, name: str, numerics: str = "strict") -> None:
    """`verify`: raise VerificationError unless every output of the rewritten program is within
    its dtype's tolerance of jax.jit's (PRNG keys: their bits, exactly) and finite exactly where
    jax.jit's is; a NaN where jax.jit has ±Inf, or the other way round, only under "strict" (the
    other modes allow that swap: docs/numerics.md, "Inf and NaN")."""
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    kind = numerics == "strict"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.extended):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        tol, err = tolerance(jax.numpy.asarray(w).dtype), relative_error(g, w, nonfinite_kind=kind)
        if err > tol:
            raise VerificationError(
                f"{name}: output {i} differs from jax.jit: relative error {err:.3g} > {tol:.3g}"
            )

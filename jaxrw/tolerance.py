"""How close a rewritten program's results must be to the original's: the tolerance per dtype and
the relative error that `verify`, the benchmarks and the tests measure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .errors import VerificationError

__all__ = ["tolerance", "relative_error", "check_outputs"]


def tolerance(dtype: Any) -> float:
    """Relative (norm-wise) error allowed between rewritten and original results for a dtype.
    float32 allows TF32 rounding: GPUs run float32 matmuls as TF32 under jax's default precision.
    Integers, booleans and other exact types: none."""
    dt = np.dtype(dtype)
    if not jax.numpy.issubdtype(dt, jax.numpy.inexact):  # ml_dtypes' floats have numpy kind "V"
        return 0.0
    if dt == np.float64 or dt == np.complex128:
        return 1e-9
    if dt.itemsize >= 4:
        return 5e-3
    # 16 bits: a few roundings of bfloat16 (eps 2^-7); 8 bits: four unit roundoffs of their own
    # (float8_e5m2's one rounding alone is up to 0.125 of a value), at most 0.5, so that a result
    # of zeros (relative error 1) never passes, even in float4
    return min(max(5e-2, 2 * float(jax.numpy.finfo(dt).eps)), 0.5)


# how `relative_error` takes NaN and Inf, by the numerics mode whose contract it checks
# (docs/numerics.md, "Inf and NaN"): the same values, finite in the same places, or compared only
# where both are finite ("fast" may keep an input's Inf local, or lose an overflow)
NONFINITE_BY_NUMERICS = {"strict": "same", "default": "finite", "fast": "free"}


def relative_error(got: Any, want: Any, nonfinite: str = "same") -> float:
    """||got - want|| / ||want|| in float64, complex128 for complex values, over the entries finite
    in both (0 when both are zero; inf when shapes differ). `nonfinite`: "same" (inf unless NaN and
    ±Inf appear in the same places, the same values), "finite" (inf unless finite in the same
    places: a NaN may stand where the other has an Inf) or "free" (not compared)."""
    g, w = np.asarray(got), np.asarray(want)
    wide = np.complex128 if np.iscomplexobj(g) or np.iscomplexobj(w) else np.float64  # keep imaginary parts
    g, w = g.astype(wide), w.astype(wide)
    if g.shape != w.shape:
        return float("inf")
    gf, wf = np.isfinite(g), np.isfinite(w)
    if nonfinite != "free" and not np.array_equal(gf, wf):
        return float("inf")
    if nonfinite == "same" and not np.array_equal(g[~gf], w[~wf], equal_nan=True):
        return float("inf")
    both = gf & wf
    num = np.linalg.norm(g[both] - w[both])  # Inf - Inf is never computed
    den = np.linalg.norm(w[both])
    if den == 0:
        return float(num)
    return float(num / den)


def check_outputs(
    got: Any, want: Any, name: str, numerics: str = "strict", scales: Callable[[], list | None] | None = None
) -> None:
    """`verify`: raise VerificationError unless every output of the rewritten program is within
    its dtype's tolerance of jax.jit's (PRNG keys: their bits, exactly), with NaN and Inf as the
    `numerics` mode promises them (NONFINITE_BY_NUMERICS). A floating-point output further than
    that from jax.jit's relative to its own size is still within it where each entry is within
    the tolerance of the scale of the rounding it holds, where `scales` (called then, once) gives
    those (error_scale): a residual or an objective near zero rounds at the scale of its terms in
    any order of evaluation."""
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    nonfinite = NONFINITE_BY_NUMERICS.get(numerics, "same")
    term_scales: list | None = None
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.extended):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        dtype = jax.numpy.asarray(w).dtype
        tol, err = tolerance(dtype), relative_error(g, w, nonfinite)
        if err <= tol:
            continue
        scaled = None
        if (
            np.isfinite(err) and jax.numpy.issubdtype(dtype, jax.numpy.inexact) and scales is not None
        ):  # not a NaN or Inf moved
            term_scales = (scales() or []) if term_scales is None else term_scales
            scaled = error_per_entry(g, w, term_scales[i], tol) if i < len(term_scales) else None
        if scaled is None or scaled > tol:
            beside = (
                "" if scaled is None else f" ({scaled:.3g} of the rounding its terms allow, entry by entry)"
            )
            raise VerificationError(
                f"{name}: output {i} differs from jax.jit: relative error {err:.3g} > {tol:.3g}{beside}"
            )


# how many times an entry's rounding scale (error_scale: one standard deviation of the error jax.jit's
# program holds there) a correct program may differ by: room for the estimate's randomness and for
# operations that round by a few units (a review measured 3-4 on least-squares residuals)
ROUNDINGS_ALLOWED = 32


def error_per_entry(got: Any, want: Any, scale: Any, tol: float) -> float:
    """The largest |got - want| over the entries finite in both, each relative to the larger of
    jax.jit's magnitude there, ROUNDINGS_ALLOWED times its rounding `scale` over `tol`, and `tol`
    times jax.jit's largest magnitude in the output: compared with `tol`, an entry may be off by
    the tolerance, by ROUNDINGS_ALLOWED roundings, or near zero by tol² of the largest entry."""
    g, w = np.asarray(got), np.asarray(want)
    wide = np.complex128 if np.iscomplexobj(g) or np.iscomplexobj(w) else np.float64
    g, w, s = g.astype(wide), w.astype(wide), np.asarray(scale, dtype=np.float64)
    if g.shape != w.shape or s.shape != w.shape:
        return float("inf")
    both = np.isfinite(g) & np.isfinite(w)
    if not both.any():
        return 0.0
    magnitude = np.abs(w[both])
    rounding = ROUNDINGS_ALLOWED * np.where(np.isfinite(s), s, 0.0)[both] / tol
    size = np.maximum(np.maximum(magnitude, rounding), tol * magnitude.max())
    diff = np.abs(g[both] - w[both])
    # where a size is 0 (jax.jit's output zero and exact there), any difference is too much
    ratio = np.divide(diff, size, out=np.where(diff > 0, np.inf, 0.0), where=size > 0)
    return float(ratio.max())

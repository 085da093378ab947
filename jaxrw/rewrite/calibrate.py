"""`jaxrw calibrate`: measure this device's matrix rates, elementwise rate, bandwidth, launch
overhead, small-GEMM efficiency and whether a GEMM reads a transposed operand for free, and save
them as the default profile for this device kind."""

from __future__ import annotations

import argparse
import math
from typing import Any

import jax
import jax.numpy as jnp

from .. import compat
from .measure import measure, time_one
from .profiles import CPU, H200, Profile, cache_dir, save_profile

__all__ = ["calibrate", "main"]


def _chain(n: int, dtype: Any, k: int):
    """k dependent n×n products in one compiled program (unrolled: k kernels, one dispatch)."""
    k1, k2 = jax.random.split(jax.random.key(n))
    a = (jax.random.normal(k1, (n, n), jnp.float32) / math.sqrt(n)).astype(dtype)
    x = jax.random.normal(k2, (n, n), jnp.float32).astype(dtype)

    def f(a, x):
        for _ in range(k):
            x = a @ x
        return x

    return jax.jit(f), (a, x)


def _gemm_rate(n: int, dtype: Any, samples: int, guess: float) -> float:
    """FLOP/s of an n×n×n product, with the per-call dispatch amortized over a chain."""
    k = int(min(64, max(4, math.ceil(2e-3 * guess / (2.0 * n**3)))))
    fn, args = _chain(n, dtype, k)
    t = time_one(fn, args, samples=samples).median
    return 2.0 * n**3 * k / t


def _vector_rate(n: int, samples: int, steps: int = 64) -> float:
    """Elementwise ops per second (the cost model counts one per op and output element): `steps`
    dependent multiply-adds per element in one fused kernel, which reads and writes n floats
    once, so arithmetic, not memory, bounds it."""
    x = jax.random.normal(jax.random.key(3), (n,), jnp.float32)

    def f(x):
        for _ in range(steps):
            x = x * 0.999 + 0.001
        return x

    return 2.0 * steps * n / time_one(jax.jit(f), (x,), samples=samples).median


def _slowdown_transposed(
    n: int, x_shape: tuple, seed: int, plain: Any, transposed: Any, samples: int
) -> float:
    """Median time of `transposed(x, W)` over that of `plain(x, Wᵀ)`: one product on the same
    data, a random n x n W passed as it is stored or transposed (an eager copy)."""
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, x_shape, jnp.float32)
    w = jax.random.normal(kw, (n, n), jnp.float32) / math.sqrt(n)
    t = measure(
        {"plain": (jax.jit(plain), (x, w.T)), "transposed": (jax.jit(transposed), (x, w))}, repeats=samples
    )
    return t["transposed"].median / t["plain"].median


def _transpose_folded(n: int, samples: int) -> bool:
    """Whether `x @ W.T` runs within 10% of `x @ W` on the same (transposed) data: then XLA folds
    the transpose into the GEMM's operand layout instead of copying W (`Profile.transpose_folded`)."""
    product = lambda x, w: x @ w  # noqa: E731
    return _slowdown_transposed(n, (max(8, n // 8), n), 2, product, lambda x, w: x @ w.T, samples) <= 1.1


def _lhs_transposed_copied(n: int, samples: int) -> bool:
    """Whether `Wᵀ @ x` taken as one product (W contracted over its leading axis) runs over 10%
    slower than `W @ x` on the same (transposed) data: then the GEMM copies W into its other
    layout first (`Profile.lhs_transposed_copied`)."""
    leading = (((0,), (0,)), ((), ()))
    product, as_one = (lambda x, w: w @ x), (lambda x, w: jax.lax.dot_general(w, x, leading))
    return _slowdown_transposed(n, (n, max(8, n // 16)), 3, product, as_one, samples) > 1.1


# the matmul dtypes calibrate() times; the profile's other dtypes keep the built-in profile's rates
MEASURED_DTYPES = ("float32", "bfloat16", "float16")


def calibrate(quick: bool = False) -> Profile:
    """Measure the default device. `quick` uses smaller sizes (for tests and CPUs)."""
    kind = compat.device_kind()
    base = H200 if kind == "cuda" else CPU
    big = 1024 if (quick or kind == "cpu") else 8192
    samples = 3 if quick else 7
    guess = base.matmul_rate("float32")
    rates = {dt: _gemm_rate(big, jnp.dtype(dt), samples, guess) for dt in MEASURED_DTYPES}
    # bandwidth: a read+write pass over a large buffer
    n_bytes = (64 if (quick or kind == "cpu") else 1024) * 2**20
    x = jax.random.normal(jax.random.key(1), (n_bytes // 4,), jnp.float32)
    t = time_one(jax.jit(lambda x: x * 1.0001 + 1.0), (x,), samples=samples).median
    bandwidth = 2.0 * n_bytes / t
    # per-call dispatch of a compiled program, and per-kernel cost inside one (64 tiny products)
    tiny = jnp.ones((8,), jnp.float32)
    call = time_one(jax.jit(lambda x: x + 1.0), (tiny,), samples=samples).median
    fn, args = _chain(8, jnp.float32, 64)
    launch = max(0.0, (time_one(fn, args, samples=samples).median - call) / 64)
    # small-GEMM efficiency: fraction of the large-GEMM rate by size bucket (log2 of the side)
    eff = {}
    for p in range(3, int(math.log2(big)) + 1):
        eff[p] = min(1.0, _gemm_rate(2**p, jnp.float32, samples, guess) / rates["float32"])
    side = 512 if (quick or kind == "cpu") else 4096
    folded, copied = _transpose_folded(side, samples), _lhs_transposed_copied(side // 2, samples)
    return Profile(
        name=f"{base.name}-calibrated",
        kind=kind,
        matmul_flops={**base.matmul_flops, **rates},
        vector_flops=_vector_rate((1 if (quick or kind == "cpu") else 64) * 2**20, samples),
        bandwidth=bandwidth,
        launch_s=launch,
        gemm_efficiency=eff,
        call_s=call,
        transpose_folded=folded,
        lhs_transposed_copied=copied,
        source=f"calibrated on {jax.devices()[0].device_kind}",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jaxrw calibrate", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, few samples")
    ap.add_argument("--output", default=None, help="profile path (default: the jaxrw cache directory)")
    args = ap.parse_args(argv)
    from pathlib import Path

    from ..options import output_problem

    if args.output is not None and not args.output.strip():  # an unset $OUT: not the default profile
        ap.error(
            f"--output {args.output!r} is empty; give a .json path, or leave it out for the device's default"
        )
    if args.quick and args.output is None:  # small sizes, few samples: not every later decision's
        ap.error(
            "--quick measures small sizes with few samples: give --output PATH to save it, not as the default"
        )
    kind = compat.device_kind()
    target = Path(args.output).expanduser() if args.output else cache_dir() / f"profile-{kind}.json"
    problem = output_problem(str(target), "--output" if args.output else "the cache file", (".json",))
    if problem:  # before measuring: a minute of measurements is not lost to a typo
        ap.error(problem)
    prof = calibrate(quick=args.quick)
    try:
        path = save_profile(prof, target)
    except OSError as e:
        ap.exit(2, f"jaxrw calibrate: error: could not save the profile to {target}: {e}\n")
    print(f"device {jax.devices()[0].device_kind} ({prof.kind})")
    base = prof.name.split("-")[0]
    for dt, r in prof.matmul_flops.items():  # an inherited rate printed bare read as measured
        said = "" if dt in MEASURED_DTYPES else f" (inherited: the built-in {base} profile's, not measured)"
        print(f"  matmul {dt:<9} {r / 1e12:10.3f} TFLOP/s{said}")
    print(f"  bandwidth       {prof.bandwidth / 1e9:10.1f} GB/s (read+write)")
    print(f"  kernel launch   {prof.launch_s * 1e6:10.1f} us (inside a compiled program)")
    print(f"  call dispatch   {prof.call_s * 1e6:10.1f} us (per call of a compiled program)")
    print("  gemm efficiency " + " ".join(f"2^{k}:{v:.2f}" for k, v in sorted(prof.gemm_efficiency.items())))
    print(f"  x @ W.T folded  {'yes' if prof.transpose_folded else 'no':>10} (within 10% of x @ W)")
    copies = "yes" if prof.lhs_transposed_copied else "no"
    print(f"  Wᵀ @ x copies W {copies:>10} (over 10% slower than W @ x)")
    print(f"  elementwise     {prof.vector_flops / 1e12:10.3f} Tops/s (one per op and element)")
    use = (
        "used by default on this device kind"
        if not args.output
        else f"use it as optimize(..., profile={str(path)!r})"
    )
    print(f"saved {path} ({use})")
    return 0

"""Does XLA's GPU dot merger already merge the dots jaxrw would merge, and does it pay?

    python bench/dot_merger_h200.py [--json PATH]

Plain jax (no jaxrw import, so it runs on the device image as is). For each program, compiled
by jax.jit twice, with XLA's default options and with `xla_gpu_dot_merger_threshold_mb=0` (the
merger off): the GEMM kernels and concatenations in the optimized HLO, and the median time per
call of each, interleaved. The cost model's `xla_passes.py` prices the programs as the first
column says XLA runs them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _rand(key: int, *shape: int, dtype: str = "float32", scale: float = 1.0):
    return jnp.asarray(np.random.default_rng(key).normal(size=shape) * scale, dtype=dtype)


def programs(dtype: str) -> dict:
    """name -> (fn, args); shapes of the bench cases at the large size."""
    d = 4096
    s = 1.0 / np.sqrt(d)
    out = {}
    x16 = _rand(1, 16, d, dtype=dtype)
    heads = [_rand(10 + i, d, 128, dtype=dtype, scale=s) for i in range(32)]
    out["per_head_proj (const)"] = (lambda x: jnp.stack([x @ w for w in heads]), (x16,))
    W = _rand(2, d, d, dtype=dtype, scale=s)
    V = _rand(3, 16, d, dtype=dtype)
    out["stacked_matvec_16"] = (lambda W, V: jnp.stack([W @ V[i] for i in range(16)]), (W, V))
    x64, B = _rand(4, 64, d, dtype=dtype), _rand(6, 16, d, dtype=dtype)
    A = _rand(5, d, 16, dtype=dtype, scale=s)
    out["lora hand x@W+(x@A)@B"] = (lambda x, W, A, B: x @ W + (x @ A) @ B, (x64, W, A, B))
    out["lora naive x@(W+A@B)"] = (lambda x, W, A, B: x @ (W + A @ B), (x64, W, A, B))
    wq, wk, wv = (_rand(7 + i, d, d, dtype=dtype, scale=s) for i in range(3))
    x8 = _rand(8, 8, d, dtype=dtype)
    out["qkv args d=4096"] = (lambda x, a, b, c: (x @ a, x @ b, x @ c), (x8, wq, wk, wv))
    out["qkv const d=4096"] = (lambda x: (x @ wq, x @ wk, x @ wv), (x8,))
    m = 1024
    sq, sk, sv = (w[:m, :m] for w in (wq, wk, wv))
    out["qkv args d=1024"] = (lambda x, a, b, c: (x @ a, x @ b, x @ c), (x8[:, :m], sq, sk, sv))
    out["qkv args d=1024 summed"] = (
        lambda x, a, b, c: jnp.tanh(x @ a) + jnp.tanh(x @ b) * (x @ c),
        (x8[:, :m], sq, sk, sv),
    )
    return out


def kernels(compiled) -> dict:
    text = compiled.as_text()
    return {
        "gemms": len(re.findall(r'custom_call_target="__cublas', text))
        + len(re.findall(r'"kind":"__triton_gemm"|kind=kCustom.*triton_gemm', text)),
        "dots": len(re.findall(r"= \S+ dot\(", text)),
        "concatenates": len(re.findall(r"concatenate\(", text)),
    }


def median_us(fn, args, calls: int = 50) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--calls", type=int, default=50, help="calls per sample")
    a = ap.parse_args()
    rows = []
    for dtype in ("float32", "bfloat16"):
        for name, (fn, args) in programs(dtype).items():
            variants = {}
            for label, opts in (("xla", {}), ("no_merger", {"xla_gpu_dot_merger_threshold_mb": 0})):
                c = jax.jit(fn).lower(*args).compile(compiler_options=opts)
                jax.block_until_ready(c(*args))
                variants[label] = (c, kernels(c))
            samples = {k: [] for k in variants}
            for _ in range(a.samples):
                for k, (c, _) in variants.items():
                    samples[k].append(median_us(c, args, a.calls))
            row = {"program": name, "dtype": dtype}
            for k, (_, info) in variants.items():
                row[k] = {**info, "median_us": statistics.median(samples[k]), "samples_us": samples[k]}
            rows.append(row)
            print(
                f"{name:24s} {dtype:8s} merger on: {row['xla']['gemms']} gemm {row['xla']['dots']} dot "
                f"{row['xla']['concatenates']} concat {row['xla']['median_us']:8.1f} us | off: "
                f"{row['no_merger']['gemms']} gemm {row['no_merger']['concatenates']} concat "
                f"{row['no_merger']['median_us']:8.1f} us",
                flush=True,
            )
    meta = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

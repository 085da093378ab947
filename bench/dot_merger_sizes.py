"""Which dot pairs sharing an operand does XLA's GPU dot merger merge? Sizes and sides.

    python bench/dot_merger_sizes.py [--json PATH]

Plain jax. Each probe is a pair (or 16) of dots that share one operand; the line says how many
dots the optimized HLO keeps (1: merged) and the shapes of the dots in it.
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import jax.numpy as jnp


def z(*shape, dtype="float32"):
    return jnp.zeros(shape, dtype)


def probes():
    p = {}
    for d in (1024, 2048, 2800, 3000, 4096):
        p[f"x(8,{d})@W1,W2 ({d}x{d} f32)"] = (lambda x, a, b: (x @ a, x @ b), (z(8, d), z(d, d), z(d, d)))
    p["x(8,4096)@W(4096²),A(4096x16)"] = (
        lambda x, a, b: (x @ a, x @ b),
        (z(8, 4096), z(4096, 4096), z(4096, 16)),
    )
    p["x(8,4096)@W(4096²)+ (x@A)@B"] = (
        lambda x, a, b, c: x @ a + (x @ b) @ c,
        (z(8, 4096), z(4096, 4096), z(4096, 16), z(16, 4096)),
    )
    p["x(8,2048)@W(2048²),A(2048x16)"] = (
        lambda x, a, b: (x @ a, x @ b),
        (z(8, 2048), z(2048, 2048), z(2048, 16)),
    )
    for d in (2048, 4096):
        p[f"W({d}²)@v1,v2 vectors"] = (lambda w, u, v: (w @ u, w @ v), (z(d, d), z(d), z(d)))
        p[f"W({d}²)@V1,V2 (d x 2)"] = (lambda w, u, v: (w @ u, w @ v), (z(d, d), z(d, 2), z(d, 2)))
        p[f"W({d}²)@V[i] x16 stacked"] = (
            lambda w, V: jnp.stack([w @ V[i] for i in range(16)]),
            (z(d, d), z(16, d)),
        )
        p[f"v1,v2@W({d}²)"] = (lambda w, u, v: (u @ w, v @ w), (z(d, d), z(d), z(d)))
    p["x(8,4096)@W1,W2 bf16"] = (
        lambda x, a, b: (x @ a, x @ b),
        (z(8, 4096, dtype="bfloat16"), z(4096, 4096, dtype="bfloat16"), z(4096, 4096, dtype="bfloat16")),
    )
    p["x(8,4096)@W1,W2,W3 bf16"] = (
        lambda x, a, b, c: (x @ a, x @ b, x @ c),
        (z(8, 4096, dtype="bfloat16"), *(z(4096, 4096, dtype="bfloat16") for _ in range(3))),
    )
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for name, (fn, args) in probes().items():
        text = jax.jit(fn).lower(*args).compile().as_text()
        dots = re.findall(r"(\S+\[[^\]]*\]\S*) dot\(([^)]*)\)", text)
        shapes = [s for s, _ in dots]
        concat = len(re.findall(r"concatenate\(", text))
        cublas = len(re.findall(r'custom_call_target="__cublas', text))
        rows.append(
            {"probe": name, "dots": len(dots), "dot_shapes": shapes, "concatenates": concat, "cublas": cublas}
        )
        print(
            f"{name:34s} dots={len(dots)} cublas={cublas} concat={concat} {' '.join(shapes)[:90]}", flush=True
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"meta": {"device": jax.devices()[0].device_kind, "jax": jax.__version__}, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()

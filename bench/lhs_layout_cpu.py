"""Products whose left operand contracts over a leading axis on XLA:CPU, and what pricing them
changes (`Profile.lhs_transposed_copied`, fortieth session).

Times `dot_general` of one (M, K) x (K, N) product in four layouts (NN: the plain one, TN: the
left operand contracted over its leading axis, TT: both transposed, NT: `x @ W.T` taken as one
product) on the same data, then a sign-SGD step on a factorized layer (the gradient of
tanh(x @ (U @ V)) holds transposes of products; removing them made a 256x256 product contract
over its leading axis and the step ran about 2x slower than jax.jit) under jaxrw with the built-in
CPU profile with the flag off (as before) and on (as now). Medians of seven rounds of samples
(jaxrw.rewrite.measure).

    python bench/lhs_layout_cpu.py OUT.json COMMIT
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
from jax import lax

import jaxrw
from jaxrw.rewrite.measure import measure
from jaxrw.rewrite.profiles import CPU

LAYOUTS = {"NN": ((1,), (0,)), "TN": ((0,), (0,)), "TT": ((0,), (1,)), "NT": ((1,), (1,))}
SHAPES = [(256, 256, 16), (512, 512, 2), (512, 512, 1), (16, 256, 256), (64, 1024, 64), (512, 512, 512)]


def medians(variants: dict[str, tuple]) -> dict[str, float]:
    """Median seconds per call of each `name -> (fn, args)`, samples taken in rotating rounds."""
    return {k: t.median for k, t in measure(variants, repeats=7).items()}


def layouts(m: int, k: int, n: int) -> dict[str, float]:
    a, b = jnp.ones((m, k)), jnp.ones((k, n))
    operands = {"NN": (a, b), "TN": (a.T.copy(), b), "TT": (a.T.copy(), b.T.copy()), "NT": (a, b.T.copy())}
    product = lambda dims: jax.jit(lambda x, y: lax.dot_general(x, y, (dims, ((), ()))))  # noqa: E731
    return medians({name: (product(dims), operands[name]) for name, dims in LAYOUTS.items()})


def sign_sgd_step(U, V, x):
    gU, gV = jax.grad(lambda U, V: jnp.sum(jnp.tanh(x @ (U @ V))), argnums=(0, 1))(U, V)
    return U - 0.1 * gU / (jnp.abs(gU) + 1e-8), V - 0.1 * gV / (jnp.abs(gV) + 1e-8)


def main() -> None:
    out, commit = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    rows = {f"{m}x{k}x{n}": {k2: v * 1e6 for k2, v in layouts(m, k, n).items()} for m, k, n in SHAPES}
    ks = jax.random.split(jax.random.key(0), 3)
    args = (jax.random.normal(ks[1], (256, 16)) / 16, jax.random.normal(ks[2], (16, 256)) / 4)
    args += (jax.random.normal(ks[0], (8, 256)),)
    before = dataclasses.replace(CPU, name="cpu-before", lhs_transposed_copied=False)
    fns = {
        "jax.jit": jax.jit(sign_sgd_step),
        "jaxrw (flag off)": jaxrw.optimize(sign_sgd_step, profile=before),
        "jaxrw (flag on)": jaxrw.optimize(sign_sgd_step, profile=CPU),
    }
    step = {k: v * 1e6 for k, v in medians({k: (f, args) for k, f in fns.items()}).items()}
    rewritten = {k: fns[k].report(*args).rewritten for k in fns if k != "jax.jit"}
    record = {"commit": commit, "device": jax.devices()[0].device_kind, "layouts_us": rows}
    record |= {"sign_sgd_step_us": step, "rewritten": rewritten}
    with open(out, "w") as fh:
        json.dump(record, fh, indent=1)
    for shape, t in rows.items():
        print(f"{shape:>12}  " + "  ".join(f"{k} {v:7.1f} us" for k, v in t.items()))
    for k, v in step.items():
        print(f"sign-SGD step  {k:<18} {v:7.1f} us  ({step['jax.jit'] / v:.2f}x of jax.jit)")


if __name__ == "__main__":
    main()

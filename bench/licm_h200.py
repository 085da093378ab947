"""Does XLA move loop-invariant products out of a loop itself (while-loop-invariant code motion)?

jaxrw rewrites a loop body with its constant operands as slow inputs, so their products run once
before the loop; the cost model prices the body as written with that work inside every step. On
this project's CPU, XLA's compiled program already computes `A @ B` of a scan body once, before
its while loop (thirty-ninth session), so the predicted gain there is XLA's own. This prints, for
the default backend, where the compiled program computes the loop-invariant product (before the
loop or in its body) and times jax.jit against jaxrw.

    python bench/licm_h200.py [--n 1024] [--steps 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jax

from jaxrw import optimize


def scanned(A, B, X, steps):
    return jax.lax.scan(lambda c, _: (0.5 * (A @ B @ c) + 0.5 * c, None), X, None, length=steps)[0]


def _body_dots(hlo: str) -> tuple[int, int]:
    """(dots computed in while bodies, dots elsewhere) of a compiled program's text."""
    comps = re.split(r"\n(?=\S)", hlo)
    bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    called = {c: set(re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", t)) for c, t in _named(comps).items()}
    inside: set[str] = set()
    todo = list(bodies)
    while todo:
        c = todo.pop()
        if c not in inside:
            inside.add(c)
            todo.extend(called.get(c, ()))
    n_in = n_out = 0
    for name, text in _named(comps).items():
        n = len(re.findall(r" dot\(|custom-call\(.*(?:gemm|matmul)", text))
        if name in inside:
            n_in += n
        else:
            n_out += n
    return n_in, n_out


def _named(comps: list[str]) -> dict[str, str]:
    out = {}
    for c in comps:
        m = re.match(r"(?:ENTRY )?%?([\w.\-]+)", c)
        if m:
            out[m.group(1)] = c
    return out


def _time(fn, args, reps=50):
    jax.block_until_ready(fn(*args))
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        best.append((time.perf_counter() - t) / reps)
    return sorted(best)[len(best) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    k = jax.random.split(jax.random.key(0), 3)
    A, B = (jax.random.normal(k[i], (a.n, a.n)) / a.n**0.5 for i in range(2))
    X = jax.random.normal(k[2], (a.n, 4))
    f = lambda A, B, X: scanned(A, B, X, a.steps)  # noqa: E731
    jitted, opt = jax.jit(f), optimize(f)
    in_body, outside = _body_dots(jitted.lower(A, B, X).compile().as_text())
    t_jit, t_opt = _time(jitted, (A, B, X)), _time(opt, (A, B, X))
    report = opt.report(A, B, X)
    row = {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "n": a.n,
        "steps": a.steps,
        "jax_jit_dots_in_loop_body": in_body,
        "jax_jit_dots_outside": outside,
        "jit_s": t_jit,
        "jaxrw_s": t_opt,
        "speedup": t_jit / t_opt,
        "body_rewritten": bool(report.bodies and report.bodies[0].rewritten),
        "body_predicted": report.bodies[0].predicted_speedup if report.bodies else None,
    }
    print(json.dumps(row, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(row, fh, indent=1)


if __name__ == "__main__":
    main()

"""Optimization time and peak memory on long programs: `python -m jaxrw.bench.scale --eqns 2000 20000`.

`--case gpt2_small gpt_train_step` times benchmark cases instead (large size, float32; issue 9's
bar: 1 s per 1,000 equations and 10 s for the training step): each in a fresh process, the first
`optimize` build there ("cold": it also pays the one-time translation of the rules and analysis
into egglog) and a second build of the same program by a new `optimize` ("warm").

The program is a deep stack of dense layers with elementwise work (`x + tanh(x @ W_i + b_i) * s`,
four weight sets reused, so dot rules have something to match). Each size runs in a fresh
subprocess, so the peak resident memory (getrusage: Python and egglog's Rust heap) is that
size's own; `--tracemalloc` adds the peak of Python-side allocations from a second, untimed
build. Reported per size: equations, phase times of the rewrite (encode, rewrite, extract,
decode), the whole `optimize` build (trace to compiled-ready callable), the first call (XLA
compile and run) and the stop reason. The bar (issue 7): a program of 20,000 equations is
optimized or cleanly limited within 60 s and 4 GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from ..cli import positive_float, positive_int
from ..options import output_problem
from .report import write_json

__all__ = ["program", "measure", "measure_case", "main"]


def program(n_eqns: int, width: int = 16) -> tuple[Any, tuple]:
    """A layer stack with about `n_eqns` equations, and its arguments."""
    import jax.numpy as jnp
    import numpy as np

    layers = max(1, n_eqns // 6)  # dot, add (bias broadcast), tanh, mul, add, plus the bias broadcast
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(width)
    ws = [jnp.asarray(rng.standard_normal((width, width)).astype(np.float32) * scale) for _ in range(4)]
    bs = [jnp.asarray(rng.standard_normal(width).astype(np.float32) * 0.1) for _ in range(4)]
    x = jnp.asarray(rng.standard_normal((8, width)).astype(np.float32))

    def f(x, ws, bs):
        for i in range(layers):
            x = x + jnp.tanh(x @ ws[i % 4] + bs[i % 4]) * 0.5
        return x

    return f, (x, ws, bs)


def measure(
    n_eqns: int, time_s: float, trace_python: bool = False, max_eqns: int | None = None
) -> dict[str, Any]:
    """Optimize one program in this process and return the measurements."""
    import jax

    import jaxrw

    f, args = program(n_eqns)
    n = len(jax.make_jaxpr(f)(*args).jaxpr.eqns)
    limits = jaxrw.Limits(time_s=time_s, **({"equations": max_eqns} if max_eqns else {}))
    t0 = time.perf_counter()
    opt = jaxrw.optimize(f, limits=limits)
    rep = opt.report(*args)
    build_s = time.perf_counter() - t0
    py_peak = 0
    if trace_python:  # a second build under tracemalloc (which slows allocation: not timed)
        tracemalloc.start()
        jaxrw.optimize(f, limits=limits).report(*args)
        py_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    t1 = time.perf_counter()
    jax.block_until_ready(opt(*args))
    first_s = time.perf_counter() - t1
    return {
        "equations": n,
        "build_s": round(build_s, 2),
        "first_call_s": round(first_s, 2),
        **_report_fields(rep),
        "peak_rss_mib": _peak_rss_mib(),
        "python_peak_mib": round(py_peak / 2**20),
        "limits_equations": limits.equations,
        "jax": jax.__version__,
    }


def _report_fields(rep: Any) -> dict[str, Any]:
    """What a build's rewrite report says (a fallback to jax.jit has no report)."""
    return {
        "phases_s": {k: round(v, 3) for k, v in (rep.phase_s if rep else {}).items()},
        "stop_reason": rep.stop_reason.value if rep else "fallback",
        "iterations": rep.iterations if rep else 0,
        "egraph_nodes": rep.egraph_nodes if rep else 0,
        "egraph_classes": rep.egraph_classes if rep else 0,
        "extractor": f"{rep.extractor} {rep.extractor_note}".strip() if rep else "",
        "rewritten": bool(rep and rep.rewritten),
    }


def _peak_rss_mib() -> int:
    """This process's peak resident memory (Python and egglog's Rust heap), MiB (Linux: KiB units)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def measure_case(name: str) -> dict[str, Any]:
    """Optimize benchmark case `name` (large, float32) twice in this process: cold and warm."""
    import jax

    import jaxrw
    from jaxrw.bench.case import CASES, load_suites

    load_suites()
    inst = CASES[name].instance("large", "float32")
    args = inst.args(0)
    row: dict[str, Any] = {"case": name, "shape": inst.shape, "jax": jax.__version__}
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        rep = jaxrw.optimize(inst.fn, **inst.opt_kwargs).report(*args)
        build_s = time.perf_counter() - t0
        row["equations"] = n = rep.n_equations if rep else 0
        row[label] = {
            "build_s": round(build_s, 3),
            "s_per_1k_eqns": round(build_s / max(n, 1) * 1e3, 3),
            **_report_fields(rep),
        }
    row["peak_rss_mib"] = _peak_rss_mib()
    return row


def _child(argv: list[str], ident: dict[str, Any]) -> dict[str, Any]:
    """Run this module with `argv` in a fresh process: its JSON row, or `ident` with the error."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxrw.bench.scale", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{ident}: failed after {time.perf_counter() - t0:.0f}s\n{proc.stderr[-2000:]}")
        return {**ident, "error": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cases(names: list[str], json_path: str | None) -> int:
    """Each case in a fresh process; print a line per case and write the rows as JSON."""
    rows = []
    for name in names:
        row = _child(["--one-case", name], {"case": name})
        rows.append(row)
        if "error" in row:
            continue
        c, w = row["cold"], row["warm"]
        print(
            f"{name}: {row['equations']} eqns  cold {c['build_s']:.2f}s ({c['s_per_1k_eqns']:.2f} s/1k)  "
            f"warm {w['build_s']:.2f}s ({w['s_per_1k_eqns']:.2f} s/1k)  phases {w['phases_s']}  "
            f"e-graph {w['egraph_nodes']} nodes  stop {w['stop_reason']}",
            flush=True,
        )
    if json_path:
        write_json(json_path, rows)
    return 0 if all("error" not in r for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrw.bench.scale", description=__doc__.splitlines()[0])
    ap.add_argument("--eqns", type=positive_int, nargs="+", default=[2000, 20000])
    ap.add_argument("--time-s", type=positive_float, default=10.0, help="Limits.time_s for saturation")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure Python-side peak memory")
    ap.add_argument(
        "--equations", type=positive_int, default=None, help="Limits.equations (default: jaxrw's)"
    )
    ap.add_argument(
        "--case", nargs="+", default=None, help="benchmark cases to time instead (large, float32)"
    )
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--one-case", default=None, help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args(argv)
    problem = a.json and output_problem(a.json, "--json")
    if problem:
        ap.error(problem)
    if a.case:
        from .case import CASES, load_suites

        load_suites()
        unknown = [c for c in a.case if c not in CASES]
        if unknown:
            ap.error(f"unknown --case {', '.join(unknown)}; valid: {', '.join(sorted(CASES))}")
    if a.one_case is not None:
        print(json.dumps(measure_case(a.one_case)))
        return 0
    if a.case:
        return _cases(a.case, a.json)
    if a.one is not None:
        print(json.dumps(measure(a.one, a.time_s, a.tracemalloc, a.equations)))
        return 0
    rows = []
    for n in a.eqns:
        cmd = ["--one", str(n), "--time-s", str(a.time_s)]
        cmd += ["--tracemalloc"] if a.tracemalloc else []
        cmd += ["--equations", str(a.equations)] if a.equations else []
        row = _child(cmd, {"requested": n})
        rows.append(row)
        if "error" in row:
            continue
        ok = row["build_s"] <= 60 and row["peak_rss_mib"] <= 4096
        print(
            f"{row['equations']:>6} eqns: build {row['build_s']:6.1f}s  "
            f"first call {row['first_call_s']:6.1f}s  "
            f"phases {row['phases_s']}  stop {row['stop_reason']}  rewritten {row['rewritten']}  "
            f"peak RSS {row['peak_rss_mib']} MiB (python {row['python_peak_mib']})  {'OK' if ok else 'OVER'}",
            flush=True,
        )
    if a.json:
        write_json(a.json, rows)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

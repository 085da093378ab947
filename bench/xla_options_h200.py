"""How XLA's command-buffer (CUDA graph) options change host-bound programs on a GPU.

    python bench/xla_options_h200.py [--case llama288 nasrnn_args] [--dtype float32] [--json PATH]

For each case (large size): jax.jit of the case's function and of its hand-optimized twin, each
compiled with XLA's default options and with the command-buffer options below, timed per call
(interleaved samples, medians), checked against the default program's output, with the number of
kernels and command-buffer thunks in the compiled program. The decode steps of issue 10 are bound
by the host's kernel launches (bench/HISTORY.md): a CUDA graph launches a whole sequence at once,
but XLA captures only runs of at least `xla_gpu_graph_min_graph_size` (5) capturable thunks.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics

import jax
import numpy as np

from jaxrw.bench.case import CASES, load_suites
from jaxrw.schedule.timing import time_call

OPTIONS = {
    "default": {},
    "no graphs": {"xla_gpu_enable_command_buffer": ""},
    "graphs min 1": {"xla_gpu_graph_min_graph_size": 1},
    "graphs +while,cond min 1": {
        "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL",
        "xla_gpu_graph_min_graph_size": 1,
    },
    "graphs +dyn-slice min 1": {
        "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION",
        "xla_gpu_graph_min_graph_size": 1,
    },
    "concurrent min 1": {
        "xla_gpu_command_buffer_scheduling_mode": "CONCURRENT",
        "xla_gpu_graph_min_graph_size": 1,
    },
}


def _counts(compiled) -> dict:
    text = compiled.as_text()
    m = compiled.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return {
        "peak_mib": peak / 2**20,
        "fusions": len(re.findall(r"= \S+ fusion\(", text)),
        "custom_calls": len(re.findall(r"custom-call\(", text)),
        "copies": len(re.findall(r"= \S+ copy\(", text)),
    }


def run_case(name: str, dtype: str, calls: int, repeats: int, size: str = "large") -> dict:
    load_suites()
    inst = CASES[name].instance(size, dtype)
    args = inst.args(1)
    hand_args = inst.hand_prep(args) if inst.hand_prep else args
    programs = {}
    errors = {}
    for label, opts in OPTIONS.items():
        for who, fn, a in (("jit", inst.fn, args), ("hand", inst.hand, hand_args)):
            if fn is None:
                continue
            key = f"{who} / {label}"
            try:
                f = jax.jit(fn, compiler_options=opts) if opts else jax.jit(fn)
                compiled = f.lower(*a).compile()
                out = jax.block_until_ready(f(*a))
                programs[key] = (f, a, out, _counts(compiled))
            except Exception as e:  # noqa: BLE001 - an option this XLA does not take
                errors[key] = f"{type(e).__name__}: {str(e)[:300]}"
    if inst.opt_kwargs.get("hoist_argnums") == (0,):  # jaxrw's hoisted calls, and the check alone
        from jaxrw import optimize

        rw = optimize(inst.fn, **inst.opt_kwargs)
        jax.block_until_ready(rw(*args))
        slack = optimize(inst.fn, schedule_memory_slack=0.25, **inst.opt_kwargs)
        jax.block_until_ready(slack(*args))
        schedules = {"jaxrw": rw.report(*args).schedule, "jaxrw slack 0.25": slack.report(*args).schedule}
        plain = programs["jit / default"][0]

        def checked(*a):  # jax.jit behind the Python a hoisted call does: flatten, ids, compare
            leaves = jax.tree_util.tree_leaves(a[0])
            if tuple(map(id, leaves)) == ids:
                return plain(*a)
            raise AssertionError("other params")

        ids = tuple(map(id, jax.tree_util.tree_leaves(args[0])))
        for key, f, a in (
            ("jaxrw direct", rw, args),
            ("jaxrw bound", rw.bind(*args), args[1:]),
            ("jaxrw direct, slack 0.25", slack, args),
            ("jaxrw bound, slack 0.25", slack.bind(*args), args[1:]),
            ("jit behind an id check", checked, args),
        ):
            unknown = {"peak_mib": -1.0, "fusions": -1, "custom_calls": -1, "copies": -1}
            programs[f"jit / {key}"] = (f, a, jax.block_until_ready(f(*a)), unknown)
    else:
        schedules = {}
    ref = {who: programs[f"{who} / default"][2] for who in ("jit", "hand") if f"{who} / default" in programs}
    for f, a, _, _ in programs.values():  # warm
        time_call(f, a, 20)
    samples: dict[str, list[float]] = {k: [] for k in programs}
    for _ in range(repeats):
        for k, (f, a, _, _) in programs.items():
            samples[k].append(time_call(f, a, calls) * 1e6)
    rows = {}
    for k, (_f, _a, out, counts) in programs.items():
        who = k.split(" / ")[0]
        diff = max(
            float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
            for x, y in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref[who]), strict=True)
        )
        rows[k] = {
            "median_us": statistics.median(samples[k]),
            "samples_us": samples[k],
            "max_abs_diff_vs_default": diff,
            **counts,
        }
    return {"case": name, "dtype": dtype, "rows": rows, "errors": errors, "schedules": schedules}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=["llama288", "nasrnn_args", "llama4096", "per_head_proj"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", default="large")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    results = []
    for name in a.case:
        r = run_case(name, a.dtype, a.calls, a.repeats, a.size)
        results.append(r)
        base = r["rows"].get("jit / default", {}).get("median_us")
        for k, row in r["rows"].items():
            print(
                f"{name:18s} {k:34s} {row['median_us']:9.1f} us  "
                f"{(base / row['median_us']) if base else float('nan'):5.2f}x  "
                f"peak {row['peak_mib']:7.1f} MiB fus {row['fusions']:4d} cc {row['custom_calls']:3d} "
                f"diff {row['max_abs_diff_vs_default']:.1e}",
                flush=True,
            )
        for k, v in r["schedules"].items():
            print(f"{name:18s} {k:34s} schedule {v}", flush=True)
        for k, e in r["errors"].items():
            print(f"{name:18s} {k:34s} ERROR {e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            meta = {"device": str(jax.devices()[0]), "jax": jax.__version__}
            json.dump({**meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

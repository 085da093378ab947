"""XLA's schedule vs jaxrw.schedule (thunky) on programs of independent small-kernel branches.

Run on an H200 with jax 0.12.0.1 (thunky), from the repository root, in under 8 minutes:

    OUT=/some/dir python bench/schedule_h200.py        # --quick: three cases, fewer samples

For every case: jax.jit (XLA), schedule="streams" (the planner's choice of streams), thunky forced
onto one stream and onto four, XLA with concurrent command-buffer scheduling (CONCURRENT_REGIONS and
CONCURRENT: XLA overlapping the branches itself inside a CUDA graph), and optimize(schedule="auto")
with its rewrites off (which measures its candidates before it picks one). Each is
checked against jax.jit on fresh random inputs, timed interleaved (median of samples, each many
calls then block_until_ready), and its compiled memory_analysis() compared with XLA's. JSON goes to
$OUT/schedule_h200.json (bench/results/ without $OUT); a short table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrw import optimize  # noqa: E402
from jaxrw.bench.report import AT_LEAST  # noqa: E402 - issue 6 asks the same 0.98x of `auto`
from jaxrw.rewrite.measure import measure, median_interval, paired_ratio, round_ratios, settle, verdict  # noqa: E402
from jaxrw.rewrite.profiles import default_profile  # noqa: E402
from jaxrw.schedule import Scheduled, plan_program, schedule_program  # noqa: E402
from jaxrw.schedule.timing import memory_parts, random_inputs, time_call  # noqa: E402
from jaxrw.schedule.xla_modes import XLA_MODES, XLA_REGIONS  # noqa: E402

BUDGET_S = 6 * 60  # stop starting new cases after this (the whole run must stay under 8 minutes)


# -- cases: (name, description, fn of flat arrays returning a list, specs) -----------------------


def _spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def experts_packed(e, m, d, dtype="float32"):
    """`e` equal-shape two-layer experts in stacked buffers X, W1, W2; results stacked (DESIGN.md)."""

    def fn(x, w1, w2):
        return [jnp.stack([jax.nn.relu(x[i] @ w1[i]) @ w2[i] for i in range(e)])]

    specs = [_spec((e, m, d), dtype), _spec((e, d, d), dtype), _spec((e, d, d), dtype)]
    return f"experts_packed_{e}x{m}x{d}", f"{e} experts {m}x{d}, packed", fn, specs


def experts_varied(count, dtype="float32"):
    """`count` two-layer experts whose shapes cycle through a few (m, k, n); separate arrays."""
    ms, ks, ns = (32, 64, 128), (256, 512, 1024), (512, 2048)
    shapes = [(ms[i % 3], ks[(i // 3) % 3], ns[i % 2]) for i in range(count)]

    def fn(*a):
        return [jnp.tanh(a[3 * i] @ a[3 * i + 1]) @ a[3 * i + 2] for i in range(count)]

    specs = []
    for m, k, n in shapes:
        specs += [_spec((m, k), dtype), _spec((k, n), dtype), _spec((n, k), dtype)]
    return f"experts_varied_{count}", f"{count} experts, {len(set(shapes))} shapes", fn, specs


def experts_medium(dtype="bfloat16"):
    """Four experts of different shapes, each GEMM too small to fill the GPU but long-running."""
    shapes = [(256, 4096, 8192), (384, 4096, 6144), (512, 3072, 8192), (640, 4096, 4096)]

    def fn(*a):
        return [jax.nn.gelu(a[3 * i] @ a[3 * i + 1]) @ a[3 * i + 2] for i in range(len(shapes))]

    specs = []
    for m, k, n in shapes:
        specs += [_spec((m, k), dtype), _spec((k, n), dtype), _spec((n, k), dtype)]
    return "experts_medium_4", "4 experts m 256-640, k/n 3-8K", fn, specs


def cell(batch=64, hidden=1024, dtype="float32"):
    """A multi-branch recurrent cell (NasRNN-like): eight x/h projections combined pairwise."""

    def fn(x, h, w, u):
        t = [x @ w[i] + h @ u[i] for i in range(8)]
        a = [jnp.tanh(t[0]) * jax.nn.sigmoid(t[1]), jax.nn.relu(t[2]) + t[3]]
        a += [jax.nn.sigmoid(t[4]) * t[5], jnp.tanh(t[6]) - t[7]]
        return [(a[0] + a[1]) * jnp.tanh(a[2] + a[3])]

    specs = [
        _spec((batch, hidden), dtype),
        _spec((batch, hidden), dtype),
        _spec((8, hidden, hidden), dtype),
        _spec((8, hidden, hidden), dtype),
    ]
    return f"cell_{batch}x{hidden}", f"8-branch cell b{batch} h{hidden}", fn, specs


def decoders(dims=(1024, 1536, 2048, 2560), batch=8, dtype="bfloat16"):
    """Independent small decode steps (layernorm, 4x MLP, residual) of different widths."""

    def ln(x):
        xf = x.astype(jnp.float32)
        mu = xf.mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(((xf - mu) ** 2).mean(-1, keepdims=True) + 1e-5)).astype(x.dtype)

    def fn(*a):
        return [a[3 * i] + jax.nn.gelu(ln(a[3 * i]) @ a[3 * i + 1]) @ a[3 * i + 2] for i in range(len(dims))]

    specs = []
    for d in dims:
        specs += [_spec((batch, d), dtype), _spec((d, 4 * d), dtype), _spec((4 * d, d), dtype)]
    return f"decoders_{len(dims)}", f"{len(dims)} decode steps b{batch} d{dims[0]}-{dims[-1]}", fn, specs


def gemm_chain(n=2048, depth=4, dtype="float32"):
    """Control: one chain of GEMMs that fill the GPU (DESIGN.md: parity at best)."""

    def fn(x, *ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return [x]

    return f"gemm_chain_{n}", f"{depth} chained {n}^2 GEMMs", fn, [_spec((n, n), dtype)] * (depth + 1)


def cases(quick: bool, smoke: bool = False):
    if smoke:  # tiny shapes: checks the script end to end on a CPU
        return [experts_packed(4, 8, 32), cell(4, 32), decoders((16, 24), 2, "float32"), gemm_chain(64, 2)]
    if quick:
        return [experts_packed(16, 64, 512), cell(), experts_medium()]
    return [
        experts_packed(16, 64, 512),
        experts_packed(8, 128, 2048),
        experts_packed(32, 32, 256),
        experts_varied(8),
        experts_varied(32),
        experts_varied(64),
        cell(),
        cell(256, 2048, "bfloat16"),
        decoders(),
        experts_medium(),
        gemm_chain(),
    ]


# -- measuring ------------------------------------------------------------------------------------


def memory(fn, args):
    """XLA's compiled memory_analysis() of a jitted function, in bytes (timing.memory_parts)."""
    try:
        return memory_parts(fn, args)
    except Exception as e:  # noqa: BLE001 - record, keep going
        return {"error": f"{type(e).__name__}: {e}"}


def compare(got, want):
    g = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(got)]
    w = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(want)]
    bitwise = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(g, w, strict=True))
    rel = max(float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)) for a, b in zip(g, w, strict=True))
    return {"bitwise": bitwise, "rel_err": rel}


def tolerance(dtype):
    return 1e-2 if "16" in str(dtype) else 1e-5


def run_case(name, desc, fn, specs, profile, samples):
    rec = {"case": name, "description": desc, "dtype": str(specs[0].dtype), "variants": {}}
    closed = jax.make_jaxpr(fn)(*specs)
    args = random_inputs(specs, seed=1)
    xla = jax.jit(fn)
    want = xla(*args)
    variants = {"xla": xla}
    plans = {}
    modes = (
        ("streams", "streams"),
        ("1 stream", 1),
        ("4 streams", 4),
        ("xla regions", "regions"),
        ("xla concurrent", "concurrent"),
        ("auto", "auto"),
        ("auto +10% mem", "auto-slack"),
    )
    for label, mode in modes:
        try:
            if mode in ("auto", "auto-slack"):
                # what optimize(schedule="auto") runs for this program, with the guard made to keep
                # it (rewrites are not what this script measures): its pick among XLA's schedule,
                # XLA's modes and thunky; where it keeps XLA's schedule, jax.jit(fn) itself
                slack = 0.1 if mode == "auto-slack" else 0.0
                f = optimize(fn, schedule="auto", schedule_memory_slack=slack, limits={"min_gain": 0.99})
                choice, _, reason = (f.report(*args).schedule or "xla: ").partition(": ")
                key = "auto" if mode == "auto" else "auto_slack"
                rec[f"{key}_choice"], rec[f"{key}_reason"] = choice, reason
            elif mode == "regions":
                f = jax.jit(fn, compiler_options=XLA_REGIONS)
            elif mode == "concurrent":
                f = jax.jit(fn, compiler_options=XLA_MODES["xla-concurrent"])
            elif mode == "streams":
                f = schedule_program(fn, specs, "streams", profile)
            else:
                plans[label] = plan_program(closed, profile, streams=mode)
                f = schedule_program(fn, specs, plans[label], profile)
            if f is None:
                raise RuntimeError("nothing to schedule")
            if isinstance(f, Scheduled):
                plans.setdefault(label, f.plan)
            variants[label] = f
        except Exception as e:  # noqa: BLE001 - one broken variant must not end the run
            rec["variants"][label] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(-3)}
    # correctness on fresh inputs, then warm-up
    fresh = random_inputs(specs, seed=2)
    want_fresh = xla(*fresh)
    for label, f in list(variants.items()):
        try:
            out = f(*fresh)
            jax.block_until_ready(out)
            check = compare(out, want_fresh)
            check["ok"] = check["rel_err"] <= tolerance(specs[0].dtype)
            rec["variants"].setdefault(label, {}).update(check)
            time_call(f, args, 3)
        except Exception as e:  # noqa: BLE001
            rec["variants"][label] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(-3)}
            variants.pop(label)
    del want
    # the benchmarks' timing (rewrite.measure: ~20 ms samples, order rotated per round, each after
    # one untimed call); speedups as ratios of medians and as medians of per-round ratios
    pairs = {k: (f, tuple(args)) for k, f in variants.items()}
    timed = measure(pairs, repeats=samples, sample_s=0.02, max_calls=500)
    # issue 6: `auto` never below 0.98x of XLA; rounds added while its 95% interval straddles that
    auto = [(k, "xla", ()) for k in ("auto", "auto +10% mem")]
    rec["settle_rounds"] = settle(pairs, timed, auto, AT_LEAST, max_rounds=6 * samples, max_s=20.0)
    base = timed["xla"]
    for label, tm in timed.items():
        v = rec["variants"].setdefault(label, {})
        v.update(
            median_us=tm.median * 1e6,
            spread_us=[min(tm.samples) * 1e6, max(tm.samples) * 1e6],
            samples=len(tm.samples),
            samples_us=[x * 1e6 for x in tm.samples],
            calls=tm.calls,
            speedup=base.median / tm.median,
            speedup_paired=paired_ratio(base.samples, tm.samples),
            speedup_interval=median_interval(round_ratios(base.samples, tm.samples)),
        )
        v["at_least"] = verdict(v["speedup_interval"], AT_LEAST)
        f = variants[label]
        jitted = f.fast if isinstance(f, Scheduled) else (f if hasattr(f, "lower") else None)
        if jitted is not None:
            v["memory"] = memory(jitted, args)
    for label, plan in plans.items():
        rec["variants"].setdefault(label, {})["plan"] = {
            "regions": len(plan.regions),
            "streams": plan.streams,
            "stages": plan.stages,
            "predicted_xla_us": plan.xla_s * 1e6,
            "predicted_thunky_us": plan.thunky_s * 1e6,
            "predicted_peak": plan.peak_bytes,
            "predicted_scratch": plan.scratch_bytes,
        }
    return rec


def table(records):
    """One line per case: XLA's time, every variant's speedup over it, correctness, peak memory."""
    cols = [
        ("streams", "streams"),
        ("1 stream", "1str"),
        ("4 streams", "4str"),
        ("xla regions", "regions"),
        ("xla concurrent", "concur"),
        ("auto", "auto"),
        ("auto +10% mem", "auto+10%"),
    ]
    head = f"{'case':<25}{'XLA µs':>9}" + "".join(f"{short:>9}" for _, short in cols)
    lines = [head + f"  ok   peak MiB xla/streams  auto / +10% picked  auto >= {AT_LEAST}x"]
    for r in records:
        v = r["variants"]
        if "median_us" not in v.get("xla", {}):
            lines.append(f"{r['case']:<25}  {r.get('skipped') or r.get('error', 'error')[:80]}")
            continue
        cells = "".join(
            f"{v[c]['speedup']:>8.2f}x"
            if "speedup" in v.get(c, {})
            else f"{'err' if 'error' in v.get(c, {}) else '-':>9}"
            for c, _ in cols
        )
        ok = all(x.get("ok", False) for x in v.values() if "median_us" in x)
        mx, ms = v["xla"].get("memory", {}), v.get("streams", {}).get("memory", {})
        mem = f"{mx.get('peak', 0) / 2**20:.1f}/{ms['peak'] / 2**20:.1f}" if "peak" in ms else "-"
        lines.append(
            f"{r['case']:<25}{v['xla']['median_us']:>9.1f}{cells}  {'yes' if ok else 'NO':<4} {mem:<21}"
            f"{r.get('auto_choice', '-')} / {r.get('auto_slack_choice', '-')}  "
            f"{v.get('auto', {}).get('at_least', '-')} / {v.get('auto +10% mem', {}).get('at_least', '-')}"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three cases, fewer samples")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script on a CPU")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which no case starts")
    ap.add_argument("--case", nargs="+", default=None, help="only these cases (names as in the table)")
    opts = ap.parse_args()
    t0 = time.perf_counter()
    dev = jax.devices()[0]
    profile = default_profile("cuda" if dev.platform == "gpu" else dev.platform)
    print(
        f"device {dev.device_kind} ({dev.platform}), jax {jax.__version__}, profile {profile.name}",
        flush=True,
    )
    records = []
    for name, desc, fn, specs in cases(opts.quick, opts.smoke):
        if opts.case and name not in opts.case:
            continue
        if time.perf_counter() - t0 > opts.budget:
            records.append({"case": name, "description": desc, "skipped": "time budget", "variants": {}})
            continue
        t = time.perf_counter()
        try:
            samples = 3 if opts.quick or opts.smoke else opts.samples
            rec = run_case(name, desc, fn, specs, profile, samples)
        except Exception as e:  # noqa: BLE001
            rec = {
                "case": name,
                "description": desc,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(-3),
                "variants": {},
            }
        rec["wall_s"] = time.perf_counter() - t
        records.append(rec)
        print(f"  {name}: {rec['wall_s']:.0f}s", flush=True)
    out_dir = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "device": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
        "date": datetime.date.today().isoformat(),
        "profile": profile.name,
        "wall_s": time.perf_counter() - t0,
        "cases": records,
    }
    path = out_dir / "schedule_h200.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}")
    print(table(records))


if __name__ == "__main__":
    main()

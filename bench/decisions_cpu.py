"""What jaxrw would decide on every benchmark case under a device profile, per option variant,
predictions only: nothing is compiled or timed, so it runs on a CPU (the H200's decisions, priced
by the h200 profile, before a lease spends GPU time on them).

    python bench/decisions_cpu.py --variant iterations=48 --json bench/results/cpu-...-decisions.json
    python bench/decisions_cpu.py --variant iterations=48 --case 'experts*' --dtype bfloat16

Each row: case, dtype, and per variant ("default" always, then each --variant NAME=VALUE, a field
of `Limits` or of `Profile`) whether the program is rewritten, the predicted costs before and after,
the stop reason, the optimization time and the dots in the program kept. A short table of the
cases whose decision or prediction a variant changes is printed last.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from jaxrw import optimize
from jaxrw.bench.case import select
from jaxrw.bench.report import add_case_options, program_ops, write_rows
from jaxrw.rewrite.profiles import get_profile
from jaxrw.rewrite.run import Limits


def _options(variant: str, profile_name: str) -> dict:
    """optimize()'s options for "default" or "FIELD=VALUE" (a Limits or a Profile field)."""
    profile = get_profile(profile_name)
    if variant == "default":
        return {"profile": profile}
    name, _, raw = variant.partition("=")
    if name in {f.name for f in dataclasses.fields(Limits)}:
        return {"profile": profile, "limits": {name: type(getattr(Limits(), name))(raw)}}
    if name in {f.name for f in dataclasses.fields(profile)}:
        value = raw.lower() in ("1", "true", "on") if isinstance(getattr(profile, name), bool) else float(raw)
        return {"profile": dataclasses.replace(profile, **{name: value})}
    raise SystemExit(f"--variant {variant!r}: not a field of Limits or Profile")


def _decide(fn, args, options: dict) -> dict:
    start = time.perf_counter()
    opt = optimize(fn, schedule="xla", **options)
    rep = opt.report(*args)
    seconds = time.perf_counter() - start
    ops = program_ops(opt, args) or {}
    return {
        "rewritten": bool(rep.rewritten) if rep else None,
        "before_us": rep.cost_before * 1e6 if rep else None,
        "after_us": rep.cost_after * 1e6 if rep else None,
        "stop": rep.stop_reason.value if rep else None,
        "optimize_s": seconds,
        "dots": ops.get("dot_general"),
    }


def _cell(c: dict) -> str:
    kept = "rw" if c.get("rewritten") else "kept"
    return f"{kept} {c.get('after_us') or 0:8.1f}µs {c.get('dots')}d {c.get('optimize_s', 0):4.1f}s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="FIELD=VALUE of Limits or Profile")
    add_case_options(ap)
    a = ap.parse_args()
    variants = ["default", *a.variant]
    rows = []
    for case in select("all", a.case):
        for dtype in a.dtype:
            if dtype not in case.dtypes:
                continue
            name, inst = case.name, case.instance(a.size, dtype)
            args = inst.args(0)
            row = {"case": name, "dtype": dtype}
            for v in variants:
                try:
                    row[v] = _decide(inst.fn, args, {**inst.opt_kwargs, **_options(v, a.profile)})
                except Exception as e:  # noqa: BLE001 - a diagnostic: record it and go on
                    row[v] = {"error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(
                name, dtype, {v: (row[v].get("rewritten"), row[v].get("dots")) for v in variants}, flush=True
            )
            write_rows(a.json, rows)  # as it goes: a long run leaves what it reached
    print(f"\n{'case':28s} {'dtype':9s} " + " ".join(f"{v:>26s}" for v in variants))
    for row in rows:
        cells = [row[v] for v in variants]
        if len({(c.get("rewritten"), round(c.get("after_us") or 0, 2)) for c in cells}) > 1:
            text = [_cell(c) for c in cells]
            print(f"{row['case']:28s} {row['dtype']:9s} " + " ".join(f"{t:>26s}" for t in text))


if __name__ == "__main__":
    main()

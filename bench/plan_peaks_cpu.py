"""The thunky plan's predicted peak memory against XLA's own analysis of the same program, per
bench case, on a CPU: the numbers behind `schedule.timing.PREDICTED_PEAK_FACTOR` (auto refuses a
thunky trial, uncompiled, whose plan predicts more than that many times jax.jit's peak).

    python bench/plan_peaks_cpu.py --case experts_equal,diag_scale --json out/plan-peaks.json

Each row: case, dtype, whether jaxrw rewrote it (schedule "xla", h200 profile), the plan's streams
and regions, its predicted peak, XLA's peak of the program jaxrw runs and of the program as written
(MiB), and their ratio. Compare the ratio with the "thunky +X% peak memory" the H200 bench reports.
"""

from __future__ import annotations

import argparse

import jax

from jaxrw import optimize
from jaxrw.bench.case import select
from jaxrw.bench.report import add_case_options, built_program, write_rows
from jaxrw.rewrite.profiles import get_profile
from jaxrw.schedule.plan import plan_program
from jaxrw.schedule.timing import memory_parts

MIB = 1 << 20


def _row(case, dtype: str, size: str, profile) -> dict:
    inst = case.instance(size, dtype)
    args = inst.args(0)
    opt = optimize(inst.fn, schedule="xla", profile=profile)
    rep = opt.report(*args)
    built = built_program(opt)
    runs = built or inst.fn  # what jaxrw runs (the function as written where it fell back)
    leaves = jax.tree_util.tree_leaves(args)
    flat = built is not None
    plan = plan_program(jax.make_jaxpr(runs)(*(leaves if flat else args)), profile)
    xla = memory_parts(jax.jit(runs), leaves if flat else args)["peak"]
    written = memory_parts(jax.jit(inst.fn), args)["peak"]
    return {
        "case": case.name,
        "dtype": dtype,
        "rewritten": bool(rep.rewritten) if rep else None,
        "streams": plan.streams,
        "regions": len(plan.regions),
        "plan_peak_mib": plan.peak_bytes / MIB,
        "xla_peak_mib": xla / MIB,
        "written_peak_mib": written / MIB,
        "plan_over_xla": plan.peak_bytes / xla if xla else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(ap)
    a = ap.parse_args()
    profile = get_profile(a.profile)
    rows = []
    for case in select("all", a.case):
        for dtype in a.dtype:
            if dtype in case.dtypes:
                rows.append(row := _row(case, dtype, a.size, profile))
                print(
                    f"{row['case']:22s} {dtype:9s} {'rw' if row['rewritten'] else 'kept'} "
                    f"{row['streams']} streams {row['regions']:3d} regions  plan {row['plan_peak_mib']:8.1f} "
                    f"xla {row['xla_peak_mib']:8.1f} MiB  {row['plan_over_xla'] or 0:.2f}x",
                    flush=True,
                )
    if a.json:
        write_rows(a.json, rows)


if __name__ == "__main__":
    main()

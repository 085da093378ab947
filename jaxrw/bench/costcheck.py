"""Does the cost model rank programs the way the device does?

Pairs of equivalent programs (the form users write and a rewritten form) are priced by the cost
model and timed on the current device. Reported: over pairs whose measured times differ by more
than 10%, how often the predicted-faster program is the measured-faster one (target >= 90%), and
the Spearman rank correlation of predicted vs measured time over all programs (target >= 0.9).

    python -m jaxrw.bench.costcheck --size large --json out.json     # on the GPU
    python -m jaxrw.bench.costcheck --rescore recorded.json          # the model today, anywhere

`--rescore` prices a recording's programs with the profile it was recorded with (its `profile`),
not this machine's, unless `--profile` names another; the first line printed says which.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .. import compat
from ..cli import positive_int
from ..errors import InvalidOptionError
from ..options import output_problem
from ..rewrite.measure import time_interleaved
from ..rewrite.profiles import PROFILES, Profile, default_profile, get_profile
from ..rewrite.run import rewrite_jaxpr
from .report import write_json

__all__ = ["PAIRS", "predict", "run", "spearman", "main"]


@dataclass(frozen=True)
class Pair:
    name: str
    written: Callable
    rewritten: Callable
    shapes: Callable[[int], list[tuple[int, ...]]]  # scale -> input shapes


def _trace(A, B):
    return jnp.trace(A @ B)


def _merge3(x, w1, w2, w3):
    return x @ w1, x @ w2, x @ w3


def _merge3_concat(x, w1, w2, w3):
    y = x @ jnp.concatenate([w1, w2, w3], axis=1)
    d = w1.shape[1]
    return y[:, :d], y[:, d : 2 * d], y[:, 2 * d :]


def _stacked_mv(W, v):
    return jnp.stack([W[i] @ v for i in range(W.shape[0])])


PAIRS: list[Pair] = [
    Pair(
        "chain_matvec",
        lambda A, B, v: (A @ B) @ v,
        lambda A, B, v: A @ (B @ v),
        lambda s: [(s, s), (s, s), (s, 1)],
    ),
    Pair(
        "chain_thin",
        lambda A, B, v: (A @ B) @ v,
        lambda A, B, v: A @ (B @ v),
        lambda s: [(s, s), (s, s), (s, 16)],
    ),
    Pair(
        "chain_wide_left",
        lambda A, B, C: (A @ B) @ C,
        lambda A, B, C: A @ (B @ C),
        lambda s: [(16, s), (s, s), (s, s)],
    ),
    Pair(
        "chain_3",
        lambda A, B, C: (A @ B) @ C,
        lambda A, B, C: A @ (B @ C),
        lambda s: [(s, s // 4), (s // 4, s), (s, s // 8)],
    ),
    Pair(
        "factor",
        lambda A, B, C: A @ B + A @ C,
        lambda A, B, C: A @ (B + C),
        lambda s: [(s, s), (s, s), (s, s)],
    ),
    Pair(
        "factor_right",
        lambda A, B, C: A @ C - B @ C,
        lambda A, B, C: (A - B) @ C,
        lambda s: [(s, s // 2), (s, s // 2), (s // 2, s)],
    ),
    Pair("trace", _trace, lambda A, B: jnp.sum(A * B.T), lambda s: [(s, s), (s, s)]),
    Pair("transpose", lambda A, B: (A @ B).T, lambda A, B: B.T @ A.T, lambda s: [(s, s), (s, s)]),
    Pair(
        "lora",
        lambda x, W, A, B: x @ W + (x @ A) @ B,
        lambda x, W, A, B: x @ (W + A @ B),
        lambda s: [(s // 8, s), (s, s), (s, 16), (16, s)],
    ),
    Pair(
        "gauss_newton",
        lambda J, v: J.T @ J @ v,
        lambda J, v: J.T @ (J @ v),
        lambda s: [(s, s // 2), (s // 2, 1)],
    ),
    Pair(
        "merge3_per_call_concat",
        _merge3,
        _merge3_concat,
        lambda s: [(1, s // 2), (s // 2, s // 2), (s // 2, s // 2), (s // 2, s // 2)],
    ),
    Pair(
        "merge3_batch",
        _merge3,
        _merge3_concat,
        lambda s: [(s // 4, s // 2), (s // 2, s // 2), (s // 2, s // 2), (s // 2, s // 2)],
    ),
    Pair("stacked_matvec", _stacked_mv, lambda W, v: W @ v, lambda s: [(16, s // 4, s // 4), (s // 4,)]),
    Pair(
        "exp_product",
        lambda a, b: jnp.exp(a) * jnp.exp(b),
        lambda a, b: jnp.exp(a + b),
        lambda s: [(s, s), (s, s)],
    ),
    Pair(
        "scalar_clutter",
        lambda A, B: (2.0 * A) @ (3.0 * B),
        lambda A, B: 6.0 * (A @ B),
        lambda s: [(s, s), (s, s)],
    ),
]


def predict(fn: Callable, specs: list, profile: Profile, cost_model: str = "roofline") -> float:
    """The model's predicted time of `fn` as written (no rewrites)."""
    closed = jax.make_jaxpr(fn)(*specs)
    return rewrite_jaxpr(
        closed, rules=[], profile=profile, cost_model=cost_model, force=True
    ).report.cost_before


def spearman(x: list[float], y: list[float]) -> float:
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def run(scales: list[int], dtypes: list[str], profile: Profile, samples: int = 7) -> dict:
    rows = []
    for dt in dtypes:
        for scale in scales:
            for pair in PAIRS:
                shapes = pair.shapes(scale)
                keys = jax.random.split(jax.random.key(scale), len(shapes))
                args = [
                    jax.random.normal(k, s, jnp.float32).astype(dt) for k, s in zip(keys, shapes, strict=True)
                ]
                specs = [jax.ShapeDtypeStruct(s, jnp.dtype(dt)) for s in shapes]
                fns = {"written": jax.jit(pair.written), "rewritten": jax.jit(pair.rewritten)}
                t = time_interleaved(fns, args, samples=samples)
                rows.append(
                    {
                        "pair": pair.name,
                        "dtype": dt,
                        "scale": scale,
                        "predicted": {k: predict(getattr(pair, k), specs, profile) for k in fns},
                        "measured": {k: v.median for k, v in t.items()},
                        "spread": {k: v.spread for k, v in t.items()},
                        "samples": {k: v.samples for k, v in t.items()},
                    }
                )
    return summarize(rows) | {"rows": rows}


def rescore(recorded: dict, profile: Profile) -> dict:
    """The recorded measurements against the current model's predictions: checks a change of the
    cost model on the device it was measured on, without that device."""
    by_name = {pair.name: pair for pair in PAIRS}
    rows = []
    for r in recorded["rows"]:
        pair = by_name[r["pair"]]
        specs = [jax.ShapeDtypeStruct(s, jnp.dtype(r["dtype"])) for s in pair.shapes(r["scale"])]
        predicted = {k: predict(getattr(pair, k), specs, profile) for k in ("written", "rewritten")}
        rows.append(r | {"predicted": predicted})
    meta = {k: recorded[k] for k in ("device", "jax", "date", "host") if k in recorded}
    return summarize(rows) | {"rows": rows, "profile": profile.name, "rescored": True} | meta


def recording_profile(recorded: dict, here: Profile) -> tuple[Profile | None, str]:
    """The profile to rescore a recording with when --profile is not given, and why: the built-in
    one it names (its 'profile'), `here` (this machine's) where it names none, and None where it
    names one that is not built in (a calibrated one). Rescoring an H200 recording with this CPU's
    profile gave 95.1% / 0.700 without a word."""
    name = recorded.get("profile")
    if isinstance(name, str) and name in PROFILES:
        return PROFILES[name], "the recording's"
    if name:
        valid = ", ".join(repr(p) for p in sorted(PROFILES))
        return None, (
            f"recorded with profile {name!r}, which is not built in; pass --profile ({valid} or the path "
            "of a .json profile)"
        )
    return here, "this machine's: the recording names none"


def summarize(rows: list[dict]) -> dict:
    decided = agree = 0
    pred, meas = [], []
    for r in rows:
        m, p = r["measured"], r["predicted"]
        pred += [p["written"], p["rewritten"]]
        meas += [m["written"], m["rewritten"]]
        hi, lo = max(m.values()), min(m.values())
        if hi > 1.10 * lo:
            decided += 1
            agree += (m["written"] < m["rewritten"]) == (p["written"] < p["rewritten"])
    return {
        "pairs": len(rows),
        "pairs_differing_10pct": decided,
        "agreement": agree / decided if decided else float("nan"),
        "spearman": spearman(pred, meas) if len(pred) > 2 else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxrw.bench.costcheck", description=__doc__)
    ap.add_argument("--size", choices=["small", "large"], default="small")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    ap.add_argument("--json", default=None)
    ap.add_argument("--samples", type=positive_int, default=7, help="timed samples per program (default: 7)")
    ap.add_argument(
        "--profile",
        default=None,
        help="built-in profile name or a .json profile (default: with --rescore the recording's, else this "
        "device's calibrated or built-in one)",
    )
    ap.add_argument(
        "--rescore",
        default=None,
        metavar="JSON",
        help="no timing: score the current model against the measurements recorded in JSON, with the "
        "profile it was recorded with unless --profile says otherwise",
    )
    a = ap.parse_args(argv)
    scales = [256] if a.size == "small" else [2048, 8192]
    dtypes = ["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]
    problem = a.json and output_problem(a.json, "--json")  # before minutes of timing
    if problem:
        ap.error(problem)
    try:
        profile = get_profile(a.profile) if a.profile else default_profile(compat.device_kind())
    except InvalidOptionError as e:
        ap.error(str(e))
    if a.rescore:
        try:
            with open(a.rescore) as f:
                recorded = json.load(f)
            if not isinstance(recorded, dict) or not isinstance(recorded.get("rows"), list):
                raise ValueError("no 'rows' list: not a costcheck result")
        except (OSError, ValueError) as e:
            ap.error(f"--rescore {a.rescore!r}: {type(e).__name__}: {e}")
        if not a.profile:
            profile, why = recording_profile(recorded, profile)
            if profile is None:
                ap.error(f"--rescore {a.rescore!r}: {why}")
        else:
            why = "--profile"
        device = recorded.get("device", "?")
        print(f"rescoring {a.rescore} (measured on {device}) with profile {profile.name} ({why})")
        try:
            res = rescore(recorded, profile)
        except (ValueError, KeyError) as e:
            ap.error(f"--rescore {a.rescore!r}: {type(e).__name__}: {e}")
    else:
        res = run(scales, dtypes, profile, samples=a.samples)
        res |= {
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "profile": profile.name,
            "date": datetime.date.today().isoformat(),
            "host": platform.node(),
        }
    for r in res["rows"]:
        m, p = r["measured"], r["predicted"]
        print(
            f"{r['pair']:<24} {r['dtype']:<9} {r['scale']:>5}  measured {m['written'] * 1e6:9.1f} "
            f"{m['rewritten'] * 1e6:9.1f} us   predicted {p['written'] * 1e6:9.1f} "
            f"{p['rewritten'] * 1e6:9.1f} us"
        )
    print(
        f"pairs {res['pairs']}, differing >10%: {res['pairs_differing_10pct']}, "
        f"agreement {res['agreement']:.2%}, spearman {res['spearman']:.3f}"
    )
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

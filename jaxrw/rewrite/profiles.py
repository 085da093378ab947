"""Device profiles: the measured constants a cost model prices kernels with.

Built-in profiles: `h200` (measured on an NVIDIA H200; see bench/README.md) and `cpu` (a 2-core
x86 machine). `jaxrw calibrate` measures the current device and saves a profile as JSON in the
user cache directory; `default_profile()` prefers that file when it matches the device kind.
Profile files are data: they are validated on load and a malformed one is ignored with a warning.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionError
from ..logs import warn_user

__all__ = [
    "Profile",
    "PROFILES",
    "get_profile",
    "default_profile",
    "cache_dir",
    "save_profile",
    "load_profile",
]


@dataclass(frozen=True)
class Profile:
    """Rates of one device. Matrix rates are FLOP/s by dtype name; bandwidth is bytes/s of a
    read+write copy; `gemm_efficiency` maps a size bucket (log2 of the side of the square GEMM of
    equal work, the cube root of m·n·k) to the fraction of the peak matrix rate it reaches."""

    name: str
    kind: str  # "cuda" or "cpu"
    matmul_flops: dict[str, float]
    vector_flops: float
    bandwidth: float
    launch_s: float
    gemm_efficiency: dict[int, float] = field(default_factory=dict)
    call_s: float = 0.0  # fixed cost of one call of a compiled program (dispatch), paid once
    # whether a transpose of an input or a product costs nothing: XLA folds it into the GEMM that
    # reads it (its operand layout) or the fused kernel that consumes it. `jaxrw calibrate`
    # measures it (x @ W.T against x @ W); off in the built-in profiles, whose decisions were
    # validated on the H200 without it (bench/HISTORY.md, twelfth lease)
    transpose_folded: bool = False
    # whether a left-nested chain of same-axis concats is priced as decode emits it, one n-ary
    # concatenate (each link copies its right operand; one launch per chain) rather than link by
    # link. On since the seventeenth lease. On the H200, of the seven bench cases whose decisions
    # it changes, all ran at least 0.98x with it in both dtypes except multibranch_cell bf16 (0.98x,
    # [0.97, 0.99]; such a rewrite is now timed against the program as written first:
    # choice.confirm_rewrite); small_decoders ran 1.17-1.28x where it had been kept
    # (bench/HISTORY.md, seventeenth lease)
    concat_chains: bool = True
    # whether a GEMM whose left operand contracts over a leading axis (not its minor one: Aᵀ@B
    # without the transpose, "TN") runs as a copy of that operand into the other layout and a GEMM
    # (and of the right operand too when it contracts over its minor axis, "TT"). XLA:CPU does
    # worse: on this project's CPU such products ran 1.2-15x slower than the plain layout, at least
    # a transposed copy more, except matrix-vector products (fortieth session); cuBLAS reads
    # either layout. `jaxrw calibrate` measures it; on in the built-in CPU profile
    lhs_transposed_copied: bool = False
    # the fraction of its output's bytes an elementwise op inside a fused kernel still costs (its
    # share of the kernel). At 0.1 on this project's CPU, the costcheck rescore stays as it is and
    # ew_factor and gpt_train_step (both dtypes) are kept, as the H200 measured them (bench/HISTORY.md,
    # "A win jaxrw leaves"); not yet timed on the suite, so 0.5 stays
    fused_share: float = 0.5
    source: str = "built-in"

    def matmul_rate(self, dtype: str) -> float:
        """GEMM FLOP/s in `dtype`, counting 2mnk per GEMM. A complex GEMM is four real ones in its
        component type (a quarter of that rate); 8-bit floats run at the int8 rate where the
        profile has one (the H200's tensor cores: the same peak); others at float32's."""
        if dtype.startswith("complex"):
            return (
                self.matmul_rate({"complex64": "float32", "complex128": "float64"}.get(dtype, dtype[7:])) / 4
            )
        if dtype not in self.matmul_flops and dtype.startswith("float8") and "int8" in self.matmul_flops:
            return self.matmul_flops["int8"]
        return self.matmul_flops.get(dtype, self.matmul_flops.get("float32", self.vector_flops))

    def efficiency(self, m: int, n: int, k: int) -> float:
        """Fraction of peak a GEMM of this size reaches (small GEMMs waste the machine). The table
        is measured on square GEMMs; a rectangular one is looked up at the cube of equal work."""
        if not self.gemm_efficiency:
            return 1.0
        side = max(1.0, float(m) * n * k) ** (1.0 / 3.0)
        bucket = int(side + 1e-9).bit_length() - 1
        keys = sorted(self.gemm_efficiency)
        best = keys[0]
        for key in keys:
            if key <= bucket:
                best = key
        return self.gemm_efficiency[best]


# H200: bf16 GEMM ~790 TFLOP/s and ~4.3 TB/s device copy measured on the device (DESIGN.md);
# float32 under jax's default precision runs as TF32 at ~340 TFLOP/s. The efficiency table is a
# first estimate for thin GEMMs (a matrix-vector product is bandwidth bound: the roofline's byte
# term already prices it, so the table only discounts the FLOP term).
H200 = Profile(
    name="h200",
    kind="cuda",
    matmul_flops={
        "bfloat16": 790e12,
        "float16": 790e12,
        "float32": 340e12,
        "float64": 60e12,
        "int8": 1500e12,
        "int32": 30e12,
    },
    vector_flops=60e12,
    bandwidth=4.3e12,
    launch_s=3e-6,
    gemm_efficiency={0: 0.02, 4: 0.1, 6: 0.3, 8: 0.6, 10: 0.85, 12: 0.95},
    call_s=3e-5,  # measured ~37 us per jit call on the H200 host (jax 0.11.2)
)

# A 2-core x86 CPU (this project's CI machine class): f32 GEMM ~60 GFLOP/s, ~8 GB/s copies.
CPU = Profile(
    name="cpu",
    kind="cpu",
    matmul_flops={"float32": 60e9, "float64": 30e9, "bfloat16": 15e9, "float16": 15e9, "int32": 10e9},
    vector_flops=8e9,
    bandwidth=8e9,
    launch_s=2e-6,
    gemm_efficiency={0: 0.1, 3: 0.3, 5: 0.6, 7: 0.9},
    call_s=1e-5,
    lhs_transposed_copied=True,
)

PROFILES: dict[str, Profile] = {"h200": H200, "cpu": CPU}


def get_profile(name: str) -> Profile:
    """A built-in profile by name, or a saved one by the path of its JSON file (`jaxrw calibrate
    --output`)."""
    if name in PROFILES:
        return PROFILES[name]
    if name.endswith(".json"):
        path = Path(name).expanduser()
        if not path.is_file():  # not "malformed, ignored" and then an error (a new user's audit)
            raise InvalidOptionError(
                f"profile {name!r}: no such file (a .json profile from `jaxrw calibrate --output`)"
            )
        return load_profile(path, asked=True)
    raise InvalidOptionError(
        f"unknown device profile {name!r}; valid: {sorted(PROFILES)!r} or the path of a .json profile"
    )


def cache_dir() -> Path:
    """Where jaxrw keeps calibrated profiles and autotune choices ($JAXRW_CACHE_DIR overrides; a
    relative $XDG_CACHE_HOME is ignored, as the XDG spec says). Absolute, so the same cache is
    found from any working directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")
    root = os.environ.get("JAXRW_CACHE_DIR") or os.path.join(base, "jaxrw")
    return Path(root).expanduser().absolute()


def save_profile(profile: Profile, path: Path | None = None) -> Path:
    """Write `profile` as JSON (to the cache directory, where `default_profile` finds it, unless
    `path` says otherwise), through a temporary file: an interrupted write leaves no half file."""
    path = path or cache_dir() / f"profile-{profile.kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(profile)
    data["gemm_efficiency"] = {str(k): v for k, v in profile.gemm_efficiency.items()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def profile_problem(prof: Profile) -> str | None:
    """What makes `prof` unusable as a cost model's rates (zero, negative, NaN or absurd values,
    which price work at nothing or infinity), or None."""
    rates = {"vector_flops": prof.vector_flops, "bandwidth": prof.bandwidth}
    rates.update({f"matmul_flops[{k!r}]": v for k, v in prof.matmul_flops.items()})
    for name, r in rates.items():
        if isinstance(r, bool) or not (isinstance(r, int | float) and 0 < r < 1e18):
            return f"{name}={r!r}: a rate in (0, 1e18)"
    for name in ("launch_s", "call_s"):
        v = getattr(prof, name)
        if isinstance(v, bool) or not (isinstance(v, int | float) and 0 <= v < 1):
            return f"{name}={v!r}: seconds in [0, 1)"
    if not (isinstance(prof.fused_share, int | float) and 0 <= prof.fused_share <= 1):
        return f"fused_share={prof.fused_share!r}: a fraction in [0, 1]"
    for k, e in prof.gemm_efficiency.items():
        if isinstance(e, bool) or not (isinstance(k, int) and isinstance(e, int | float) and 0 < e <= 1):
            return f"gemm_efficiency[{k!r}]={e!r}: a fraction of the peak rate in (0, 1]"
    return None


def _number(value: Any, key: str) -> float:
    """A JSON number (float(true) is 1.0, float("6e13") parses: neither is one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}={value!r}: a number")
    return float(value)


def _flag(data: dict, key: str, default: bool) -> bool:
    """A JSON true/false (bool("false") is True)."""
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r}: true or false")
    return value


def load_profile(path: Path, asked: bool = False) -> Profile | None:
    """A profile from JSON, or None (with a warning) when the file is missing fields or malformed;
    `asked` (a profile the user named): InvalidOptionError naming the problem instead."""
    try:
        data = json.loads(path.read_text())
        prof = Profile(
            name=str(data["name"]),
            kind=str(data["kind"]),
            matmul_flops={str(k): _number(v, f"matmul_flops.{k}") for k, v in data["matmul_flops"].items()},
            vector_flops=_number(data["vector_flops"], "vector_flops"),
            bandwidth=_number(data["bandwidth"], "bandwidth"),
            launch_s=_number(data["launch_s"], "launch_s"),
            gemm_efficiency={
                int(k): _number(v, f"gemm_efficiency.{k}") for k, v in data.get("gemm_efficiency", {}).items()
            },
            call_s=_number(data.get("call_s", 0.0), "call_s"),
            transpose_folded=_flag(data, "transpose_folded", False),
            # a profile saved before the flag: the built-in profile's of its kind
            lhs_transposed_copied=_flag(data, "lhs_transposed_copied", str(data["kind"]) == "cpu"),
            concat_chains=_flag(data, "concat_chains", Profile.concat_chains),
            fused_share=_number(data.get("fused_share", Profile.fused_share), "fused_share"),
            source=str(path),
        )
        problem = profile_problem(prof)
        if problem:
            raise ValueError(problem)
        return prof
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        if asked:
            raise InvalidOptionError(
                f"profile {str(path)!r} could not be loaded: {type(e).__name__}: {e}"
            ) from e
        warn_user(f"jaxrw: ignoring malformed profile {path}: {e}")
        return None


def default_profile(kind: str) -> Profile:
    """A calibrated profile for this device kind if one was saved, else the built-in one."""
    saved = cache_dir() / f"profile-{kind}.json"
    if saved.exists():
        prof = load_profile(saved)
        if prof is not None and prof.kind == kind:
            return prof
    return H200 if kind == "cuda" else CPU

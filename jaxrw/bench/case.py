"""Benchmark cases: a naive function as users write it, its inputs, and a hand-optimized twin.

A `Case` is registered by name in a suite. `Case.build(size, dtype)` returns an `Instance`: the
naive function, a seed -> fresh random inputs builder (never zeros), and where one exists a
hand-optimized equivalent. A hand version may need its arguments prepared once outside the
timed call (weights concatenated ahead of time, batch norm folded): `hand_prep` does that.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidOptionError

__all__ = [
    "Case",
    "Instance",
    "CASES",
    "SUITES",
    "SIZES",
    "DTYPES",
    "register",
    "select",
    "Rand",
    "pick",
    "abstract_inputs",
]

SUITES = ("algebra", "merge", "models", "streams")
SIZES = ("small", "large")
DEVICE_RNG_MIN = 1 << 20  # arrays with at least this many elements are drawn on the device
DTYPES = ("float32", "bfloat16")


@dataclass
class Instance:
    """One case at one size and dtype, ready to run."""

    fn: Callable[..., Any]
    args: Callable[[int], tuple]  # seed -> fresh random inputs
    hand: Callable[..., Any] | None = None
    hand_prep: Callable[[tuple], tuple] | None = None  # args -> hand's args, run once, untimed
    hand_label: str = "hand-optimized"
    opt_kwargs: dict[str, Any] = field(default_factory=dict)  # extra jaxrw.optimize options
    shape: str = ""  # human-readable size, shown in the table


@dataclass(frozen=True)
class Case:
    name: str
    suite: str
    build: Callable[[str, str], Instance] = field(repr=False)
    doc: str = ""
    dtypes: tuple[str, ...] = DTYPES
    heavy: bool = False  # skipped by `--size small` runs unless named explicitly

    def instance(self, size: str, dtype: str) -> Instance:
        if size not in SIZES:
            raise InvalidOptionError(f"unknown size {size!r}; valid: {list(SIZES)!r}")
        if dtype not in self.dtypes:
            raise InvalidOptionError(
                f"case {self.name!r} has no dtype {dtype!r}; valid: {list(self.dtypes)!r}"
            )
        return self.build(size, dtype)


CASES: dict[str, Case] = {}


def register(suite: str, doc: str = "", dtypes: Sequence[str] = DTYPES, heavy: bool = False, name: str = ""):
    """Decorator: register `build(size, dtype) -> Instance` as a case of `suite`."""
    if suite not in SUITES:
        raise InvalidOptionError(f"unknown suite {suite!r}; valid: {list(SUITES)!r}")

    def deco(build: Callable[[str, str], Instance]) -> Callable[[str, str], Instance]:
        case_name = name or build.__name__
        if case_name in CASES:
            raise ValueError(f"benchmark case {case_name!r} is already registered")
        text = doc or ((build.__doc__ or "").strip().splitlines() or [""])[0]
        CASES[case_name] = Case(case_name, suite, build, text, tuple(dtypes), heavy)
        return build

    return deco


def load_suites() -> None:
    """Import every suite module (each registers its cases on import)."""
    from . import algebra, merge, models, pergrad, streams  # noqa: F401


def select(suite: str = "all", pattern: str | None = None) -> list[Case]:
    """Cases of `suite` ('all', one suite or a comma-separated list, run in that order) whose name
    matches the glob or substring `pattern` (or any of a comma-separated list). A pattern that is
    a case's whole name selects that case alone: `--case llama288` is not also llama288_hoist.
    A pattern may name the suite as the tables do: `algebra/chain_mv`, `merge/*`."""
    load_suites()
    names = [s.strip() for s in suite.split(",") if s.strip()] or ["all"]
    for s in names:
        if s != "all" and s not in SUITES:
            raise InvalidOptionError(f"unknown suite {s!r}; valid: {['all', *SUITES]!r}")
    order = list(SUITES) if "all" in names else list(dict.fromkeys(names))
    cases = [c for s in order for c in CASES.values() if c.suite == s]  # registration order within a suite
    if pattern:
        # "suite/name", as the tables and results name a case, matches within that suite
        pats = [tuple(p.strip().rsplit("/", 1)) if "/" in p else ("*", p.strip()) for p in pattern.split(",")]
        pats = [(sp, p) for sp, p in pats if p]
        valid = sorted(c.name for c in cases)
        exact = {(sp, p) for sp, p in pats if p in valid}  # whole names match alone
        cases = [
            c
            for c in cases
            if any(fnmatch.fnmatch(c.suite, sp) for sp, p in exact if p == c.name)
            or any(
                fnmatch.fnmatch(c.suite, sp) and (fnmatch.fnmatch(c.name, p) or p in c.name)
                for sp, p in pats
                if (sp, p) not in exact
            )
        ]
        if not cases:
            named = sorted(f"{c.suite}/{c.name}" for c in select(suite))
            raise InvalidOptionError(f"no case of suite {suite!r} matches {pattern!r}; valid: {named!r}")
    return cases


class Rand:
    """Random arrays for one seed: normal values scaled to keep activations O(1), never zeros.

    Small arrays are drawn with NumPy (no per-shape compilation), large ones (GPU sizes) with
    jax.random on the device (no host generation and transfer of gigabytes). Inside
    `abstract_inputs()` everything is drawn with jax.random, which traces: a whole large case can
    then be built and run under `jax.eval_shape` without allocating it (the tests do so)."""

    abstract = False

    def __init__(self, seed: int, dtype: str):
        self.rng = np.random.default_rng(seed)
        self.seed, self.count = seed, 0
        self.dtype = dtype

    def _key(self) -> Any:
        import jax

        self.count += 1
        return jax.random.fold_in(jax.random.key(self.seed), self.count)

    def normal(self, *shape: int, scale: float = 1.0, dtype: str | None = None) -> Any:
        import jax
        import jax.numpy as jnp

        if Rand.abstract or math.prod(shape) >= DEVICE_RNG_MIN:
            return (jax.random.normal(self._key(), shape, jnp.float32) * scale).astype(dtype or self.dtype)
        x = self.rng.standard_normal(shape, dtype=np.float32)
        if scale != 1.0:
            x *= np.float32(scale)
        return jnp.asarray(x).astype(dtype or self.dtype)

    def weight(self, fan_in: int, *shape: int, dtype: str | None = None) -> Any:
        """A weight of `shape` scaled by 1/sqrt(fan_in) (so x @ W keeps x's scale)."""
        return self.normal(*shape, scale=1.0 / np.sqrt(fan_in), dtype=dtype)

    def positive(self, *shape: int, low: float = 0.5, high: float = 1.5, dtype: str | None = None) -> Any:
        import jax
        import jax.numpy as jnp

        if Rand.abstract:
            return jax.random.uniform(self._key(), shape, jnp.float32, low, high).astype(dtype or self.dtype)
        x = self.rng.uniform(low, high, shape).astype(np.float32)
        return jnp.asarray(x).astype(dtype or self.dtype)

    def ints(self, high: int, *shape: int) -> Any:
        import jax
        import jax.numpy as jnp

        if Rand.abstract:
            return jax.random.randint(self._key(), shape, 0, high, jnp.int32)
        return jnp.asarray(self.rng.integers(0, high, shape).astype(np.int32))


@contextlib.contextmanager
def abstract_inputs() -> Iterator[None]:
    """Draw inputs with jax.random (traceable) while inside; see `Rand`."""
    old, Rand.abstract = Rand.abstract, True
    try:
        yield
    finally:
        Rand.abstract = old


def pick(size: str, small: Any, large: Any) -> Any:
    """The small (CPU) or large (GPU) value of a size parameter."""
    return small if size == "small" else large

"""Where a hoisted signature's arguments sit in a call (`Layout`): which leaves are hoisted, which
of them the main program reads, and the jit of the main program that takes only those leaves,
the prologue values and the other arguments (the quick path of hoist.HotPath)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax

from . import compat
from .options import signature_of
from .prologue import picker
from .schedule.xla_modes import tuned_jit
from .signature import as_bound, leaf_key, leaf_owners, split_config

__all__ = ["Layout", "fast_signature", "hoisted_as_passed", "with_hoisted"]


class Layout:
    """Where a signature's hoisted arguments sit, so a cached call can pass only what the main
    program reads: the prologue values, and the hoisted leaves `main` reads itself (those not
    merged); every other argument passes as the user gave it. jax.jit's C++ dispatch checks each
    array argument on every call, so the hoisted leaves left out save that host time (llama-style
    parameter pytrees hold dozens of them)."""

    def __init__(self, opt: Any, entry: Any, key: tuple, args: tuple, kwargs: dict):
        self.pos, self.names = hoisted_as_passed(opt, args, kwargs)
        self._posset = frozenset(self.pos)
        # the usual layout (the parameters first, by position): hoisted_args and fast slice it
        # instead of picking positions, a few µs of Python less on every hot call
        self.prefix = len(self.pos) if self.pos == tuple(range(len(self.pos))) and not self.names else None
        dyn, _statics = opt._split(args, kwargs)
        full, in_tree = jax.tree_util.tree_flatten(dyn)
        owners = leaf_owners(in_tree, kwargs, opt.static_argnums, opt.static_argnames)
        hoisted = set(self.pos) | set(self.names)
        self.full_index = tuple(i for i, o in enumerate(owners) if o in hoisted)  # local -> flat
        local, self.tree = jax.tree_util.tree_flatten(self.hoisted_args(args, kwargs))
        # the local order must be the flat order (positional, then keywords by name)
        self.ok = len(local) == len(self.full_index) and all(
            full[i] is x for i, x in zip(self.full_index, local, strict=False)
        )
        read = set(entry.call.used)
        self.passed = tuple(j for j, i in enumerate(self.full_index) if i in read)
        self.pick_passed = picker(self.passed)
        self.pick_passed_full = picker(tuple(self.full_index[j] for j in self.passed))  # of all leaves
        slow = set(entry.call.slow)
        self.slow = tuple(j for j, i in enumerate(self.full_index) if i in slow)  # local positions
        self.pick_slow = picker(self.slow)
        # the hoisted arguments' structures and leaf types, rebuilt inside the jit (`stand_ins`)
        present = [*((i, args[i]) for i in self.pos), *((k, kwargs[k]) for k in self.names)]
        self._forms = [(k, *_form(v)) for k, v in present]
        self.spelled = self._spelling(args, kwargs)

    def difference(self, merged: tuple[tuple, dict], statics: tuple, bound_statics: tuple) -> str:
        """What a call (`merged`: its arguments with the hoisted ones; `statics`: its key's) changed
        of the call this layout was made from (`bound_statics`), for a bound function's error."""
        (n, names), (was_n, was_names) = self._spelling(*merged), self.spelled
        if (n, names) != (was_n, was_names):
            return (
                f"called with {n} positional argument(s) and keywords {list(names)} besides the hoisted "
                f"ones, bound with {was_n} and {list(was_names)}"
            )
        if as_bound(statics) == as_bound(bound_statics):
            return "another pytree structure"
        if split_config(statics)[0] == split_config(bound_statics)[0]:
            return "under another jax_enable_x64 or mesh than it was bound under"
        return "other static values"

    def _spelling(self, args: tuple, kwargs: dict) -> tuple[int, tuple[str, ...]]:
        """How a call passes the arguments besides the hoisted ones: how many by position, which by name."""
        return len(args) - len(self.pos), tuple(sorted(k for k in kwargs if k not in self.names))

    def stand_ins(self, passed: tuple) -> dict[int | str, Any]:
        """Inside the main program's jit: the hoisted arguments by position or name, of the leaves
        it reads (`passed`) and zeros of the others' types, which it never reads (jax drops them
        before lowering).
        Zeros, not placeholder objects: unflattening runs a registered dataclass's __post_init__,
        which may check or combine its fields, as it does under jax.jit."""
        local = [jax.numpy.zeros(a.shape, _as_config(a.dtype)) for _, _, avals in self._forms for a in avals]
        for j, x in zip(self.passed, passed, strict=True):
            local[j] = x
        out, at = {}, 0
        for k, tree, avals in self._forms:
            out[k], at = tree.unflatten(local[at : at + len(avals)]), at + len(avals)
        return out

    def hoisted_args(self, args: tuple, kwargs: dict) -> list[Any]:
        if self.prefix is not None and len(args) >= self.prefix:
            return list(args[: self.prefix])
        slow = [args[i] for i in self.pos if i < len(args)]
        return slow + [kwargs.get(k) for k in self.names] if self.names else slow

    def fast(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments the main program's jit takes besides the values (hoisted ones removed)."""
        if self.prefix is not None:
            return args[self.prefix :], kwargs
        if self.pos:
            args = tuple(a for i, a in enumerate(args) if i not in self._posset)
        if self.names:
            kwargs = {k: v for k, v in kwargs.items() if k not in self.names}
        return args, kwargs

    def shifted(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        """Positions of the user's call as positions of the jit's call (values and passed first)."""
        return tuple(2 + i - sum(p < i for p in self.pos) for i in idx if i not in self._posset)

    def main_jit(self, opt: Any, entry: Any, key: tuple, mismatch: Callable[..., Exception]) -> Any:
        """jax.jit of (values, passed, *fast args, **fast kwargs) -> the signature's output."""
        h = entry.call
        tree, keys, statics = key
        fill = tuple(self.full_index[j] for j in self.passed)
        hoisted_flat = set(self.full_index)

        def body(values: list, passed: tuple, *fast: Any, **fast_kw: Any) -> Any:
            merged = with_hoisted(fast, fast_kw, self.stand_ins(passed))
            if merged is None:
                raise mismatch(f"{len(fast)} positional arguments besides the bound ones: too few")
            dyn, st = opt._split(*merged)
            leaves, t = jax.tree_util.tree_flatten(dyn)
            # a call under another matmul precision or promotion rules is taken, as a compiled
            # executable takes it: this jit traces the bound program under them
            same_statics = as_bound(st) == as_bound(statics)
            if not compat.same_treedef(t, tree) or not same_statics or len(leaves) != len(keys):
                raise mismatch(self.difference(merged, st, statics))
            for i, x in zip(fill, passed, strict=True):
                leaves[i] = x
            for i, x in enumerate(leaves):
                if (i not in hoisted_flat or i in fill) and leaf_key(x) != keys[i]:
                    raise mismatch(f"got {_spelled(leaf_key(x))}, bound with {_spelled(keys[i])}")
            return jax.tree_util.tree_unflatten(entry.out_tree, h.run(leaves, values, nested=True))

        compat.named_as(body, opt.fn)  # the program's name in XLA's logs: jit(f)
        named = self._signature(opt.fn)
        if named is not None:  # jax names a bad argument `x`, not `fast[0]`
            body.__signature__ = named  # type: ignore[attr-defined]
        kw = {
            "static_argnums": self.shifted(opt.static_argnums),
            "static_argnames": opt.static_argnames,
            "donate_argnums": self.shifted(opt.donate_argnums),
            "donate_argnames": opt.donate_argnames,  # passed by keyword: **fast_kw
        }
        return tuned_jit(body, h.mode, **kw)

    def _signature(self, fn: Callable) -> inspect.Signature | None:
        """The main jit's parameters as jax names them in its errors: the prologue values, the
        hoisted leaves it reads, then `fn`'s parameters besides those hoisted by position. None
        where they cannot be told apart (a hoisted position within *args, an unreadable signature,
        a parameter named `values` or `passed`, one hoisted by name before others without defaults)."""
        sig = signature_of(fn)
        if sig is None:
            return None
        P = inspect.Parameter
        params = list(sig.parameters.values())
        positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        if any(i >= len(positional) for i in self.pos):
            return None
        # removed where passed by position (`shifted` numbers the rest so); one passed by name
        # stays, never given (optional: a call binds without it)
        dropped = {positional[i].name for i in self.pos}
        rest = [
            p.replace(default=None) if p.name in self.names else p for p in params if p.name not in dropped
        ]
        head = [P("values", P.POSITIONAL_ONLY), P("passed", P.POSITIONAL_ONLY)]
        try:
            return sig.replace(parameters=head + rest)
        except ValueError:  # a duplicate name, or a default before a parameter without one
            return None


def _form(tree: Any) -> tuple[Any, list]:
    """A pytree's structure and its leaves' abstract values (kept instead of the arrays)."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, [compat.get_aval(x) for x in leaves]


def fast_signature(fast: tuple[tuple, dict]) -> tuple | None:
    """The pytree structure and leaf kinds of a call's arguments besides the hoisted ones (None
    where one is no array or scalar: a static value)."""
    leaves, tree = jax.tree_util.tree_flatten(fast)
    try:
        return tree, tuple(map(leaf_key, leaves))
    except Exception:  # noqa: BLE001 - e.g. a static string: not told apart here
        return None


def _spelled(key: tuple) -> str:
    """A leaf_key as jax spells an array type (float32[3,8]), with its weak type and sharding."""
    weak = " weakly typed" if key[2] else ""
    return f"{key[1]}[{','.join(map(str, key[0]))}]{weak}" + (f" sharded {key[3]}" if len(key) > 3 else "")


def with_hoisted(fast: tuple, fast_kw: dict, hoisted: dict[int | str, Any]) -> tuple[tuple, dict] | None:
    """The whole call from the other arguments and the hoisted ones (by position or keyword), or
    None when too few arguments came for the hoisted positions."""
    n = len(fast) + sum(isinstance(k, int) for k in hoisted)
    if any(isinstance(k, int) and k >= n for k in hoisted):
        return None
    it = iter(fast)
    args = tuple(hoisted[i] if i in hoisted else next(it) for i in range(n))
    return args, {**fast_kw, **{k: v for k, v in hoisted.items() if isinstance(k, str)}}


def hoisted_as_passed(opt: Any, args: tuple, kwargs: dict) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The positions and keywords of the hoisted arguments this call passes (either spelling of
    each names it: `Optimized.hoisted_owners`)."""
    owned = opt.hoisted_owners
    pos = tuple(sorted(i for i in owned if isinstance(i, int) and i < len(args)))
    return pos, tuple(sorted(k for k in owned if isinstance(k, str) and k in kwargs))


def _as_config(dtype: Any) -> Any:
    """A dtype as jax makes it under the config now (float64 is float32 with x64 off: a call
    bound under x64 and made without it is refused after, instead of warning here first)."""
    return jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)

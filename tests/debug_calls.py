"""What the jax.debug call tests share: functions that record what their calls see, and the
same function run under jax.jit and under optimize."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxrw


def _record(fn_of_log):
    """(log, fn): `fn` built by `fn_of_log(log)` appends what its jax.debug.callback calls see."""
    log: list = []
    return log, fn_of_log(log)


def _chain(log):
    def f(A, B, v):
        jax.debug.callback(lambda s, c: log.append((float(s), int(c))), A.sum(), 3)
        jax.debug.callback(lambda x: log.append(np.asarray(x)), B @ v)
        return A @ B @ (B @ v)  # best as A @ (B @ (B @ v)), B @ v shared with the callback

    return f


def _calls(build, *args, **opts):
    """What jax.jit's and optimize's programs give and what their callbacks saw, in this order."""
    out = []
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, **opts)):
        log, f = _record(build)
        got = wrap(f)(*args)
        jax.effects_barrier()
        out.append((got, log, f))
    return out


def _tap(log, x, key=None):
    """`x`, after a call back that records its sum in `log` (with `key`, if given)."""
    jax.debug.callback(lambda s: log.append(float(s) if key is None else (key, float(s))), x.sum())
    return x


def _loop(kind, log=None, ordered=False, steps=3):
    """(A, v) -> A @ A @ ... v by `kind` (scan, while, fori), each step calling back with the
    step's carry sum (recorded in `log`, or printed)."""

    def step(A, c):
        if log is None:
            jax.debug.print("c {}", c.sum(), ordered=ordered)
        else:
            jax.debug.callback(lambda s: log.append(float(s)), c.sum(), ordered=ordered)
        return A @ A @ c  # rewritten as A @ (A @ c)

    def f(A, v):
        if kind == "scan":
            return jax.lax.scan(lambda c, _: (step(A, c), None), v, None, length=steps)[0]
        if kind == "fori":
            return jax.lax.fori_loop(0, steps, lambda i, c: step(A, c), v)
        cond = lambda ic: ic[0] < steps  # noqa: E731
        return jax.lax.while_loop(cond, lambda ic: (ic[0] + 1, step(A, ic[1])), (0, v))[1]

    return f


def _under_transforms(build, A, v):
    """For jax.grad and jax.vmap (over A's copies) of `build`'s function: (jax.jit's result, its
    calls' log, optimize's result, its calls' log)."""
    for transform in (jax.grad, lambda f: jax.vmap(f, in_axes=(0, None))):
        args = (A, v) if transform is jax.grad else (jnp.stack([A, 2 * A]), v)
        outs = []
        for wrap in (jax.jit, jaxrw.optimize):
            log, f = _record(build)
            got = transform(wrap(f))(*args)
            jax.effects_barrier()
            outs.extend((got, log))
        yield tuple(outs)

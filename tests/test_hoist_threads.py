"""A hoisting function called from several threads, as jax.jit may be: each call gets the values of
its own parameters (Optimized._lock serializes the Python paths that read and refill kept values),
and the quick path never pairs one set's identity checks with another set's values."""

from __future__ import annotations

import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw import hoist


def f(p, x):
    return x @ p["A"] @ p["B"]  # (x @ A) @ B -> x @ (A @ B): A @ B hoisted


def _sets(n, d=32, seed=0):
    rng = np.random.default_rng(seed)
    return [{k: jnp.asarray(rng.standard_normal((d, d)), jnp.float32) for k in "AB"} for _ in range(n)]


@pytest.fixture
def often_switching():
    """Threads switched every 10 µs (default 5 ms): races that need an unlucky switch show."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def _in_threads(work, n):
    errors: list[BaseException] = []

    def run(i):
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("one_slot", [True, False])
def test_threads_with_parameters_of_their_own_each_get_their_own_values(often_switching, one_slot):
    # one slot (a bound that fits one set, as the default does for a large model): a thread's refill
    # landing while another's quick path was set up left that path serving the other set's values,
    # to every later call (jaxrw 40th session: 9,000-16,000 wrong results of 20,000)
    sets, x = _sets(3 if one_slot else 5), jnp.ones((2, 32))
    want = [np.asarray(jax.jit(f)(p, x)) for p in sets]
    opt = jaxrw.optimize(f, hoist_argnums=0, **({"max_hoist_bytes": 6000} if one_slot else {}))
    opt.report(sets[0], x)
    wrong = [0] * len(sets)

    def work(i):
        for _ in range(400):
            wrong[i] += not np.allclose(opt(sets[i], x), want[i], rtol=1e-4, atol=1e-4)

    _in_threads(work, len(sets))
    assert wrong == [0] * len(sets)
    for p, w in zip(sets, want, strict=True):  # and afterwards, from one thread
        np.testing.assert_allclose(opt(p, x), w, rtol=1e-4, atol=1e-4)


def test_threads_adding_signatures_while_parameters_change_raise_nothing(often_switching):
    # one thread passes new parameters on every call while another adds batch sizes (signatures
    # sharing one prologue): a slot shown to its group before it was whole raised AttributeError
    opt = jaxrw.optimize(f, hoist_argnums=0)
    base = _sets(1, d=16)[0]

    def work(i):
        for n in range(1, 40):
            p = jax.tree_util.tree_map(lambda a, n=n: a * (1 + n / 100), base) if i == 0 else base
            x = jnp.ones((1 if i == 0 else n, 16))
            np.testing.assert_allclose(opt(p, x), jax.jit(f)(p, x), rtol=1e-4, atol=1e-4)

    _in_threads(work, 2)


def _one_slot():
    """Two parameter sets, an input, jax.jit's results, and a function keeping one set's values."""
    sets, x = _sets(2), jnp.ones((2, 32))
    want = [np.asarray(jax.jit(f)(p, x)) for p in sets]
    return sets, x, want, jaxrw.optimize(f, hoist_argnums=0, max_hoist_bytes=6000)


def test_a_refill_while_the_quick_path_is_set_up_leaves_it_for_no_values(monkeypatch):
    # the race above replayed in one thread: another set's calls refill the one slot while the quick
    # path makes its identity checks for this set's call
    sets, x, want, opt = _one_slot()
    real, armed = hoist.HotPath._checks, [False]

    def checks_with_a_refill(self, args, kwargs):
        out = real(self, args, kwargs)
        if armed[0] and args[0] is sets[0]:
            armed[0] = False
            opt(sets[1], x), opt(sets[1], x)  # the slot now holds the other set's values
        return out

    monkeypatch.setattr(hoist.HotPath, "_checks", checks_with_a_refill)
    opt(sets[0], x), opt(sets[1], x), opt(sets[1], x)
    armed[0] = True
    opt(sets[0], x), opt(sets[0], x)
    monkeypatch.setattr(hoist.HotPath, "_checks", real)
    for _ in range(3):
        np.testing.assert_allclose(opt(sets[0], x), want[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(opt(sets[1], x), want[1], rtol=1e-4, atol=1e-4)


def test_a_refill_between_the_quickest_calls_check_and_its_read_is_not_served(monkeypatch):
    # another thread's refill landing inside the quickest call (HotPath.call_class), after it
    # checked the slot's token and before it read the values: the values read are checked again
    sets, x, want, opt = _one_slot()
    real, armed = hoist.HotPath._checks, [False]

    def checks_whose_lead_check_lets_a_refill_in(self, args, kwargs):
        usable, same_hoisted, same_lead, passed = real(self, args, kwargs)
        if same_lead is not None:
            inner = same_lead

            def same_lead(a):
                ok = inner(a)
                if armed[0]:
                    armed[0] = False
                    t = threading.Thread(target=lambda: (opt(sets[1], x), opt(sets[1], x)))
                    t.start()
                    t.join()
                return ok

        return usable, same_hoisted, same_lead, passed

    monkeypatch.setattr(hoist.HotPath, "_checks", checks_whose_lead_check_lets_a_refill_in)
    for _ in range(3):
        opt(sets[0], x)
    assert type(opt).__call__.__name__ == "hot_call"
    armed[0] = True
    np.testing.assert_allclose(opt(sets[0], x), want[0], rtol=1e-4, atol=1e-4)
    assert not armed[0]  # the refill did land inside the check


def test_a_build_waiting_on_another_threads_trace_does_not_hold_the_lock():
    # thread A traces a jax.jit J whose function calls the optimized g; thread B's first call of g
    # traces g, whose body calls J: B waits on A's trace of J, which waited on B's lock (a hang)
    sets = _sets(1)
    P0 = sets[0]

    def g_fn(p, x):
        return J(x) if x.ndim == 2 else x @ p["A"] @ p["B"]

    def h(x):
        time.sleep(0.5)  # A's trace of J is still running when B's build calls J
        return g(P0, x[None])[0]

    J = jax.jit(h)
    g = jaxrw.optimize(g_fn, hoist_argnums=0)
    x, done = jnp.ones((2, 32)), []
    a = threading.Thread(target=lambda: done.append(J(x)), daemon=True)
    b = threading.Thread(target=lambda: done.append(g(P0, x)), daemon=True)
    a.start()
    time.sleep(0.1)
    b.start()
    a.join(60)
    b.join(60)
    assert len(done) == 2, "deadlocked"
    np.testing.assert_allclose(done[0], done[1], rtol=1e-4, atol=1e-4)

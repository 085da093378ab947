"""jax.debug calls in the bodies of scan, while and cond (rewrite/effects.py): each made once per
step, with jax.jit's values and order, the loop never dropped nor merged by extraction, and the
non-finite guard kept for the body's outputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrw
from jaxrw.errors import UnsupportedProgramError
from jaxrw.rewrite.encode import encoded_equations
from jaxrw.rewrite.profiles import default_profile
from jaxrw.rewrite.run import rewrite_jaxpr
from tests.debug_calls import _calls, _loop, _record, _tap, _under_transforms

# a loop body's carries reach its next step, so under the default numerics only exact rules apply
# there (the non-finite guard: A @ A @ c is kept); "fast" lets the body be rewritten, which these
# tests need to see the calls through a rewritten body
FAST = "fast"


def _matrices(n=48, k=2, seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32)
    return A, jnp.asarray(rng.standard_normal((n, k)), jnp.float32)


def _same_calls(want, got, rtol=1e-4):
    assert len(got) == len(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("kind", ["scan", "while", "fori"])
def test_calls_in_a_loop_body_are_made_each_step_with_jax_jits_values(kind):
    A, v = _matrices()
    # verify=True: its reference is the program without its calls, in loop bodies too
    (want, want_log, _), (got, got_log, f) = _calls(
        lambda log: _loop(kind, log), A, v, strict=True, verify=True, numerics=FAST
    )
    A64, c = np.asarray(A, np.float64), np.asarray(v, np.float64)
    sums = []
    for _ in range(3):
        sums.append(c.sum())
        c = A64 @ A64 @ c
    np.testing.assert_allclose(got, c, rtol=1e-3, atol=1e-3 * np.abs(c).max())  # the float64 reference
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(c).max())
    _same_calls(want_log, got_log)
    np.testing.assert_allclose(got_log, sums, rtol=1e-3, atol=1e-3)
    report = jaxrw.optimize(f, strict=True, numerics=FAST).report(A, v)
    assert report.bodies and report.bodies[0].rewritten and not report.fallback
    assert report.n_outputs == 1  # the loop's hidden output is not the function's


def test_calls_in_nested_loops_and_conds_are_made_as_jax_jit_makes_them():
    def build(log):
        def f(A, v):
            def inner(c, _):
                return A @ A @ _tap(log, c, "inner"), None

            def outer(c, _):
                c = jax.lax.scan(inner, c, None, length=2)[0]
                return jax.lax.cond(c.sum() > 0, lambda x: 2 * _tap(log, x, "cond"), lambda x: -x, c), None

            return jax.lax.scan(outer, v, None, length=3)[0]

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True, verify=True, numerics=FAST)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert [k for k, _ in got_log] == [k for k, _ in want_log]  # one body's calls: in its order
    _same_calls([x for _, x in want_log], [x for _, x in got_log])
    assert jaxrw.optimize(f, strict=True, numerics=FAST).report(A, v).bodies[0].rewritten


def test_a_loop_whose_results_are_unused_and_its_twin_are_each_made():
    # an unused loop is what extraction drops, and two identical ones what an e-graph merges
    def build(log):
        loop = _loop("fori", log)
        return lambda A, v: (loop(A, v), loop(A, v), A @ A @ v)[-1]

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(got_log) == len(want_log) == 6
    _same_calls(want_log, got_log)
    result = rewrite_jaxpr(jax.make_jaxpr(f)(A, v), profile=default_profile("cpu"))
    assert result.fn is not None and [e.primitive.name for e in result.program.eqns] == ["scan", "scan"]


def test_calls_at_the_top_in_nested_jits_and_in_loops_together():
    def build(log):
        @jax.jit
        def inner(A, v):
            jax.debug.callback(lambda s: log.append(("jit", float(s))), v.sum())
            return _loop("scan", [])(A, v)  # its own log: counted below

        def f(A, v):
            jax.debug.callback(lambda s: log.append(("top", float(s))), (A @ A @ v).sum())
            return inner(A, v) @ jnp.ones((v.shape[1], 3))

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, _) = _calls(build, A, v, strict=True, verify=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert sorted(k for k, _ in got_log) == sorted(k for k, _ in want_log) == ["jit", "top"]
    _same_calls(sorted(x for _, x in want_log), sorted(x for _, x in got_log))


def test_ordered_calls_in_a_loop_and_after_it_keep_their_order():
    def build(log):
        def f(A, v):
            def body(c, _):
                for k in range(3):
                    jax.debug.callback(lambda s, k=k: log.append((k, float(s))), (k * c).sum(), ordered=True)
                return A @ A @ c, None

            c = jax.lax.scan(body, v, None, length=2)[0]
            jax.debug.callback(lambda s: log.append(("end", float(s))), c.sum(), ordered=True)
            return c

        return f

    A, v = _matrices()
    log, f = _record(build)
    opt = jaxrw.optimize(f, strict=True, numerics=FAST)
    for _ in range(3):
        opt(A, v)
    jax.effects_barrier()
    assert [k for k, _ in log] == [0, 1, 2, 0, 1, 2, "end"] * 3
    want_log, g = _record(build)
    jax.jit(g)(A, v)
    jax.effects_barrier()
    _same_calls([s for _, s in want_log], [s for _, s in log[:7]])
    assert opt.report(A, v).bodies[0].rewritten


def test_a_callback_that_raises_in_a_loop_raises_as_under_jax_jit_once():
    A, v = jnp.ones((16, 16)), -jnp.ones((16, 2))
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, strict=True, verify=True)):
        g = wrap(_loop("scan", calls := _Raising()))
        with pytest.raises(Exception, match="negative sum") as got:
            jax.block_until_ready(g(A, v))
        assert not isinstance(got.value, jaxrw.JaxrwError)
        jax.effects_barrier()
        assert len(calls) == 1  # the step's call raised: jax makes no more


class _Raising(list):
    """A log whose append raises on a negative value (a user's assertion in a loop)."""

    def append(self, x):
        super().append(x)
        if x < 0:
            raise ValueError("negative sum")


def test_gradients_and_vmap_of_loops_with_calls_call_as_jax_jit_does():
    def build(log):
        loop = _loop("scan", log)
        return lambda A, v: jnp.sum(jnp.tanh(loop(A, v)) ** 2)

    A, v = _matrices(16)
    for want, want_log, got, got_log in _under_transforms(build, A, v):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        _same_calls(np.sort(want_log), np.sort(got_log))


def test_hoisting_is_left_off_for_loops_with_calls():
    log, f = _record(lambda log: _loop("scan", log))
    A, v = _matrices()
    opt = jaxrw.optimize(f, hoist_argnums=(0,))
    with pytest.warns(UserWarning, match="not hoisted: the function makes jax.debug calls"):
        got = opt(A, v)
    got = opt(A, v)
    np.testing.assert_allclose(got, jax.jit(f)(A, v), rtol=1e-4, atol=1e-4)
    jax.effects_barrier()
    assert len(log) == 9  # two calls of opt, one of jax.jit's, three steps each


def test_a_rerun_with_exact_rules_makes_the_calls_once():
    # the non-finite guard rewrites the program again (run.py `again`): it is not split again
    def build(log):
        def f(a, b, c):
            loop = jax.lax.scan(lambda x, _: (_tap(log, x) + 1.0, None), c, None, length=2)[0]
            return (a @ b) @ c, jnp.tanh(a @ (b @ c)), loop

        return f

    a, b, c = jnp.ones((8, 8)).at[0, 0].set(jnp.inf), jnp.ones((8, 8)), jnp.ones((8, 3))
    force = jaxrw.Limits(min_gain=0)
    (want, want_log, _), (got, got_log, f) = _calls(build, a, b, c, strict=True, limits=force)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w))
    assert len(got_log) == len(want_log) == 2
    report = jaxrw.optimize(f, limits=force).report(a, b, c)
    assert "rewritten again without dot.assoc" in report.nonfinite_note


def test_a_checkpoint_with_calls_in_a_loop_body_keeps_that_body_as_written():
    def build(log):
        def f(A, v):
            def body(c, _):
                g = jax.checkpoint(lambda x: A @ _tap(log, x))
                return A @ A @ g(c), None

            return jax.lax.scan(body, v, None, length=2)[0] @ jnp.ones((v.shape[1], 4))

        return f

    A, v = _matrices()
    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True, verify=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    _same_calls(want_log, got_log)
    body = jaxrw.optimize(f, strict=True).report(A, v).bodies[0]
    assert not body.rewritten and body.stop_reason.value == "side effects"


def test_explain_numbers_equations_with_loops_that_make_calls():
    def f(A, B, v):
        jax.debug.print("bv {}", (B @ v).sum())
        c = jax.lax.scan(lambda c, _: (A @ B @ _tap([], c), None), v, None, length=2)[0]
        return 2.0 * (A @ B @ (B @ c))

    A, B = _matrices(64)[0], _matrices(64, seed=1)[0]
    ex = jaxrw.explain(f, A, B, jnp.ones((64, 2)))
    rows = [(e.index, e.primitive, e.status) for e in ex.equations]
    traced = jax.make_jaxpr(f)(A, B, jnp.ones((64, 2))).jaxpr
    assert [p for _, p, _ in rows] == [e.primitive.name for e in traced.eqns]
    assert rows[2] == (2, "debug_print", "kept") and rows[3] == (3, "scan", "kept")
    assert [i for i, _, _ in rows] == list(range(len(rows))) and ex.report["n_equations"] == len(rows)


def test_the_encoder_takes_loops_with_calls_only_as_outputs():
    from jaxrw.rewrite.effects import bound_once, loops_only, split_callbacks
    from jaxrw.rewrite.encode import encode
    from jaxrw.rewrite.graph import Node

    A, v = _matrices(8)
    closed = jax.make_jaxpr(lambda A, v: (_loop("scan")(A, v), A @ v)[1])(A, v)
    assert not loops_only(closed)  # its loop is no output: extraction would drop it
    with pytest.raises(UnsupportedProgramError):
        encode(closed)
    pure, calls = split_callbacks(closed)
    assert loops_only(pure) and not calls.eqns and len(pure.jaxpr.outvars) == 2
    program = encode(pure)
    assert [e.primitive.name for e in program.eqns] == ["scan"]
    node = lambda k, kids: Node(f"n{k}", "opaque", f"c{k}", kids, (0, k))  # noqa: E731
    assert bound_once(program, [node(0, ("a",)), node(1, ("a",))])
    assert not bound_once(program, [])  # dropped
    assert not bound_once(program, [node(0, ("a",)), node(1, ("b",))])  # bound twice


@pytest.mark.parametrize("kind", ["scan", "cond"])
def test_a_body_that_makes_calls_keeps_the_non_finite_guard(kind):
    # the body's outputs that reach tanh outside were not passed on with the calls taken out:
    # c@W + c@V was factored, inf*(1-2) = -inf where jax.jit gives nan (a review's repro)
    x = jnp.zeros((4, 4)).at[0, 0].set(jnp.inf)
    W, V = jnp.eye(4), -2 * jnp.eye(4)

    def f(x, W, V):
        def step(c):
            jax.debug.callback(lambda s: None, c.sum())
            return c @ W + c @ V

        if kind == "scan":
            y = jax.lax.scan(lambda c, _: (step(c), None), x, None, length=1)[0]
        else:
            y = jax.lax.cond(x[1, 1] == 0, step, lambda c: c, x)
        return jnp.tanh(y)

    want = jax.jit(f)(x, W, V)
    got = jaxrw.optimize(f, strict=True)(x, W, V)
    jax.effects_barrier()
    assert bool(jnp.isnan(want[0, 0])) and bool(jnp.isnan(got[0, 0]))
    np.testing.assert_array_equal(got, want)


# --- a cond with no output (one that only calls): made whole after the rewritten program -------


def _logging_every(k, log, ordered=False):
    """(A, v, i) -> A @ A @ v, calling back with the result's sum where i % k == 0 (a cond with no
    output: nothing in the program keeps it)."""

    def f(A, v, i):
        y = A @ A @ v  # rewritten as A @ (A @ v)

        def record(s, j):
            jax.debug.callback(lambda s, j: log.append((int(j), float(s))), s, j, ordered=ordered)

        jax.lax.cond(i % k == 0, record, lambda s, j: None, y.sum(), i)
        return y

    return f


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("numerics", ["default", FAST])
def test_a_cond_that_only_calls_keeps_the_rest_rewritten(ordered, numerics):
    A, v = _matrices(seed=1)
    outs = []
    for wrap in (jax.jit, lambda f: jaxrw.optimize(f, strict=True, verify=True, numerics=numerics)):
        log: list = []
        g = wrap(_logging_every(2, log, ordered))
        got = [g(A, v, jnp.int32(i)) for i in range(5)]
        jax.effects_barrier()
        outs.append((got, log, g))
    (want, want_log, _), (got, got_log, g) = outs
    A64, v64 = np.asarray(A, np.float64), np.asarray(v, np.float64)
    exact = A64 @ A64 @ v64  # the float64 reference
    for w, x in zip(want, got, strict=True):
        np.testing.assert_allclose(x, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
        np.testing.assert_allclose(x, w, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    assert [j for j, _ in got_log] == [j for j, _ in want_log] == [0, 2, 4]
    np.testing.assert_allclose([s for _, s in got_log], [exact.sum()] * 3, rtol=1e-4, atol=1e-4)
    report = g.report(A, v, jnp.int32(0))
    assert not report.fallback and report.n_outputs == 1
    # under "default" the chain stays as written: the call reads its sum (user code sees NaN/Inf
    # where jax.jit has them, nonfinite.py)
    assert report.rewritten == (numerics == FAST)


def test_a_cond_that_only_calls_in_a_loop_body_is_made_each_step():
    A, v = _matrices(seed=2)

    def build(log):
        def f(A, v):
            def step(c, i):
                c = A @ A @ c
                jax.lax.cond(i % 2 == 1, lambda s: _tap(log, s), lambda s: s, c.sum())  # output unused
                jax.lax.cond(i % 2 == 0, lambda s: jax.debug.callback(log.append, s), lambda s: None, i)
                return c, None

            return jax.lax.scan(step, v, jnp.arange(4))[0]

        return f

    (want, want_log, _), (got, got_log, f) = _calls(build, A, v, strict=True, numerics=FAST)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert len(got_log) == len(want_log) == 4
    np.testing.assert_allclose(np.asarray(got_log, np.float64), np.asarray(want_log, np.float64), rtol=1e-4)
    report = jaxrw.optimize(f, strict=True, numerics=FAST).report(A, v)
    assert report.bodies and report.bodies[0].rewritten and not report.fallback


def test_a_cond_that_only_calls_under_grad_and_vmap_calls_as_jax_jit_does():
    def build(log):
        def f(A, v):
            s = (A @ A @ v).sum()
            record = lambda x: jax.debug.callback(lambda y: log.append(float(y)), x)  # noqa: E731
            jax.lax.cond(s > 0, record, lambda x: None, s)
            return s**2

        return f

    A, v = _matrices(16, seed=3)
    for want, want_log, got, got_log in _under_transforms(build, A, v):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_log, want_log, rtol=1e-4)


def test_explain_keeps_the_cond_that_only_calls_in_its_place():
    log: list = []
    f = _logging_every(3, log)
    A, v = _matrices(64, seed=4)
    ex = jaxrw.explain(f, A, v, jnp.int32(0), numerics=FAST)
    rows = [(e.index, e.primitive, e.status) for e in ex.equations]
    traced = jax.make_jaxpr(f)(A, v, jnp.int32(0)).jaxpr  # i % 3 is a nested jit, inlined
    assert [p for _, p, _ in rows] == [e.primitive.name for e in encoded_equations(traced)]
    assert ("cond", "kept") in [(p, s) for _, p, s in rows]
    assert [i for i, _, _ in rows] == list(range(len(rows)))
    assert any(s == "rewritten" for _, _, s in rows)


def test_explain_shows_a_loop_kept_by_its_hidden_output_as_kept():
    # its result unused, the loop is bound once by its hidden output: explain said "removed"
    def f(A, v):
        _loop("while")(A, v)
        return A @ A @ v

    A, v = _matrices(64, seed=5)
    ex = jaxrw.explain(f, A, v, numerics=FAST)
    rows = [(e.primitive, e.status) for e in ex.equations]
    assert rows[0] == ("while", "kept") and ("dot_general", "rewritten") in rows


def test_explain_shows_a_bodys_calls_in_their_places():
    # a body was explained from its program without the calls: the table and jaxpr lacked them
    def f(A, v):
        def body(c, i):
            c = A @ A @ c
            jax.lax.cond(i % 2 == 0, lambda z: jax.debug.print("{}", z.sum()), lambda z: None, c)
            jax.debug.print("step {}", i)
            return c, None

        return jax.lax.scan(body, v, jnp.arange(4))[0]

    A, v = _matrices(64, seed=6)
    ex = jaxrw.explain(f, A, v, numerics=FAST)
    (body,) = ex.bodies
    rows = [(e.primitive, e.status) for e in body.equations]
    assert rows[-2:] == [("cond", "kept"), ("debug_print", "kept")]
    assert ("dot_general", "rewritten") in rows and "debug_print" in body.jaxpr_before
    assert [e.index for e in body.equations] == list(range(len(rows)))

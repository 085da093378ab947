"""explain(): reports on real programs (chains, factoring, the round-trip corpus, the benchmark
cases), their invariants (costs per region add up to the totals, every changed equation is in a
region, rule sites are real equations), JSON round trip, the HTML view, graph rendering (skipped
without graphviz's `dot`), and the JAXRW_LOG switch."""

from __future__ import annotations

import functools
import html
import json
import logging
import math
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrw
from jaxrw.explain_render import DOT_MISSING, dot_available
from tests.corpus import CORPUS

HERE = os.path.basename(__file__)


def _rand(seed, *shapes):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes)


def chain(A, B, C, v):
    return A @ B @ C @ v


def factoring(A, B, C):
    return A @ B + A @ C


def elementwise(x, y):
    return jnp.tanh(x) * y + 1.0


def check_invariants(ex: jaxrw.Explanation) -> None:
    """What every explanation of a traced program must satisfy."""
    rep = ex.report
    assert rep is not None
    assert len(ex.equations) == rep["n_equations"]
    assert [e.index for e in ex.equations] == list(range(len(ex.equations)))
    ub, ua = ex.unchanged_cost
    before = sum(r.cost_before for r in ex.regions) + ub
    after = sum(r.cost_after for r in ex.regions) + ua
    assert math.isclose(before, rep["cost_before"], rel_tol=1e-9, abs_tol=1e-15)
    # a kept program is mapped as written (not the candidate the guard turned down)
    extracted = ex.result.extraction.cost if ex.status == "rewritten" else rep["cost_before"]
    assert math.isclose(after, extracted, rel_tol=1e-9, abs_tol=1e-15)
    changed = {e.index for e in ex.equations if e.status in ("rewritten", "removed")}
    in_regions = {i for r in ex.regions for i in r.equations}
    assert changed == in_regions
    for e in ex.equations:
        assert e.status in ("kept", "rewritten", "removed", "shared", "unused")
        assert (e.region is not None) == (e.index in changed)
    for r in ex.rules:
        assert r.matches > 0 and r.name in jaxrw.rewrite.rules.RULES
        assert all(0 <= i < len(ex.equations) for i in r.sites or [])
    if ex.status == "rewritten" and rep["cost_after"] < rep["cost_before"]:
        assert ex.regions or ex.report.get("hoisted_bytes")
    text = " ".join(repr(ex).split())  # a long title (a body's) is wrapped at a space
    assert "jaxrw.explain" in text and " ".join(ex.name.split()) in text
    assert jaxrw.Explanation.from_json(ex.to_json()) == ex


def test_chain_rules_sites_and_sources():
    args = _rand(0, (64, 64), (64, 64), (64, 64), (64, 2))
    ex = jaxrw.explain(chain, *args)
    check_invariants(ex)
    assert ex.status == "rewritten" and ex.predicted_speedup > 2
    assert all(e.primitive == "dot_general" for e in ex.equations)
    assert all(e.source.startswith(f"{HERE}:") and "chain" in e.source for e in ex.equations)
    assert len(ex.regions) == 1 and ex.regions[0].before_ops == {"dot_general": 3}
    located = [r for r in ex.rules if r.sites]
    assert located and all(r.at_change for r in located)
    assert any(r.identity.startswith("(A") for r in located)  # an associativity rule matched
    # the optimized program contracts with the thin vector first: three matrix-vector products
    assert ex.jaxpr_after.count("dot_general") == 3 and "f32[64,64] = dot_general" not in ex.jaxpr_after


def test_factoring_region_names_its_rule():
    args = _rand(1, (64, 64), (64, 64), (64, 64))
    ex = jaxrw.explain(factoring, *args)
    check_invariants(ex)
    assert ex.status == "rewritten"
    (region,) = ex.regions
    assert region.before_ops == {"dot_general": 2, "add": 1}
    assert region.after_ops.get("dot") == 1 and region.cost_after < region.cost_before
    assert region.rules, "the factoring region should name a rule that matched there"
    assert all(r in {x.name for x in ex.rules} for r in region.rules)


def test_program_level_terms_of_a_gpu_profile_have_a_row_that_balances_the_totals():
    from jaxrw.rewrite.profiles import get_profile

    x = jnp.ones((512, 512))
    ex = jaxrw.explain(jaxrw.optimize(lambda a, b, c: a * b + a * c, profile=get_profile("h200")), x, x, x)
    rows = {r[1]: r for r in ex.region_rows()}
    # the fused kernel reads `a` once, the node costs twice: the passes' row takes one read off
    passes = ex.cost_before - ex.unchanged_cost[0] - sum(r.cost_before for r in ex.regions)
    assert passes == pytest.approx(-512 * 512 * 4 / get_profile("h200").bandwidth)
    assert rows["program-level"][4].startswith("-")
    # with the CPU profile the totals are the node costs: no such row
    cpu = jaxrw.explain(lambda a, b, c: a * b + a * c, x, x, x)
    assert "program-level" not in {r[1] for r in cpu.region_rows()}


def test_nothing_to_rewrite():
    ex = jaxrw.explain(elementwise, *_rand(2, (8, 8), (8, 8)))
    check_invariants(ex)
    assert ex.status == "kept" and not ex.regions
    assert not any(r.at_change for r in ex.rules)  # rules may match (commuting), none changes the result
    assert {e.status for e in ex.equations} == {"kept"}
    assert ex.jaxpr_after is None


def test_explain_names_the_leaves_of_container_arguments():
    # a parameter pytree read as a row of bare shapes (an NNX state of dozens of leaves)
    def f(params, x, *rest, scale=1.0):
        return (x @ params["w"][0] + params["b"]) * scale + rest[0]["c"]

    params = {"w": [jnp.ones((4, 4))], "b": jnp.ones(4)}
    ex = jaxrw.optimize(f).explain(params, jnp.ones((2, 4)), {"c": jnp.ones(4)}, scale=2.0)
    assert ex.signature == [
        *("params['b']=float32[4]", "params['w'][0]=float32[4,4]", "float32[2,4]"),
        *("args[2]['c']=float32[4]", "scale=float32[]"),
    ]
    assert "params['w'][0]=float32[4,4]" in str(ex)


def test_explain_names_a_wrapper_s_parameters():
    # functools.wraps: the wrapper's own order (x, params), not the wrapped function's
    def model(params, x):
        return x @ params["w"]

    @functools.wraps(model)
    def batch_first(x, params):
        return model(params, x)

    ex = jaxrw.explain(batch_first, jnp.ones((2, 4)), {"w": jnp.ones((4, 4))})
    assert ex.signature == ["float32[2,4]", "params['w']=float32[4,4]"]


def test_optimized_explain_measure_and_kwargs():
    f = jaxrw.optimize(lambda A, B, v, scale=1.0: (A @ B) @ v * scale)
    A, B, v = _rand(3, (64, 64), (64, 64), (64, 3))
    ex = f.explain(A, B, v, scale=2.0, measure=True, samples=3)
    check_invariants(ex)
    assert ex.signature[-1] == "scale=float32[]"  # keywords by name (their types were unlabelled)
    assert set(ex.measured) == {"jax.jit", "jaxrw"}
    assert all(m["median_s"] > 0 for m in ex.measured.values())
    assert ex.measured_speedup is not None and "measure" in ex.phases
    assert "measured" in repr(ex)
    assert f.traces == 0 and not f._cache  # explain works on a private copy


def test_options_pass_through():
    args = _rand(4, (64, 64), (64, 64), (64, 64), (64, 2))
    ex = jaxrw.explain(chain, *args, rules="dot.assoc_right", cost_model="flops", sites=False)
    check_invariants(ex)
    assert ex.options["cost_model"] == "flops" and ex.options["rules"] == "dot.assoc_right"
    assert {r.name for r in ex.rules} <= {"dot.assoc_right"}
    assert all(r.sites is None for r in ex.rules)


def test_fallback_is_reported():
    def effectful(x):
        return io_callback(lambda v: np.asarray(v), jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = jaxrw.explain(effectful, jnp.ones(3))
    assert ex.status == "fallback" and "effect" in ex.note
    assert ex.report is None and "fallback" in repr(ex)
    assert ex.signature == ["float32[3]"] and "mul" in ex.jaxpr_before
    assert jaxrw.Explanation.from_json(ex.to_json()) == ex


def test_json_and_html():
    args = _rand(5, (64, 64), (64, 64), (64, 64), (64, 2))
    ex = jaxrw.explain(chain, *args)
    data = json.loads(ex.to_json())
    assert data["status"] == "rewritten" and data["regions"][0]["equations"] == [0, 1, 2]
    assert "result" not in data
    page = ex._repr_html_()
    for needle in (
        "<table",
        "rules fired",
        "predicted cost per region",
        "jaxprs side by side",
        "dot_general",
    ):
        assert needle in page
    assert "<script" not in page


def test_graphs_build_without_dot():
    args = _rand(6, (32, 32), (32, 32), (32, 32), (32, 2))
    ex = jaxrw.explain(chain, *args, sites=False)
    before, after = ex.graph("before"), ex.graph("after")
    assert before.source.startswith("digraph") and after.source.startswith("digraph")
    assert before.source.count("#") >= 3  # equation numbers label the original's nodes
    kinds = {n["kind"] for n in ex.graphs["after"]["nodes"]}
    assert "new" in kinds and "input" in kinds
    with pytest.raises(ValueError, match="valid"):
        ex.graph("sideways")


def test_render_without_dot_says_so_once(monkeypatch, tmp_path, capsys, caplog):
    import jaxrw.explain_render as er

    monkeypatch.setattr(er.shutil, "which", lambda name: None)
    ex = jaxrw.explain(chain, *_rand(7, (16, 16), (16, 16), (16, 16), (16, 2)), sites=False)
    assert ex.render(tmp_path) == []
    out = capsys.readouterr()
    said = [r.getMessage() for r in caplog.records] + [out.out, out.err]
    assert sum(text.count("`dot` program was not found") for text in said) == 1  # it was said twice
    assert html.escape(DOT_MISSING) in ex._repr_html_()


@pytest.mark.skipif(not dot_available(), reason="graphviz's `dot` program is not installed")
@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_render_with_dot(tmp_path, fmt):
    ex = jaxrw.explain(chain, *_rand(8, (16, 16), (16, 16), (16, 16), (16, 2)), sites=False)
    paths = ex.render(tmp_path, format=fmt)
    assert [p.name for p in paths] == [f"chain_before.{fmt}", f"chain_after.{fmt}"]
    assert all(p.stat().st_size > 100 for p in paths)
    assert "<svg" in ex._repr_html_()


# The corpus programs that exercise distinct paths (the larger transformer variants repeat
# attention's and take most of the time).
CORPUS_CASES = [k for k in CORPUS if k not in ("gpt_block", "vmap_of_attention")]


@pytest.mark.parametrize("name", CORPUS_CASES)
def test_corpus(name):
    fn, args = CORPUS[name](np.random.default_rng(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = jaxrw.explain(fn, *args)
    if ex.status == "fallback":
        assert ex.note
        return
    check_invariants(ex)
    assert ex._repr_html_().count("<table") >= 2


def _bench_cases():
    try:
        from jaxrw.bench.case import select
    except ImportError:
        return []
    return [c for c in select("all") if c.suite in ("algebra", "merge") and not c.heavy]


@pytest.mark.parametrize("case", _bench_cases(), ids=lambda c: f"{c.suite}/{c.name}")
def test_bench_cases(case):
    inst = case.instance("small", "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = jaxrw.explain(inst.fn, *inst.args(0), **inst.opt_kwargs)
    assert ex.status in ("rewritten", "kept", "fallback")
    if ex.status != "fallback":
        check_invariants(ex)


def test_jaxrw_log_env_shows_phases():
    code = (
        "import jax.numpy as jnp, jaxrw\n"
        "f = jaxrw.optimize(lambda a, b, v: a @ b @ v)\n"
        "x = jnp.ones((256, 256)); f(x, x, x[:, :2])\n"
    )
    env = dict(os.environ, JAXRW_LOG="debug", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for phase in ("trace", "encode:", "rewrite:", "extract:", "decode:"):
        assert phase in out.stderr


def test_configure_logging_levels():
    logger = logging.getLogger("jaxrw")
    old_level, old_handlers = logger.level, list(logger.handlers)
    try:
        jaxrw.configure_logging("info")
        jaxrw.configure_logging("info")  # idempotent: one handler
        assert logger.level == logging.INFO
        assert sum(h.get_name() == "jaxrw-env" for h in logger.handlers) == 1
        jaxrw.configure_logging("loud")  # reported, not raised
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(old_level)
        logger.handlers[:] = old_handlers


def test_a_rewrite_inside_a_loop_body_is_explained_as_a_body():
    # a scan whose body alone was rewritten says so in the note, with the rules fired in it; the
    # body has an explanation of its own (the tables mapped the top level only): its rules, the
    # user's lines they matched, and its regions
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    w1, w2, w3 = (jax.random.normal(k[i], (16, 16)) for i in range(3))
    xs = jax.random.normal(k[3], (5, 4, 16))

    def f(w1, w2, w3, xs):
        def body(c, x):
            return c + jnp.tanh(x @ w1).sum() + jnp.tanh(x @ w2).sum(), jnp.tanh(x @ w3)

        c, ys = jax.lax.scan(body, 0.0, xs)
        return c + ys.sum()

    opt = jaxrw.optimize(f, profile="h200")
    report = opt.report(w1, w2, w3, xs)
    assert any(b.rewritten for b in report.bodies)
    ex = opt.explain(w1, w2, w3, xs)
    gain = report.bodies[0].predicted_speedup
    assert f"control-flow bodies rewritten, predicted {gain:.2f}x (" in ex.note and "merge." in ex.note
    assert "control-flow bodies rewritten" in str(ex)
    assert f"{report.cost_before * 1e6:.3g} µs -> " in str(ex)
    assert " outside the control-flow bodies" in str(ex)
    (body,) = ex.bodies  # (the H200 profile prices XLA's dot merger: a program-level row)
    assert body.where.startswith("scan body @ test_explain.py:") and body.name == f"{ex.name} / {body.where}"
    assert (
        body.status == "rewritten"
        and body.regions
        and body.signature == ["float32[16,16]"] * 3 + ["float32[]", "float32[4,16]"]
    )
    merged = [r for r in body.rules if r.name.startswith("merge.")]
    assert merged and all("test_explain.py" in body._where(i) for r in merged for i in r.sites)
    assert "scan body @" in str(ex) and f"jaxrw.explain — {html.escape(body.name)}" in ex._repr_html_()
    assert jaxrw.Explanation.from_json(ex.to_json()).bodies[0] == body


def test_bodies_nested_and_kept_are_explained_too():
    # a cond inside a fori_loop (a scan): the loop body's explanation holds the branches'; the
    # branch the guard kept is explained as kept
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    w1, w2, a = (jax.random.normal(k[i], s) for i, s in enumerate([(64, 64), (64, 64), (64, 4)]))

    def f(w1, w2, a):
        def step(i, h):
            return jax.lax.cond(i % 2 == 0, lambda h: (w1 @ w2) @ h, lambda h: h + 1.0, h)

        return jax.lax.fori_loop(0, 3, step, a)

    ex = jaxrw.explain(f, w1, w2, a, numerics="fast")  # (a loop's carry stays exact under "default")
    (loop,) = ex.bodies
    assert loop.where.startswith("scan body @")
    assert [b.where.split(" @")[0] for b in loop.bodies] == ["cond branch 0", "cond branch 1"]
    for b in (ex, loop, *loop.bodies):
        check_invariants(b)
    kept, chain = loop.bodies
    assert kept.status == "kept" and chain.status == "rewritten" and loop.status == ex.status == "rewritten"
    assert any(r.name == "dot.assoc_right" and r.sites for r in chain.rules) and chain.regions
    assert jaxrw.Explanation.from_json(ex.to_json()) == ex


def test_bodies_made_on_one_line_have_distinct_names():
    # three scans from one line (a loop over layers) were named alike: render() wrote one file
    ws = jnp.stack([jnp.eye(32) * 0.5] * 3)

    def f(ws, x):
        for i in range(3):
            x, _ = jax.lax.scan(lambda h, w: ((h @ w) @ w.T, None), x, ws[i : i + 1])
        return x

    ex = jaxrw.explain(f, ws, jnp.ones((64, 32)), numerics="fast", sites=False)
    names = [b.name for b in ex.bodies]
    assert len(names) == 3 and len(set(names)) == 3 and names[2].endswith(" #3")
    assert jaxrw.Explanation.from_json(ex.to_json()) == ex


def test_measure_leaves_donated_arguments_alive_and_times_the_fast_path():
    # measure=True timed the caller's arrays through donating functions: "Array has been
    # deleted", and the caller's `v` with it; and it timed the Python path of a private copy
    f = jaxrw.optimize(lambda A, B, v: (A @ B) @ v, donate_argnums=2)
    A, B, v = _rand(5, (64, 64), (64, 64), (64, 3))
    ex = f.explain(A, B, v, measure=True, samples=3)
    assert set(ex.measured) == {"jax.jit", "jaxrw"}
    np.testing.assert_allclose(np.asarray(v), np.asarray(_rand(5, (64, 64), (64, 64), (64, 3))[2]))


def test_text_is_shown_verbatim_not_as_markup():
    # rich read `[a:b]` in rule identities as markup (dropped), and `[/i]` in a note raised
    ex = jaxrw.explain(
        lambda a, x: jnp.concatenate([a @ x, a @ x], 0)[3:40][2:10], *_rand(6, (64, 64), (64, 2))
    )
    assert any("[" in r.identity for r in ex.rules)
    text = repr(ex)
    for r in ex.rules:
        assert r.identity.split()[0] in text, r.identity
    ex.note = "index [/i] out of range"
    assert "[/i]" in repr(ex)


def test_a_kept_program_is_explained_as_written():
    # the guard turned the rewrite down, but the table showed the candidate's regions and costs
    ex = jaxrw.explain(lambda a, b, x: a @ b @ x, *_rand(7, (16, 16), (16, 16), (16, 2)))
    assert ex.status == "kept" and "margin" in ex.note
    check_invariants(ex)
    assert not ex.regions and {e.status for e in ex.equations} == {"kept"}
    assert not any(r.at_change for r in ex.rules)


def test_programs_never_encoded_are_explained_without_a_warning(caplog):
    # a zero-size value keeps the program as written before encoding: explain logged a failed
    # equation mapping (an AttributeError) and appended it to the note
    with caplog.at_level(logging.WARNING, logger="jaxrw"):
        ex = jaxrw.explain(lambda a: a @ a.T, jnp.ones((0, 4)))
    assert ex.status == "kept" and "failed" not in ex.note
    assert not caplog.records


def test_notes_of_the_report_and_the_disable_switch_are_shown(monkeypatch):
    A, v = _rand(8, (64, 64), (64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said by the explanation, not again as a warning
        ex = jaxrw.explain(lambda a, b, x: a @ b @ x, A, A, v, hoist_argnums=(0, 1), max_hoist_bytes=100)
    assert "max_hoist_bytes 100" in repr(ex) and "hoisting" in repr(ex)
    monkeypatch.setenv("JAXRW_DISABLE", "1")
    ex = jaxrw.explain(chain, *_rand(9, (64, 64), (64, 64), (64, 64), (64, 2)))
    assert ex.note.startswith("JAXRW_DISABLE is set") and "JAXRW_DISABLE" in repr(ex)
    f = jaxrw.optimize(chain)
    args = _rand(9, (64, 64), (64, 64), (64, 64), (64, 2))
    f(*args)
    assert "JAXRW_DISABLE is set" in f.report(*args).schedule  # it said "rewritten" and nothing else


def test_sizes_and_speedups_are_printed_in_readable_units():
    from jaxrw.explain_render import fmt_bytes, speedup_text

    assert (fmt_bytes(512), fmt_bytes(1536), fmt_bytes(3 * 2**20)) == ("512 B", "1.50 KiB", "3.00 MiB")
    assert (speedup_text(2.0, 1.0), speedup_text(1.0, 0.0), speedup_text(0.0, 0.0)) == ("2.00x", "∞", "—")


def test_every_predicted_speedup_reads_a_free_program_alike():
    """A program predicted to cost nothing: a region said ∞ and the whole report 1.0 (no gain)."""
    from jaxrw.explain import Explanation, Region
    from jaxrw.rewrite.cost import speedup

    assert (speedup(2.0, 1.0), speedup(1.0, 0.0), speedup(0.0, 0.0)) == (2.0, math.inf, 1.0)
    region = Region(0, [0], ["r"], 1e-6, 0.0, {}, {}, [])
    ex = Explanation("f", [], {}, "rewritten", "", {"cost_before": 1e-6, "cost_after": 0.0}, {})
    assert region.predicted_speedup == ex.predicted_speedup == math.inf


def test_the_disable_switch_is_reported_as_the_first_call_read_it(monkeypatch):
    """JAXRW_DISABLE is read at the first call: set later, the calls still run the rewrite, so
    report() and explain() must not say they are jax.jit (they did: each read the variable anew)."""
    monkeypatch.delenv("JAXRW_DISABLE", raising=False)
    f = jaxrw.optimize(chain)
    args = _rand(9, (64, 64), (64, 64), (64, 64), (64, 2))
    f(*args)
    monkeypatch.setenv("JAXRW_DISABLE", "1")
    assert "JAXRW_DISABLE" not in f.report(*args).schedule
    ex = jaxrw.explain(f, *args)
    assert ex.status == "rewritten" and "JAXRW_DISABLE" not in repr(ex)
    g = jaxrw.optimize(chain)  # no call yet: the variable as it is now
    assert "JAXRW_DISABLE is set" in g.report(*args).schedule


@pytest.mark.parametrize("kind", ["eigh", "fori"])
def test_an_equation_whose_other_output_was_never_used_is_not_removed(kind):
    # eigh's vectors, a fori_loop's counter: unused as written, they marked a running equation
    # "removed" (a region "eigh×1 -> -", gain ∞; a new user's try)
    if kind == "eigh":
        fn, args = (lambda M: jnp.linalg.eigh(M)[0] * 2), (jnp.eye(8) * 2.0,)
    else:
        A, x = _rand(3, (64, 64), (64,))
        fn, args = (lambda A, x: jax.lax.fori_loop(0, 5, lambda i, y: y + 0.01 * (A @ (A @ y)), x)), (A, x)
    ex = jaxrw.explain(fn, *args)
    check_invariants(ex)
    assert "removed" not in {e.status for e in ex.equations}
    assert not ex.regions and "∞" not in str(ex)


def test_loop_invariant_work_of_a_body_is_not_called_kept_between_calls():
    # a body's A @ B moved before the loop was shown with hoist_argnums' words: "parameter-only
    # work kept between calls (four times that for 4 parameter sets in turn)" (a new user's try)
    def scanf(A, B, X):
        return jax.lax.scan(lambda c, _: (0.5 * (A @ B @ c) + 0.5 * c, None), X, None, length=10)[0]

    A, B, X = jnp.ones((256, 256)) / 256, jnp.eye(256), jnp.ones((256, 4))
    ex = jaxrw.explain(scanf, A, B, X)
    (body,) = ex.bodies
    assert body.report["hoisted_in_loop"] and body.report["hoisted_bytes"] == 256 * 256 * 4
    text = str(ex)
    assert "moved before the loop, once per call" in text
    assert "kept between calls" not in text and "parameter sets in turn" not in text
    assert "moved before the loop" in repr(jaxrw.optimize(scanf).report(A, B, X).bodies[0])
    # the hoisted work is priced as free, so its gain shows on the equations kept as written: that
    # row read "unchanged" beside the whole gain (a new user's audit)
    assert "unchanged, hoisted work free" in str(body)


def test_explain_of_a_signature_that_fell_back_does_not_warn_again():
    # each explain repeated "falling back to jax.jit" after the call's one warning (a new user's try)
    def logged(A, x):
        io_callback(lambda v: None, None, A @ A @ x)
        return A @ A @ x

    A, x = jnp.ones((8, 8)), jnp.ones(8)
    f = jaxrw.optimize(logged)
    with pytest.warns(UserWarning, match="falling back to jax.jit"):
        f(A, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ex = f.explain(A, x)
        ex_fresh = jaxrw.explain(logged, A, x)
    assert ex.status == ex_fresh.status == "fallback" and "effect" in ex.note

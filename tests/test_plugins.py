"""Plug-in registration (rules, cost models, extractors): what would fail at a later optimize is
refused when registered, with a message naming the value; a name of one's own may be registered
again (a notebook cell run twice)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxrw
from jaxrw.errors import InvalidOptionError
from jaxrw.rewrite.cost import COST_MODELS, FlopsBytes
from jaxrw.rewrite.extract import EXTRACTORS


def test_a_built_in_rule_name_is_refused_before_any_optimize():
    # registered first in a fresh process, it was taken; every later optimize then fell back with
    # "optimize stage failed: rule name 'dot.assoc_2d' is already registered"
    code = (
        "import jaxrw\n"
        "try:\n"
        "    jaxrw.register_rule(jaxrw.Rule('dot.assoc_2d', 'dot', 'mine', exact=True, build=lambda: []))\n"
        "except jaxrw.InvalidOptionError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "refused: rule name 'dot.assoc_2d' is already registered" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize(
    "rule, match",
    [
        (jaxrw.Rule("assoc_mine", "dot", "x", exact=True, build=lambda: []), r"'assoc_2d'|'dot'\.<name>"),
        (jaxrw.Rule("mine.one", "mine", "x", exact=True, build=[]), "build must be callable"),
        ("dot.mine", "takes a jaxrw.Rule"),
    ],
)
def test_a_malformed_rule_is_refused(rule, match):
    with pytest.raises(InvalidOptionError, match=match):
        jaxrw.register_rule(rule)


@pytest.mark.parametrize(
    "register, name, fn, match",
    [
        (jaxrw.register_extractor, "greedy", lambda view, costs: None, "built-in extractor"),
        (jaxrw.register_extractor, "mine", 5, "extractor 'mine' must be callable; got 5 of type int"),
        (jaxrw.register_cost_model, "roofline", FlopsBytes, "built-in cost model"),
        (jaxrw.register_cost_model, "", FlopsBytes, "non-empty string"),
        (jaxrw.register_cost_model, "mine", None, "cost model 'mine' must be callable"),
    ],
)
def test_a_plug_in_that_would_fail_later_is_refused(register, name, fn, match):
    before = (dict(COST_MODELS), dict(EXTRACTORS))
    with pytest.raises(InvalidOptionError, match=match):
        register(name, fn)
    assert (COST_MODELS, EXTRACTORS) == before  # nothing replaced


def test_a_name_of_ones_own_may_be_registered_again():
    try:
        jaxrw.register_cost_model("plugins-test", FlopsBytes)
        jaxrw.register_cost_model("plugins-test", FlopsBytes)
        assert COST_MODELS["plugins-test"] is FlopsBytes
    finally:
        COST_MODELS.pop("plugins-test", None)


def test_a_symbolic_shape_falls_back_with_a_one_line_warning():
    # jax's own error where a size was read was three paragraphs and a link, read as a crash
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import export

    (b,) = export.symbolic_shape("b")
    f = jaxrw.optimize(lambda A, v: A @ A @ v)
    args = jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8, b), jnp.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        exported = export.export(f)(*args)
    said = [str(w.message) for w in record if "jaxrw" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].endswith(
        ": argument 1 has a symbolic shape (8, b): only programs of concrete shapes are rewritten"
    )
    a, v = np.eye(8, dtype=np.float32), np.ones((8, 3), np.float32)
    np.testing.assert_allclose(exported.call(a, v), v)

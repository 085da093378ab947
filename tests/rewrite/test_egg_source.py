"""The encoder writes egglog text (egg_source.py): literals are formatted exactly, names outside a
safe alphabet are refused rather than spliced in, and the text builds the terms the Python API
would (same e-graph, read back through the serializer)."""

from __future__ import annotations

import pytest
from egglog import String, Vec, i64, set_

from jaxrw.errors import UnsupportedProgramError
from jaxrw.rewrite.egg_source import EggSource, Str, Sym, atom, ivec
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.terms import Out, Tensor, analysis, dtype, new_egraph, shape


@pytest.mark.parametrize(
    "value, text",
    [
        (3, "3"),
        (-1, "-1"),
        (1e-5, "1e-05"),
        (-0.0, "-0.0"),
        (2.0, "2.0"),
        (Str("float32"), '"float32"'),
        (Str("key<fry>"), '"key<fry>"'),
        (ivec([2, 3]), "(vec-of 2 3)"),
        (ivec([]), "(vec-of)"),
        (Sym("$jaxrw1"), "$jaxrw1"),
    ],
)
def test_atoms_are_written_exactly(value, text):
    assert atom(value) == text


@pytest.mark.parametrize("bad", ['a"b', "a\\b", "é", "tab\there"])
def test_names_outside_the_safe_alphabet_are_refused(bad):
    with pytest.raises(UnsupportedProgramError, match="printable ASCII"):
        atom(Str(bad))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, object()])
def test_values_without_an_egglog_literal_are_refused(bad):
    with pytest.raises((TypeError, ValueError)):
        atom(bad)


def _nodes(eg) -> tuple:
    eg.run(analysis.saturate())
    view = EGraphView.from_egraph(eg)
    by_class = {
        c: sorted((view.nodes[n].op, view.nodes[n].attrs) for n in ns) for c, ns in view.classes.items()
    }
    return {(n.op, n.attrs, tuple(tuple(by_class[ch]) for ch in n.children)) for n in view.nodes.values()}, (
        sorted(view.shapes.values()),
        sorted(view.dtypes.values()),
    )


def test_text_builds_the_same_egraph_as_the_python_api():
    via_api = new_egraph()
    x, w = Tensor.var(0), Tensor.var(1)
    y = Tensor.mul(x, w)
    via_api.register(
        set_(shape(x)).to(Vec[i64](i64(2), i64(3))),
        set_(dtype(x)).to(String("float32")),
        set_(shape(w)).to(Vec[i64](i64(2), i64(3))),
        set_(dtype(w)).to(String("float32")),
        Out.of(0, Tensor.unary("tanh", y)),
        Out.of(1, Tensor.opaque(0, 0, Vec[Tensor]())),
        set_(shape(Tensor.opaque(0, 0, Vec[Tensor]()))).to(Vec[i64]()),
        set_(dtype(Tensor.opaque(0, 0, Vec[Tensor]()))).to(String("int32")),
    )
    via_text = new_egraph()
    src = EggSource(via_text)
    xs, ws = src.call(Tensor.var, 0), src.call(Tensor.var, 1)
    for t, shp in ((xs, (2, 3)), (ws, (2, 3))):
        src.set(shape, t, to=ivec(shp))
        src.set(dtype, t, to=Str("float32"))
    ys = src.let("$jaxrw1", src.call(Tensor.mul, xs, ws))
    src.add(src.call(Out.of, 0, src.call(Tensor.unary, Str("tanh"), ys)))
    opaque = src.call(Tensor.opaque, 0, 0, ivec([]))
    src.add(src.call(Out.of, 1, opaque))
    src.set(shape, opaque, to=ivec([]))
    src.set(dtype, opaque, to=Str("int32"))
    src.flush()
    assert _nodes(via_text) == _nodes(via_api)

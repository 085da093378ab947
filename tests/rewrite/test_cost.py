"""The roofline model's pricing of transposes (a kernel of their own by default, folded into
whatever reads them with a profile whose `transpose_folded` is set, measured by `jaxrw calibrate`)
and of operands inside a fused elementwise kernel."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrw.rewrite.profiles import CPU, H200
from jaxrw.rewrite.run import rewrite_jaxpr

FOLDED = dataclasses.replace(H200, name="h200-folded", transpose_folded=True)
F32 = np.float32


def _cost(fn, shapes, profile):
    """The model's price of `fn` as written (before any rewrite)."""
    closed = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, F32) for s in shapes))
    return rewrite_jaxpr(closed, profile=profile).report.cost_before


def _dot_t(x, w):  # x @ w.T without a transpose: contract x's dim 1 with w's dim 1
    return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))


def test_a_transposed_gemm_operand_is_free_only_where_the_profile_says_it_folds():
    shapes = [(8, 4096), (32000, 4096)]  # llama4096's output projection, x @ emb.T
    written, contracted = (lambda x, w: x @ w.T), _dot_t
    assert _cost(written, shapes, FOLDED) == pytest.approx(_cost(contracted, shapes, FOLDED))
    # the built-in profile prices the transpose as a kernel that reads and writes the weights
    extra = _cost(written, shapes, H200) - _cost(contracted, shapes, H200)
    assert extra > 0.5 * 32000 * 4096 * 4 * 2 / H200.bandwidth


def test_folded_transposes_are_still_paid_where_returned_or_part_of_a_fusion():
    a = [(2048, 2048)]
    # returned: written out by a kernel of its own
    assert _cost(lambda x: x.T, a, FOLDED) > 0
    # read by an elementwise kernel: that kernel pays the read, as it does for the untransposed input
    assert _cost(lambda x: jnp.exp(x.T), a, FOLDED) == pytest.approx(_cost(jnp.exp, a, FOLDED))
    # a transpose of a fused computation stays in that fusion: priced as before
    ab = [(2048, 2048), (2048, 2048)]
    fused = lambda x, y: jnp.exp(x).T @ y  # noqa: E731
    assert _cost(fused, ab, FOLDED) == pytest.approx(_cost(fused, ab, H200))


def test_cyclic_transpose_classes_are_priced_without_recursing_forever():
    # x = transpose(transpose(x)) puts a class inside its own transpose's child class
    shapes = [(512, 512), (512, 512)]
    closed = jax.make_jaxpr(lambda a, b: (a.T.T @ b).T.T)(*(jax.ShapeDtypeStruct(s, F32) for s in shapes))
    res = rewrite_jaxpr(closed, profile=FOLDED)
    assert res.report.cost_after <= res.report.cost_before


def test_an_operand_named_twice_in_a_fused_op_is_read_once():
    a, ab = [(2048, 2048)], [(2048, 2048), (2048, 2048)]
    # x * x reads x once, as x**2 does; x * y reads two arrays
    same = _cost(lambda x: x * x, a, H200)
    assert same == pytest.approx(_cost(lambda x: x**2, a, H200))
    assert _cost(lambda x, y: x * y, ab, H200) - same == pytest.approx(2048 * 2048 * 4 / H200.bandwidth)


def test_an_operand_read_by_several_ops_of_one_fused_kernel_is_read_once():
    s = 2048 * 2048 * 4 / H200.bandwidth  # one operand's read
    three, four = [(2048, 2048)] * 3, [(2048, 2048)] * 4
    shared = _cost(lambda a, b, c: a * b + a * c, three, H200)
    assert _cost(lambda a, b, c, d: a * b + c * d, four, H200) - shared == pytest.approx(s)
    # ops in separate kernels (a reduction between them) each read it
    apart = _cost(lambda a, b: a * jnp.sum(a * b, axis=0), [(2048, 2048)] * 2, H200)
    fused = _cost(lambda a, b: a * (a * b), [(2048, 2048)] * 2, H200)
    assert apart > fused + s


def _contracting(lc, rc):
    return lambda a, b: jax.lax.dot_general(a, b, (((lc,), (rc,)), ((), ())))


def test_a_gemm_contracting_its_left_operand_over_a_leading_axis_copies_it_where_the_profile_says():
    # XLA:CPU runs Wᵀ@x taken as one product 1.1-7x slower than W@x: about a transposed copy of W
    # more (profiles.Profile.lhs_transposed_copied); cuBLAS reads either layout
    copying = dataclasses.replace(CPU, name="cpu-copying")
    plain = dataclasses.replace(CPU, name="cpu-plain", lhs_transposed_copied=False)
    assert copying.lhs_transposed_copied and not H200.lhs_transposed_copied
    w, x = (512, 512), (512, 16)
    copy = lambda shape: 2 * 4 * np.prod(shape) / CPU.bandwidth + CPU.launch_s  # noqa: E731
    nn = _cost(_contracting(1, 0), [w, x], copying)
    assert nn == pytest.approx(_cost(_contracting(1, 0), [w, x], plain))
    assert _cost(_contracting(0, 0), [w, x], copying) == pytest.approx(nn + copy(w))  # TN
    # TT: the right operand too; NT (x @ W.T taken as one product) copies nothing
    assert _cost(_contracting(0, 1), [w, x[::-1]], copying) == pytest.approx(nn + copy(w) + copy(x))
    assert _cost(_contracting(1, 1), [x[::-1], w], copying) == pytest.approx(
        _cost(_contracting(1, 0), [x[::-1], w], copying)
    )
    # without the flag (the H200's profile) no layout costs more
    assert _cost(_contracting(0, 0), [w, x], plain) == pytest.approx(nn)
    assert _cost(_contracting(0, 1), [w, x[::-1]], plain) == pytest.approx(nn)


def test_a_sign_sgd_step_is_not_rewritten_into_products_over_a_leading_axis_on_the_cpu():
    # grad of tanh(x @ (U @ V)) has transposes of products; removing them (dot.transpose_in/out) made
    # a 256x256 product contract over its leading axis on both sides, and the step ran 2x slower
    # than jax.jit on this CPU (fortieth session)
    def step(U, V, x):
        gU, gV = jax.grad(lambda U, V: jnp.sum(jnp.tanh(x @ (U @ V))), argnums=(0, 1))(U, V)
        return U - 0.1 * gU / (jnp.abs(gU) + 1e-8), V - 0.1 * gV / (jnp.abs(gV) + 1e-8)

    specs = [jax.ShapeDtypeStruct(s, F32) for s in [(256, 16), (16, 256), (8, 256)]]
    closed = jax.make_jaxpr(step)(*specs)
    res = rewrite_jaxpr(closed, profile=CPU)
    program = jax.make_jaxpr(res.fn)(*specs) if res.fn is not None else closed
    for eqn in program.jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, _rc), _batch = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            assert lc == (len(lhs) - 1,) or np.prod(lhs) < 256 * 256, (lhs, lc)  # small copies only

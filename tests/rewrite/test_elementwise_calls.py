"""custom_jvp/custom_vjp calls of elementwise bodies (jax.nn.relu): priced as fused elementwise ops,
bound as traced, their differentiation rules kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrw.rewrite.cost import Roofline
from jaxrw.rewrite.encode import ELEMENTWISE_CALL, encode
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.profiles import H200
from jaxrw.rewrite.run import rewrite_jaxpr
from jaxrw.rewrite.terms import analysis


@jax.custom_jvp
def straight_through_step(x):
    """A step function whose gradient is the identity (a straight-through estimator)."""
    return jnp.where(x > 0, 1.0, 0.0).astype(x.dtype)


straight_through_step.defjvps(lambda t, ans, x: t)


@jax.custom_jvp
def centred(x):
    """Not elementwise: subtracts the mean."""
    return x - jnp.mean(x)


centred.defjvps(lambda t, ans, x: t - jnp.mean(t))


def _ops(fn, *args):
    program = encode(jax.make_jaxpr(fn)(*args))
    program.egraph.run(analysis.saturate())
    view = EGraphView.from_egraph(program.egraph)
    return program, view, [n for n in view.nodes.values() if n.op in ("op", "opaque")]


def test_relu_and_logaddexp_are_elementwise_calls_and_a_reduction_body_is_not():
    x = jnp.ones((4, 8), jnp.float32)
    program, _view, nodes = _ops(lambda x: (jax.nn.relu(x), jnp.logaddexp(x, 2 * x), centred(x)), x)
    names = sorted(n.attrs[0] if n.op == "op" else "opaque" for n in nodes)
    assert names == [ELEMENTWISE_CALL, ELEMENTWISE_CALL, "opaque"], names
    assert len(program.eqns) == 1 and program.eqns[0].primitive.name == "custom_jvp_call"


def test_an_elementwise_call_is_priced_as_fused_not_as_a_kernel():
    # relu after a GEMM: XLA inlines the call and fuses it into the GEMM's epilogue; priced as a
    # kernel of its own it cost a launch and a read and write of the product
    x, w = jnp.ones((64, 256), jnp.float32), jnp.ones((256, 256), jnp.float32)
    _program, view, nodes = _ops(lambda x, w: jax.nn.relu(x @ w), x, w)
    (relu,) = nodes
    model = Roofline(H200)
    fused = model.node_cost(relu, view)
    as_kernel = H200.launch_s + 2 * 64 * 256 * 4 / H200.bandwidth
    assert 0 < fused < 0.5 * as_kernel


def _rewritten(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    res = rewrite_jaxpr(closed, profile=H200, force=True)
    assert res.fn is not None
    return lambda *xs: res.fn(*xs)[0]


def test_the_rebuilt_program_keeps_each_calls_gradient_rule():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((8, 8)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((4, 8)).astype(np.float32)).at[0].set(0.0)

    def f(x):  # relu at exactly 0 (its rule: gradient 0 there; max(x, 0)'s would be 0.5)
        return jax.nn.relu(x) @ w + straight_through_step(x @ w) * 2

    g = _rewritten(f, x)
    np.testing.assert_allclose(g(x), f(x), rtol=1e-6)
    grad_got = jax.grad(lambda x: g(x).sum())(x)
    grad_want = jax.grad(lambda x: f(x).sum())(x)
    np.testing.assert_allclose(grad_got, grad_want, rtol=1e-6)
    # the straight-through rule passes the tangent through where the step's derivative is 0
    assert float(jnp.abs(grad_want).sum()) > 0

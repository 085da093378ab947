"""The emulation of XLA's GPU dot merger in the guard's program cost (xla_passes.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrw.rewrite.cost import get_cost_model
from jaxrw.rewrite.encode import encode
from jaxrw.rewrite.extract import dag_cost, node_costs
from jaxrw.rewrite.graph import EGraphView
from jaxrw.rewrite.profiles import CPU, H200
from jaxrw.rewrite.run import _only_choice, rewrite_jaxpr
from jaxrw.rewrite.terms import analysis
from jaxrw.rewrite.xla_passes import _merged_cost, merged_dots, program_cost

F32 = np.float32


def _written(fn, *specs):
    """The program as written: its e-graph view, the only choice, node costs under H200."""
    closed = jax.make_jaxpr(fn)(*specs)
    egraph = encode(closed).egraph
    egraph.run(analysis.saturate())
    view = EGraphView.from_egraph(egraph)
    model = get_cost_model("roofline", H200)
    return view, _only_choice(view), node_costs(view, model), model


def _s(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


def test_small_dots_sharing_an_input_are_one_gemm_on_a_gpu():
    rng = np.random.default_rng(0)
    heads = [jnp.asarray(rng.standard_normal((1024, 64)), F32) for _ in range(16)]
    view, choice, costs, model = _written(lambda x: jnp.stack([x @ w for w in heads]), _s(16, 1024))
    groups = merged_dots(view, choice)
    assert len(groups) == 1 and len(groups[0].members) == 16 and groups[0].side == 0
    # sixteen launches become one: the program costs less than its kernels priced apart
    assert program_cost(view, choice, costs, model) < dag_cost(view, choice, costs) * 0.5
    # XLA's CPU pipeline has no dot merger, and neither has the device-independent model
    cpu = get_cost_model("roofline", CPU)
    cpu_costs = node_costs(view, cpu)
    assert program_cost(view, choice, cpu_costs, cpu) == dag_cost(view, choice, cpu_costs)
    flops = get_cost_model("flops", H200)
    assert program_cost(view, choice, node_costs(view, flops), flops) == dag_cost(
        view, choice, node_costs(view, flops)
    )


def test_matrix_vector_products_of_one_matrix_merge_unless_xla_reduces_them():
    def f(W, V):
        return jnp.stack([W @ V[i] for i in range(8)])

    view, choice, _, _ = _written(f, _s(4096, 4096), _s(8, 4096))
    (group,) = merged_dots(view, choice)
    assert len(group.members) == 8
    # below 10M elements XLA turns each product into a multiply and a reduction: no dots to merge
    view, choice, _, _ = _written(f, _s(2048, 2048), _s(8, 2048))
    assert merged_dots(view, choice) == []


def test_a_large_dot_stays_apart():
    # x@W with a 64 MiB W and x@A: measured on the H200, XLA keeps them apart (a LoRA update)
    specs = (_s(64, 4096), _s(4096, 4096), _s(4096, 16))
    view, choice, costs, model = _written(lambda x, W, A: (x @ W, x @ A), *specs)
    assert merged_dots(view, choice) == []
    assert program_cost(view, choice, costs, model) == dag_cost(view, choice, costs)
    # and so do small ones whose other operands differ in shape (x@W, x@A with W 1024²)
    view, choice, _, _ = _written(lambda x, W, A: (x @ W, x @ A), _s(64, 1024), _s(1024, 1024), _s(1024, 16))
    assert merged_dots(view, choice) == []


def test_a_dot_that_reads_another_is_not_merged_with_it():
    def f(x, W):
        a = x @ W  # (n, n)
        return a, x @ a  # shares x, but needs a first

    view, choice, _, _ = _written(f, _s(256, 256), _s(256, 256))
    assert merged_dots(view, choice) == []


def test_arguments_pay_the_concatenation_constants_do_not():
    rng = np.random.default_rng(1)
    ws = [jnp.asarray(rng.standard_normal((1024, 1024)), F32) for _ in range(3)]
    const = _written(lambda x: tuple(x @ w for w in ws), _s(8, 1024))
    args = _written(lambda x, a, b, c: (x @ a, x @ b, x @ c), _s(8, 1024), *[_s(1024, 1024)] * 3)
    for view, choice, _, _ in (const, args):
        assert len(merged_dots(view, choice)) == 1
    cost_const, cost_args = (program_cost(*w) for w in (const, args))
    # three 4 MiB weights copied per call: 24 MiB at the H200's bandwidth and one more launch
    extra = 2 * 3 * 1024 * 1024 * 4 / H200.bandwidth + H200.launch_s
    assert np.isclose(cost_args - cost_const, extra, rtol=1e-6)


def test_the_guard_keeps_a_merge_xla_already_does():
    # per_head_proj: jaxrw's merge of the head projections is what XLA's dot merger does anyway
    # (measured on the H200: 0.91-0.98x when jaxrw merged them), so the guard keeps the program
    rng = np.random.default_rng(2)
    heads = [jnp.asarray(rng.standard_normal((4096, 128)), F32) for _ in range(32)]
    closed = jax.make_jaxpr(lambda x: jnp.stack([x @ w for w in heads]))(_s(16, 4096))
    res = rewrite_jaxpr(closed, profile=H200)
    assert not res.report.rewritten, res.report.guard_note
    assert "predicted gain" in res.report.guard_note


def test_a_group_stops_growing_past_the_size_limit():
    # three 32 MiB bf16 weights: XLA merged two and left the third apart (H200 probe)
    bf = jnp.bfloat16
    specs = [jax.ShapeDtypeStruct((8, 4096), bf), *[jax.ShapeDtypeStruct((4096, 4096), bf)] * 3]
    view, choice, _, _ = _written(lambda x, a, b, c: (x @ a, x @ b, x @ c), *specs)
    (group,) = merged_dots(view, choice)
    assert len(group.members) == 2


def test_a_large_shared_operand_does_not_count():
    # W@v1, W@v2 with a 64 MiB W merged on the H200: only the vectors are concatenated
    view, choice, _, _ = _written(lambda W, u, v: (W @ u, W @ v), _s(4096, 4096), _s(4096), _s(4096))
    (group,) = merged_dots(view, choice)
    assert group.side == 0 and len(group.members) == 2


def test_slices_of_one_array_are_read_in_place_and_groups_split_at_the_limit():
    # W[i]@v for 4 blocks of 40 MiB: two merged GEMMs of 2 blocks each (the 64 MiB limit); the
    # blocks are slices of one argument, so no per-call concatenation is paid
    def f(W, v):
        return jnp.stack([W[i] @ v for i in range(4)])

    view, choice, costs, model = _written(f, _s(4, 2560, 4096), _s(4096))
    groups = merged_dots(view, choice)
    assert [len(g.members) for g in groups] == [2, 2] and all(g.side == 1 for g in groups)
    gemms = sum(costs[choice[d]] for g in groups for d in g.members)
    merged = sum(_merged_cost(model, view, choice, g) for g in groups)
    block = 2560 * 4096 * 4
    assert merged < gemms and merged < 2 * (2 * 2 * block / H200.bandwidth)  # no copy of W

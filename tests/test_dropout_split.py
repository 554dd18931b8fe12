"""Host dropout split into a random mask and a deterministic product
(fxckpt/passes/dropout.py): the halves are native_dropout bitwise, forward
still runs native_dropout, and a recomputed dropout output reads the saved
mask instead of keeping a generator state."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.bench.ways import Step
from torch.utils.checkpoint import CheckpointPolicy as P
from fxckpt.passes.dropout import (APPLY_DROPOUT_MASK, DROPOUT_MASK, joined_host_dropouts,
                                   split_host_dropouts)

try:
    from tests.harness import assert_bitwise_equal, run_step
    from tests.opcount import OpCounter
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step
    from opcount import OpCounter

aten = torch.ops.aten
pytestmark = [pytest.mark.usefixtures("reset_dynamo"), pytest.mark.releases]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_the_halves_draw_and_compute_what_native_dropout_does(dtype, layout, p):
    x = torch.randn(24, 40).to(dtype)
    x[0, :3] = torch.tensor([float("inf"), float("-inf"), -0.0]).to(dtype)
    if layout == "transposed":
        x = x.t()
    torch.manual_seed(7)
    out, mask = aten.native_dropout(x, p, True)
    after = torch.get_rng_state()
    torch.manual_seed(7)
    made_mask = DROPOUT_MASK(x, p)
    assert torch.equal(torch.get_rng_state(), after)      # the same draw
    made = APPLY_DROPOUT_MASK(x, made_mask, 0.0 if p == 1 else 1 / (1 - p))
    assert made_mask.dtype == mask.dtype and made_mask.stride() == mask.stride()
    assert torch.equal(made_mask, mask)
    assert made.stride() == out.stride() and torch.equal(_bits(made), _bits(out))


class Deep(nn.Module):
    """Linear, ReLU, sine, dropout, four times: activations dominate."""

    def __init__(self, n=4, p=0.25):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(64, 64) for _ in range(n))
        self.p = p

    def forward(self, x):
        for fc in self.fcs:
            x = F.dropout(torch.relu(fc(x)).sin(), self.p, self.training)
        return x.tanh()


def _deep():
    torch.manual_seed(0)
    return Deep().train(), (torch.randn(256, 64),), lambda y: y.square().sum()


def _joint(model, inputs, loss_fn):
    """The joint graph fxckpt plans, as its partitioner receives it."""
    seen = []

    class Keep(fxckpt.planning.pipeline.Planner):
        def __call__(self, joint, joint_inputs, **kwargs):
            seen.append(joint)
            return super().__call__(joint, joint_inputs, **kwargs)

    from fxckpt.options import Options
    from fxckpt.planning.capture import capture_once, compile_planned
    planner = Keep(Options.create(compiler="eager"))
    capture_once(lambda *a: loss_fn(model(*a)), inputs,
                 lambda gm, example: compile_planned(gm, example, planner), dynamic=False)
    return seen[0]


def test_the_split_leaves_its_input_alone_and_names_the_halves():
    joint = _joint(*_deep())
    before = [(n.name, n.target) for n in joint.graph.nodes]
    split = split_host_dropouts(joint)
    assert [(n.name, n.target) for n in joint.graph.nodes] == before
    targets = [n.target for n in split.graph.nodes]
    assert aten.native_dropout.default not in targets
    assert targets.count(DROPOUT_MASK) == 4 and targets.count(APPLY_DROPOUT_MASK) == 4
    # backward reads the mask nodes themselves
    for mask in (n for n in split.graph.nodes if n.target is DROPOUT_MASK):
        assert any(u.target is aten.native_dropout_backward.default for u in mask.users)
    assert split_host_dropouts(split) is split     # nothing left to split


def test_policies_are_asked_about_native_dropout_and_both_halves_follow():
    asked = []

    def policy(ctx, op, *args, **kwargs):
        asked.append(op)
        if op is aten.native_dropout.default:
            return P.MUST_RECOMPUTE
        return P.PREFER_SAVE

    model, inputs, loss_fn = _deep()
    be = fxckpt.backend(compiler="eager", policy=policy)
    run_step(torch.compile(model, backend=be), inputs, loss_fn)
    assert aten.native_dropout.default in asked
    assert DROPOUT_MASK not in asked and APPLY_DROPOUT_MASK not in asked
    recomputed = {e.op for e in be.plans[0].entries if e.action == "recomputed"}
    assert {"fxckpt.dropout_mask.default", "fxckpt.apply_dropout_mask.default"} <= recomputed


def _counted(model, inputs, loss_fn, **options):
    be = fxckpt.backend(compiler="eager", **options)
    compiled = torch.compile(model, backend=be)
    loss_fn(compiled(*inputs)).backward()
    with OpCounter() as counter:
        counter.phase("forward")
        loss = loss_fn(compiled(*inputs))
        counter.phase("backward")
        loss.backward()
    return counter, be.plans[0]


def test_a_recomputed_output_reads_the_saved_mask_and_keeps_no_state():
    """Under a budget, the dropouts' outputs are recomputed from their saved
    masks (which backward reads anyway): only the product runs again in
    backward, no generator state is saved and nothing is drawn again.
    Forward runs native_dropout, as eager does; loss and gradients are
    eager's."""
    model, inputs, loss_fn = _deep()
    eager = run_step(model, inputs, loss_fn, seed=3)
    model, inputs, loss_fn = _deep()
    be = fxckpt.backend(compiler="eager", budget=600_000)
    compiled = torch.compile(model, backend=be)
    assert_bitwise_equal(run_step(compiled, inputs, loss_fn, seed=3), eager)
    # The whole step (loss in the graph) measures its predicted peak, within
    # the budget.
    torch._dynamo.reset()
    model, inputs, loss_fn = _deep()
    be = fxckpt.backend(compiler="eager", budget=600_000)
    step = torch.compile(Step(model, loss_fn), backend=be)
    step(*inputs).backward()                       # compile, allocate .grad once
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: step(*inputs).backward())
    assert measured == be.plans[0].peak_bytes <= 600_000
    counter, plan = _counted(*_deep(), budget=600_000)
    recomputed = {e.op for e in plan.entries if e.action == "recomputed"}
    assert "fxckpt.apply_dropout_mask.default" in recomputed
    assert "fxckpt.dropout_mask.default" not in recomputed
    assert not any(e.op == "rng_state" or "rng_state" in e.name for e in plan.entries
                   if e.action == "saved")
    recomputed_outputs = sum(e.op == "fxckpt.apply_dropout_mask.default" for e in plan.entries
                             if e.action == "recomputed")
    assert recomputed_outputs >= 1
    assert counter.counts["forward"][aten.native_dropout] == 4
    assert counter.counts["backward"][torch.ops.fxckpt.apply_dropout_mask] == recomputed_outputs
    assert counter.counts["backward"][torch.ops.fxckpt.dropout_mask] == 0
    assert counter.counts["backward"][aten.native_dropout] == 0


def test_a_recomputed_mask_replays_its_draw_from_a_saved_state():
    """Where the mask is recomputed too (recompute_all), forward runs
    native_dropout saving the generator state, and backward replays the
    mask alone from it: gradients stay eager's."""
    model, inputs, loss_fn = _deep()
    eager = run_step(model, inputs, loss_fn, seed=5)
    model, inputs, loss_fn = _deep()
    be = fxckpt.backend(compiler="eager", solver="recompute_all")
    compiled = torch.compile(model, backend=be)
    assert_bitwise_equal(run_step(compiled, inputs, loss_fn, seed=5), eager)
    plan = be.plans[0]
    recomputed = {e.op for e in plan.entries if e.action == "recomputed"}
    assert {"fxckpt.dropout_mask.default", "fxckpt.apply_dropout_mask.default"} <= recomputed
    counter, _ = _counted(*_deep(), solver="recompute_all")
    assert counter.counts["forward"][aten.native_dropout] == 4
    assert counter.counts["backward"][torch.ops.fxckpt.dropout_mask] == 4
    assert counter.counts["backward"][aten.native_dropout] == 0


def test_joining_gives_back_native_dropout_in_forward_only():
    joint = split_host_dropouts(_joint(*_deep()))
    graph = joint.graph
    x = next(n for n in graph.nodes if n.target is DROPOUT_MASK).args[0]
    forward = torch.fx.GraphModule(joint, graph)
    joined = joined_host_dropouts(forward)
    targets = [n.target for n in joined.graph.nodes]
    assert targets.count(aten.native_dropout.default) == 4
    assert DROPOUT_MASK not in targets and APPLY_DROPOUT_MASK not in targets
    assert [n.target for n in forward.graph.nodes].count(DROPOUT_MASK) == 4   # untouched
    assert x.name in {n.name for n in joined.graph.nodes}
    getitems = [n for n in joined.graph.nodes if n.target is operator.getitem
                and n.args[0].target is aten.native_dropout.default]
    assert sorted(n.args[1] for n in getitems) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert run_and_save_rng_state not in targets and run_with_rng_state not in targets


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_preparing_the_joint_graph_leaves_it_alone(compiler):
    """The planner's own copy is split in place (pipeline.prepared_joint);
    the graph AOTAutograd gave it never is."""
    from fxckpt.planning.pipeline import prepared_joint
    joint = _joint(*_deep())
    before = [(n.name, n.target, n.args) for n in joint.graph.nodes]
    prepared = prepared_joint(joint, compiler)
    assert [(n.name, n.target, n.args) for n in joint.graph.nodes] == before
    targets = [n.target for n in prepared.graph.nodes]
    assert targets.count(DROPOUT_MASK) == (0 if compiler == "inductor" else 4)

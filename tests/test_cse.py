"""The joint graph's common-subexpression elimination (fxckpt/passes/cse.py)
merges exactly what torch's partitioner merges, and leaves its input as it
was."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from fxckpt.bench.solvers import capture_joint
from fxckpt.bench.ways import Step
from fxckpt.passes.cse import deduplicated, merged_graph
from zoo import ZOO

pytestmark = pytest.mark.releases


def _shape(graph: fx.Graph) -> list[tuple]:
    """Each node's name, op, target and the names of its arguments."""
    return [(n.name, n.op, str(n.target), str(n.args), str(n.kwargs)) for n in graph.nodes]


def _torch_cse(graph: fx.Graph) -> fx.Graph:
    from torch._functorch.compile_utils import fx_graph_cse

    return fx_graph_cse(copy.deepcopy(graph))


# Buffers mutated in place (cnn_bn, resnet_inplace), a user checkpoint, a
# GPT and an HF model (their causal masks and rotary tables repeat per layer).
@pytest.mark.parametrize("name", ["cnn_bn", "resnet_inplace", "user_checkpoint", "gpt",
                                  "hf_llama"])
def test_merges_what_torch_merges_on_the_zoo(name):
    if ZOO[name].needs:
        pytest.importorskip(ZOO[name].needs)
    model, inputs, loss_fn = ZOO[name].make()
    joint = capture_joint(Step(model, loss_fn), inputs)[0]
    before = _shape(joint.graph)
    metas = [dict(n.meta) for n in joint.graph.nodes]
    ours = merged_graph(joint.graph)
    assert _shape(ours) == _shape(_torch_cse(joint.graph))
    # The input graph is untouched, metadata included.
    assert _shape(joint.graph) == before
    assert [n.meta.keys() == m.keys() for n, m in zip(joint.graph.nodes, metas)] == \
        [True] * len(metas)


class _Repeats(torch.nn.Module):
    """Repeats that merge (a mask built twice), repeats that must not (two
    dropouts, reads on either side of an in-place update, returned values)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        a = torch.triu(torch.ones(4, 4), 1) * x
        b = torch.triu(torch.ones(4, 4), 1) * x
        d1 = torch.nn.functional.dropout(x, 0.5)
        d2 = torch.nn.functional.dropout(x, 0.5)
        before = self.count * 2
        self.count.add_(1)
        after = self.count * 2
        return (a + b + d1 + d2 + before + after).sum()


def test_keeps_random_ops_mutation_regions_and_what_it_returns_apart():
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    joint = capture_joint(Step(_Repeats(), lambda out: out), (x,))[0]
    ours = merged_graph(joint.graph)
    assert _shape(ours) == _shape(_torch_cse(joint.graph))
    merged = len(joint.graph.nodes) - len(ours.nodes)
    assert merged > 0
    targets = [n.target for n in ours.nodes]
    assert sum(t == torch.ops.aten.native_dropout.default for t in targets) == 2
    assert sum(t == torch.ops.aten.triu.default for t in targets) == 1
    # A graph with nothing to merge comes back as it was given.
    again = fx.GraphModule(joint, ours)
    assert deduplicated(again) is again


def _hash_alike(x):
    index = torch.arange(4)
    up, down = index.unsqueeze(-2), index.unsqueeze(-1)      # hash(-1) == hash(-2)
    up_again, down_again = index.unsqueeze(-2), index.unsqueeze(-1)
    one, one_again = torch.full((), 1.0), torch.full((), 1.0)
    return x + (up - down) + (up_again - down_again) + one + one_again


def test_looks_nodes_up_as_torch_does_hash_alike_arguments():
    """Arguments that hash alike but differ (-1, -2) keep the later node and
    its repeats, as torch's lookup by hash does; equal floats merge."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(_hash_alike)(torch.zeros(4, 4)).graph
    ours = merged_graph(graph)
    assert _shape(ours) == _shape(_torch_cse(graph))
    targets = [n.target for n in ours.nodes]
    assert targets.count(torch.ops.aten.unsqueeze.default) == 3
    assert targets.count(torch.ops.aten.full.default) == 1


def _signed_zeros(x):
    zero, negative_zero = torch.full((), 0.0), torch.full((), -0.0)
    return x + 1 / zero + 1 / negative_zero


def test_keeps_signed_zeros_apart():
    """0.0 and -0.0 are different arguments (1 / 0.0 is inf, 1 / -0.0 is
    -inf): kept apart, so the merged graph computes inf - inf (nan) as
    eager does, not inf + inf."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.zeros(2)
    gm = make_fx(_signed_zeros)(x)
    fulls = [n.args[1] for n in merged_graph(gm.graph).nodes
             if n.target == torch.ops.aten.full.default]
    assert sorted(map(str, fulls)) == ["-0.0", "0.0"]
    assert torch.isnan(_signed_zeros(x)).all()
    assert torch.isnan(fx.GraphModule(gm, merged_graph(gm.graph))(x)).all()

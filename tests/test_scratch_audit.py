"""fxckpt bench --suite scratch (fxckpt/bench/scratch.py): each planned op run
alone, its measured scratch against memory.workspace_bytes."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.bench.scratch import _measured_scratch, audit, planned_graphs
from fxckpt.bench.zoo import make_bench_model
from fxckpt.memory.scratch import workspace_bytes


def test_no_planned_op_of_the_gpt_holds_more_scratch_than_modeled():
    """The built-in GPT's floor and default plans on the CPU, one thread:
    every ATen op's measured scratch is within the model's (256 B)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, inputs, loss_fn = make_bench_model("gpt", size="tiny")
        graphs = []
        for budget in (0.0, None):
            graphs += planned_graphs(model, inputs, loss_fn, budget)
        assert sum(1 for g in graphs for n in g.nodes if n.op == "call_function") > 100
        assert audit(graphs) == []
    finally:
        torch.set_num_threads(threads)


def _cumsum_node(dtype):
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.zeros(2, 256, dtype=dtype)
    node = graph.call_function(torch.ops.aten.cumsum.default, (x, -1))
    node.meta["val"] = torch.zeros(2, 256, dtype=torch.int64)
    return node


def test_measured_scratch_sees_a_dtype_conversion():
    """A bool mask summed into int64 is first converted: 2 x 256 x 8 bytes
    measured, and modeled; an int64 input needs no copy."""
    node = _cumsum_node(torch.bool)
    assert _measured_scratch(node, torch.device("cpu")) == 4096
    assert workspace_bytes(node) == 4096
    node = _cumsum_node(torch.int64)
    assert _measured_scratch(node, torch.device("cpu")) == 0
    assert workspace_bytes(node) == 0


def test_layer_norm_backward_buffers_follow_the_threads():
    """Layer norm's CPU backward holds a float row of each parameter gradient
    per thread: measured and modeled at one and two threads."""
    graph = fx.Graph()
    vals = dict(g=torch.zeros(512, 64), x=torch.zeros(512, 64), mean=torch.zeros(512, 1),
                rstd=torch.ones(512, 1), w=torch.ones(64), b=torch.zeros(64))
    nodes = {}
    for name, value in vals.items():
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = value
    node = graph.call_function(torch.ops.aten.native_layer_norm_backward.default,
                               (nodes["g"], nodes["x"], [64], nodes["mean"], nodes["rstd"],
                                nodes["w"], nodes["b"], [True, True, True]))
    node.meta["val"] = (vals["x"], vals["w"], vals["b"])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            assert workspace_bytes(node) == count * 2 * 64 * 4
            assert _measured_scratch(node, torch.device("cpu")) == count * 2 * 64 * 4
    finally:
        torch.set_num_threads(threads)

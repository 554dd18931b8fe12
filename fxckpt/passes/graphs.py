"""Small graph utilities shared by passes."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.compat.aot import graph_with_codegen_of, lazy_graph_module
from fxckpt.compat.ops import detect_fake_mode


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy whose graph can be edited without touching ``gm``'s. Node meta
    dicts are copied shallowly (fake tensors are shared, never mutated)."""
    graph = graph_with_codegen_of(gm)
    value_map: dict[fx.Node, fx.Node] = {}
    result, output = graph.graph_copy(gm.graph, value_map, return_output_node=True)
    graph.output(result).meta = dict(output.meta)
    return lazy_graph_module(gm, graph)


def fake_mode_of(graph: fx.Graph):
    """The FakeTensorMode the graph's ``meta["val"]`` tensors belong to."""
    return detect_fake_mode([n.meta["val"] for n in graph.nodes
                             if isinstance(n.meta.get("val"), torch.Tensor)])

"""Small graph utilities shared by passes."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy whose graph can be edited without touching ``gm``'s. Node meta
    dicts are copied shallowly (fake tensors are shared, never mutated)."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen  # input/output structure: shared, never edited
    value_map: dict[fx.Node, fx.Node] = {}
    result, output = graph.graph_copy(gm.graph, value_map, return_output_node=True)
    graph.output(result).meta = dict(output.meta)
    return lazy_graph_module(gm, graph)


def lazy_graph_module(root: fx.GraphModule, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule whose Python code is generated when first called or
    read (a lazy module, as AOTAutograd's own partitioner makes): graphs
    only the memory model reads (the frontier's candidates, the backward
    order not chosen) never pay for it (half a second on a 10,000-node
    graph)."""
    with _use_lazy_graph_module(True):
        return _make_graph_module(root, graph)


def fake_mode_of(graph: fx.Graph):
    """The FakeTensorMode the graph's ``meta["val"]`` tensors belong to."""
    return detect_fake_mode([n.meta["val"] for n in graph.nodes
                             if isinstance(n.meta.get("val"), torch.Tensor)])

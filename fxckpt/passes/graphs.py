"""Small graph utilities shared by passes."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.compat.aot import graph_with_codegen_of, lazy_graph_module
from fxckpt.compat.ops import HigherOrderOperator, detect_fake_mode


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


class Impurity:
    """``node.is_impure(impure_random)``, read once per op. For a
    call_function node FX asks torch's ``is_impure`` of its target
    alone, except for higher-order operators (auto_functionalized asks of
    its first argument), which are asked each time. A 10,000-node graph
    holds a few dozen distinct ops."""

    def __init__(self) -> None:
        self._known: dict[tuple, bool] = {}

    def __call__(self, node: fx.Node, impure_random: bool = True) -> bool:
        target = node.target
        if node.op != "call_function" or isinstance(target, HigherOrderOperator):
            return node.is_impure(impure_random)
        key = (target, impure_random)
        try:
            known = self._known.get(key)
        except TypeError:  # an unhashable target
            return node.is_impure(impure_random)
        if known is None:
            known = self._known[key] = node.is_impure(impure_random)
        return known

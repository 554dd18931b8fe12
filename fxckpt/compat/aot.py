"""AOTAutograd and FX internals: capture, partition and graph-module
helpers fxckpt builds on (see fxckpt/compat/__init__.py)."""

from __future__ import annotations

import functools

import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch import config as functorch_config
from torch._functorch.partitioners import _extract_fwd_bwd_modules
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

__all__ = ["aot_autograd", "boxed_nop", "functorch_config", "extract_forward_backward",
           "torch_partitions", "partitioner_op_lists", "lazy_graph_module",
           "graph_with_codegen_of", "lazy_graph_modules"]


def extract_forward_backward(joint: fx.GraphModule, saved_values: list[fx.Node],
                             saved_symbols: list[fx.Node], *, num_fwd_outputs: int
                             ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward graphs of ``joint`` with ``saved_values``
    (and ``saved_symbols``) passed from one to the other, as torch's own
    partitioners extract them."""
    return _extract_fwd_bwd_modules(joint, saved_values, saved_symbols,
                                    num_fwd_outputs=num_fwd_outputs)


def torch_partitions():
    """(default_partition, min_cut_rematerialization_partition): torch's own."""
    from torch._functorch.partitioners import (default_partition,
                                               min_cut_rematerialization_partition)

    return default_partition, min_cut_rematerialization_partition


@functools.cache
def partitioner_op_lists():
    """torch's min-cut partitioner's op lists (views, recomputable ops,
    compute-intensive ops, ...)."""
    from torch._functorch.partitioners import get_default_op_list

    return get_default_op_list()


def lazy_graph_module(root: fx.GraphModule, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule whose Python code is generated when first called or
    read (a lazy module, as AOTAutograd's own partitioner makes): graphs
    only the memory model reads (the frontier's candidates, the backward
    order not chosen) never pay for it (half a second on a 10,000-node
    graph)."""
    with _use_lazy_graph_module(True):
        return _make_graph_module(root, graph)


def lazy_graph_modules():
    """A context in which new GraphModules generate their code lazily."""
    return _use_lazy_graph_module(True)


def graph_with_codegen_of(gm: fx.GraphModule) -> fx.Graph:
    """An empty graph with ``gm``'s input and output structure (its codegen,
    shared and never edited)."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    return graph

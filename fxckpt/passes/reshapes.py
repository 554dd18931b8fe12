"""``F.linear``'s output reshape read as the ``view`` it is on every release.

torch 2.15 decomposes ``F.linear`` with a bias on a 3-D input into ``addmm``
and ``_unsafe_view`` where 2.11 to 2.14 write ``addmm`` and ``view``; the
two share the matmul's storage and cost nothing, but only ``view`` is one by
its schema, and a plan pricing the other as the copy-like op it looks like
saves other values (the demo GPT's floor rose 1.18x). An ``_unsafe_view`` of
an ``addmm`` (which no earlier release writes: there, matmuls without a
bias end in ``_unsafe_view(mm)``, as they still do) becomes ``view``, so that
the graph planned is the one earlier releases trace."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.passes.graphs import copy_graph_module

_aten = torch.ops.aten


def linear_views(joint: fx.GraphModule) -> fx.GraphModule:
    """``joint`` with each ``_unsafe_view`` of an ``addmm`` a ``view``
    (``joint`` itself, never edited, where there is none)."""
    found = {n.name for n in joint.graph.nodes if _is_linear_reshape(n)}
    if not found:
        return joint
    work = copy_graph_module(joint)
    for node in work.graph.nodes:
        if node.name in found:
            node.target = _aten.view.default
    work.recompile()
    return work


def _is_linear_reshape(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is _aten._unsafe_view.default
            and isinstance(node.args[0], fx.Node)
            and node.args[0].target is _aten.addmm.default)

"""Inductor's fusion of a matmul with a later add, undone where it holds
the matmul's operands.

Inductor's post-grad pattern pass turns ``add(mm(a, b), c)`` into
``addmm(c, a, b)`` at the add's place, so the matmul runs when ``c`` is
ready, not when ``a`` and ``b`` are. In a backward that accumulates a tied
weight's gradient (an embedding tied to the output head), ``c`` is made
last, and the head's gradient matmul moves from the start of the backward
to its end: its operands (the logits' gradient and the final layer norm's
output) are held across the whole backward instead of its weight-sized
result. Measured on the zoo GPT's floor plan: 393,216 bytes held at the
compiled peak for a 32,768-byte result.

``SplitLateAddmm`` runs after Inductor's post-grad patterns and splits such
an ``addmm`` back into ``mm(a, b)`` right after its operands are made and
``add(c, mm)`` where the ``addmm`` was, where that holds fewer bytes: the
product is smaller than the operands it is the last reader of. Other
``addmm`` nodes (a linear layer's, whose bias is an input) are left alone.

A matmul and then an add round otherwise than the fused ``addmm``: the
tied weight's gradient differs in its last bits (3.7e-9 on the zoo GPT).
So the split is for fxckpt's own plans only (``applies``): torch's own
partition, fxckpt's default plan under Inductor, compiles as torch.compile
compiles it, gradients bitwise equal to torch.compile's.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from fxckpt.compat.inductor import CustomGraphPass
from fxckpt.memory.values import tensor_bytes

_aten = torch.ops.aten


class SplitLateAddmm(CustomGraphPass):
    """An Inductor post-grad pass: ``addmm(c, a, b)`` whose ``c`` is made
    after ``a`` and ``b`` becomes ``add(c, mm(a, b))`` with the product made
    as soon as it can be, where that holds fewer bytes; only while
    ``applies()`` (asked per graph, after the partition)."""

    def __init__(self, applies: Callable[[], bool] = lambda: True) -> None:
        self._applies = applies

    def __call__(self, graph: fx.Graph) -> None:
        if not self._applies():
            return
        for node in list(graph.nodes):
            if node.target is not _aten.addmm.default:
                continue
            order = {node: index for index, node in enumerate(graph.nodes)}
            if _worth_splitting(node, order):
                _split(graph, node, order)

    def uuid(self) -> str:
        # Inductor keys each graph after the partition: the key says
        # whether this graph is split.
        return f"fxckpt: addmm split where its add comes late, v1, {self._applies()}"


def _worth_splitting(node: fx.Node, order: dict) -> bool:
    if node.kwargs or len(node.args) != 3:
        return False        # beta / alpha given: not the pattern's addmm
    inp, a, b = node.args
    if not all(isinstance(x, fx.Node) for x in (inp, a, b)):
        return False
    if inp.op == "placeholder" or order[inp] < max(order[a], order[b]):
        return False
    freed = sum(tensor_bytes(x.meta.get("val")) for x in {a, b}
                if _last_reader(x, order) is node)
    return tensor_bytes(node.meta.get("val")) < freed


def _last_reader(node: fx.Node, order: dict) -> fx.Node:
    return max(node.users, key=order.__getitem__)


def _split(graph: fx.Graph, node: fx.Node, order: dict) -> None:
    inp, a, b = node.args
    after = max((a, b), key=order.__getitem__)
    if after.op == "placeholder":
        after = max(graph.find_nodes(op="placeholder"), key=order.__getitem__)
    with graph.inserting_after(after):
        product = graph.call_function(_aten.mm.default, (a, b))
    product.meta = {**node.meta, "val": _aten.mm.default(a.meta["val"], b.meta["val"])}
    with graph.inserting_before(node):
        total = graph.call_function(_aten.add.Tensor, (inp, product))
    total.meta = dict(node.meta)
    node.replace_all_uses_with(total)
    graph.erase_node(node)

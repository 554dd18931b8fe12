"""Host dropout as a random mask and a deterministic product, before planning.

``aten.native_dropout`` returns its output and its mask together, and both
come from one draw: recomputing either replays the draw, so a recomputed
dropout on the host keeps the CPU generator's state for backward (5,056
bytes, against 1 byte per element for the mask that backward reads anyway).
This pass replaces each host dropout of the joint graph by two ops:

* ``fxckpt::dropout_mask(x, p)``: the draw, a bool mask (random);
* ``fxckpt::apply_dropout_mask(x, mask, scale)``: ``x`` times the mask
  times ``scale`` (pointwise, deterministic).

Planning then sees the output as what it is, a pointwise function of ``x``
and the mask: recomputing it needs no generator state where the mask is
saved, and the mask itself is saved, or recomputed from a saved state, as
the solver finds cheaper. The two ops draw and compute exactly what
``native_dropout`` does on the host (the same call to ``bernoulli_`` on a
tensor like ``x``, the same products in ``x``'s dtype), so forward draws
what eager draws and every value is bitwise eager's (checked over dtypes,
layouts and probabilities in tests/test_dropout_split.py).

Device dropouts are left whole: their kernels draw differently (and their
generator state is 16 bytes). So is everything under Inductor, whose own
decompositions replace dropout before fxckpt sees the graph.

Policies are still asked about ``aten.native_dropout``: the output node
keeps the original call (``original_call``), and the mask takes its answer
(``answered_by``), as an element of a multi-output op takes its op's.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxckpt.compat.ops import run_and_save_rng_state
from fxckpt.kernels.dropout import APPLY_DROPOUT_MASK, DROPOUT_MASK
from fxckpt.passes.graphs import copy_graph_module

_NATIVE_DROPOUT = torch.ops.aten.native_dropout.default
# node.meta keys: the call a split output stands for, and the output node a
# mask takes its policy answer from.
_CALL = "fxckpt_dropout_call"
_ANSWERED_BY = "fxckpt_dropout_output"


def split_host_dropouts(joint: fx.GraphModule, *, owned: bool = False) -> fx.GraphModule:
    """``joint`` with every host ``native_dropout`` in training split into a
    mask and its product (``joint`` itself where there is none). ``joint``
    is never edited unless ``owned``: the caller made it, gives it up, and
    saves a copy (a tenth of a second on a 58-layer GPT's 10,000 nodes)."""
    found = [n for n in joint.graph.nodes if _splittable(n)]
    if not found:
        return joint
    work = joint if owned else copy_graph_module(joint)
    if not owned:
        by_name = {n.name: n for n in work.graph.nodes}
        found = [by_name[n.name] for n in found]
    for node in found:
        _split(work.graph, node)
    work.recompile()
    return work


def original_call(node: fx.Node):
    """(op, args, kwargs) of the dropout a split output node stands for, or
    None."""
    return node.meta.get(_CALL)


def answered_by(node: fx.Node) -> str | None:
    """Name of the split output whose policy answer a mask node takes."""
    return node.meta.get(_ANSWERED_BY)


def _splittable(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not _NATIVE_DROPOUT:
        return False
    x = node.args[0]
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    # A probability Dynamo left symbolic is not split: the scale is a number.
    return (train is not False and isinstance(node.args[1], (int, float))
            and isinstance(val, torch.Tensor) and val.device.type == "cpu"
            and val.is_floating_point()
            and all(u.target is operator.getitem and u.args[1] in (0, 1) for u in node.users))


def _split(graph: fx.Graph, node: fx.Node) -> None:
    x, p = node.args[0], float(node.args[1])
    kept = 1.0 - p
    scale = 0.0 if kept == 0 else 1.0 / kept
    elements = {u.args[1]: u for u in node.users}
    with graph.inserting_before(node):
        mask = graph.create_node("call_function", DROPOUT_MASK, (x, p), name=f"{node.name}_mask")
        out = graph.create_node("call_function", APPLY_DROPOUT_MASK, (x, mask, scale),
                                name=f"{node.name}_out")
    shared = {k: v for k, v in node.meta.items() if k != "val"}
    values = node.meta.get("val") or (None, None)
    for made, index in ((out, 0), (mask, 1)):
        element = elements.get(index)
        made.meta = {**shared, **(element.meta if element is not None else {}),
                     "val": element.meta.get("val") if element is not None else values[index]}
        if element is not None:
            element.replace_all_uses_with(made)
            graph.erase_node(element)
    out.meta[_CALL] = (node.target, node.args, dict(node.kwargs))
    mask.meta[_ANSWERED_BY] = out.name
    graph.erase_node(node)


def joined_host_dropouts(forward: fx.GraphModule) -> fx.GraphModule:
    """The forward graph to run: each split dropout whose mask and product
    forward both computes is one ``native_dropout`` again (one op for two,
    as eager runs it), its draw saved where the plan saved the mask's.
    Values, draws and peak are the split pair's: native_dropout holds the
    same tensor like its input while both outputs are made. ``forward``
    itself where nothing joins; never edited."""
    found = [n.name for n in forward.graph.nodes if _joinable(n) is not None]
    if not found:
        return forward
    work = copy_graph_module(forward)
    by_name = {n.name: n for n in work.graph.nodes}
    for name in found:
        _join(work.graph, by_name[name], _joinable(by_name[name]))
    work.recompile()
    return work


def _joinable(out: fx.Node):
    """(mask node, its state-saving call or None) where ``out`` is the
    product of a split dropout whose draw forward makes; else None."""
    if out.op != "call_function" or out.target is not APPLY_DROPOUT_MASK:
        return None
    x, mask = out.args[0], out.args[1]
    if mask.target is DROPOUT_MASK and mask.args[0] is x:
        return mask, None
    if mask.target is operator.getitem and mask.args[1] == 1:
        saving = mask.args[0]
        if saving.op == "call_function" and saving.target is run_and_save_rng_state \
                and saving.args[0] is DROPOUT_MASK and saving.args[1] is x:
            return mask, saving
    return None


def _join(graph: fx.Graph, out: fx.Node, found) -> None:
    mask, saving = found
    x = out.args[0]
    p = (saving.args[2] if saving is not None else mask.args[1])
    with graph.inserting_before(saving if saving is not None else mask):
        if saving is None:
            pair = graph.call_function(_NATIVE_DROPOUT, (x, p, True))
            pair.meta = {**mask.meta, "val": (out.meta.get("val"), mask.meta.get("val"))}
        else:
            both = graph.call_function(run_and_save_rng_state, (_NATIVE_DROPOUT, x, p, True))
            state_val = saving.meta["val"][0]
            both.meta = {**saving.meta, "val": (state_val, (out.meta.get("val"),
                                                            mask.meta.get("val")))}
            state = next(u for u in saving.users if u.args[1] == 0)
            state.replace_input_with(saving, both)
            pair = graph.call_function(operator.getitem, (both, 1))
            pair.meta = {"val": both.meta["val"][1]}
        made = {}
        for index, old in ((0, out), (1, mask)):
            made[index] = graph.call_function(operator.getitem, (pair, index))
            made[index].meta = dict(old.meta)
    out.replace_all_uses_with(made[0])
    mask.replace_all_uses_with(made[1])
    graph.erase_node(out)
    graph.erase_node(mask)
    if saving is not None and not saving.users:
        graph.erase_node(saving)

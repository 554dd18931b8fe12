"""Random ops that backward recomputes replay the values forward drew.

Forward runs such an op as ``run_and_save_rng_state(op, *args)``, which returns
the generator state it started from (CPU generator state, or the CUDA philox
seed/offset) and the op's result; the state is saved for backward. The
recompute runs ``run_with_rng_state(state, op, *args)``, which draws from that
state and puts the generator back as it found it, so backward consumes no
randomness and forward draws exactly what eager would.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxckpt.compat.ops import run_and_save_rng_state, run_with_rng_state
from fxckpt.passes.graphs import fake_mode_of
from fxckpt.ops import random_op_device, rng_state_bytes


def save_rng_state_in_forward(graph: fx.Graph, node: fx.Node, *, fake_mode=None
                              ) -> tuple[fx.Node, fx.Node]:
    """Replace random ``node`` in forward by a state-saving call; return the
    state node and the node now standing for the op's result. ``graph`` must
    be a private copy: it is edited in place. ``fake_mode``: the graph's
    (found by reading every node when not given)."""
    fake_mode = fake_mode if fake_mode is not None else fake_mode_of(graph)
    with graph.inserting_before(node):
        pair = graph.call_function(run_and_save_rng_state, (node.target, *node.args),
                                   dict(node.kwargs))
        state = graph.create_node("call_function", operator.getitem, (pair, 0),
                                  name=f"rng_state_{node.name}")
        value = graph.call_function(operator.getitem, (pair, 1))
    state_val = _state_value(random_op_device(node), fake_mode)
    pair.meta = {**node.meta, "val": (state_val, node.meta.get("val"))}
    state.meta = {"val": state_val, "stack_trace": node.meta.get("stack_trace")}
    value.meta = dict(node.meta)
    node.replace_all_uses_with(value)
    graph.erase_node(node)
    return state, value


def replay_call(graph: fx.Graph, node: fx.Node, state: fx.Node, args, kwargs,
                name: str) -> fx.Node:
    """Insert the backward recompute of random ``node`` from ``state``."""
    replay = graph.create_node("call_function", run_with_rng_state,
                               (state, node.target, *args), dict(kwargs), name=name)
    replay.meta = dict(node.meta)
    return replay


def _state_value(device: torch.device | None, fake_mode):
    """A fake tensor shaped like the generator state for ``device``."""
    if fake_mode is None:
        return torch.empty(rng_state_bytes(device), dtype=torch.uint8)
    # Made inside the fake mode, a storage of its own each time (converting
    # a real tensor costs far more).
    with fake_mode:
        return torch.empty(rng_state_bytes(device), dtype=torch.uint8, device="cpu")

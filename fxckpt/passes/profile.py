"""Joint graph -> Profile: bytes of every value, cost of every op, phases.

Bytes come from the fake tensors AOTAutograd leaves in ``node.meta["val"]``;
views are resolved to the node that owns their storage. Cost is an estimate in
seconds: FLOPs from torch's flop counter formulas over a nominal compute rate,
plus bytes moved over a nominal bandwidth, so a pointwise op is priced by the
memory it streams rather than counted as free.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import CheckpointPolicy
from torch.utils.flop_counter import flop_registry

from fxckpt.compat.ops import OpOverload, pytree
from fxckpt.types import BACKWARD, FORWARD, NodeProfile, Profile
from fxckpt import ops as op_kinds
from fxckpt.ops import rng_state_bytes
from fxckpt.memory.scratch import storage_nbytes, workspace_bytes
from fxckpt.memory.values import concrete, tensor_bytes


# The answers of a torch.utils.checkpoint region that run its ops again.
_RERUN_REGIONS = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


@dataclass(frozen=True)
class CostModel:
    """Nominal machine rates; only their ratio shapes plans."""

    flops_per_second: float = 1e12
    bytes_per_second: float = 1e11

    def seconds(self, flops: int, bytes_moved: int) -> float:
        return flops / self.flops_per_second + bytes_moved / self.bytes_per_second


def profile_joint_graph(joint: fx.GraphModule, *, num_fwd_outputs: int,
                        static_input_indices: Iterable[int] = (),
                        cost_model: CostModel = CostModel(),
                        rerun_custom_ops: bool = False) -> Profile:
    """Read the joint graph; does not modify it. A custom operator can be
    recomputed inside a torch.utils.checkpoint region that asks for it (the
    user asked for it to run again, and torch would run it again), and
    everywhere with ``rerun_custom_ops`` (solver="per_block", which stands
    for such a region around each block); elsewhere it is saved."""
    graph = joint.graph
    static = set(static_input_indices)
    backward = tangent_dependent(graph)
    mutated = _mutated_inputs(graph)
    written = _written_inputs(graph)
    written_or_mutated = mutated | written
    storage_owner: dict[StorageWeakRef, str] = {}
    nodes: dict[str, NodeProfile] = {}
    value_bytes: dict[fx.Node, int] = {}  # tensor_bytes of each value, read once
    op_fields = _OpFields()
    # not_recomputable_reason by op, where the op decides it
    reasons = op_kinds.PerOp(op_kinds.not_recomputable_reason, unless=op_kinds.is_random_op)
    primal_index = 0
    for node in graph.nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        inputs = node.all_input_nodes
        value_bytes[node] = tensor_bytes(val)
        is_tensor = isinstance(val, torch.Tensor)
        storage, own_bytes = node.name, 0
        if is_tensor:
            ref = StorageWeakRef(val.untyped_storage())
            if ref in storage_owner:
                storage = storage_owner[ref]
            else:
                storage_owner[ref] = node.name
                own_bytes = storage_nbytes(node, val)
        is_input = node.op == "placeholder"
        is_static = False
        if is_input and node.name.startswith("primals"):
            is_static = primal_index in static or _is_parameter_or_buffer(node)
            primal_index += 1
        not_recomputable = _not_recomputable(node, inputs, nodes, written_or_mutated, reasons,
                                             rerun_custom_ops)
        flops = _flops(node)
        fields = op_fields(node)
        moved = 0 if fields["is_view"] or node.target is operator.getitem \
            else _bytes_moved(node, inputs, value_bytes)
        nodes[node.name] = NodeProfile(
            name=node.name,
            phase=BACKWARD if node in backward else FORWARD,
            inputs=tuple(i.name for i in inputs),
            bytes=own_bytes,
            storage=storage,
            flops=flops,
            cost=cost_model.seconds(flops, moved),
            is_input=is_input,
            is_static=is_static,
            is_mutated_input=node in mutated,
            is_tensor=is_tensor,
            device=val.device.type if is_tensor else "",
            is_symbolic=isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)),
            not_recomputable=not_recomputable,
            **fields,
        )
    flat_outputs = pytree.arg_tree_leaves(*graph.output_node().args)
    fwd_outputs = tuple(n.name for n in flat_outputs[:num_fwd_outputs] if isinstance(n, fx.Node))
    bwd_outputs = tuple(n.name for n in flat_outputs[num_fwd_outputs:] if isinstance(n, fx.Node))
    needed = {i for name in nodes if nodes[name].phase == BACKWARD
              for i in nodes[name].inputs if nodes[i].phase == FORWARD}
    needed |= {name for name in bwd_outputs if nodes[name].phase == FORWARD}
    return Profile(nodes=nodes, needed_by_backward=frozenset(needed),
                   forward_outputs=fwd_outputs, backward_outputs=bwd_outputs)


class _OpFields:
    """The NodeProfile fields that classify a node's op and its origin, for
    the nodes of one graph, read once where they repeat: an op overload's
    classes once per op, a stack trace's source line once per trace, and
    torch's partitioner's classes by ``RematKinds`` (a 10,000-node graph
    holds a few dozen ops and traces from a few hundred lines)."""

    def __init__(self) -> None:
        self._classes = op_kinds.PerOp(_op_classes)
        self._sources: dict[str, str] = {}
        self._remat = op_kinds.RematKinds()

    def __call__(self, node: fx.Node) -> dict:
        classes = self._classes(node)
        trace = node.meta.get("stack_trace") or ""
        source = self._sources.get(trace)
        if source is None:
            source = self._sources[trace] = op_kinds.source_line(node)
        return dict(
            classes,
            replay_bytes=rng_state_bytes(op_kinds.random_op_device(node))
            if classes["is_random"] else 0,
            workspace=workspace_bytes(node),
            source=source,
            module_path=op_kinds.module_path(node),
            owner_module_path=op_kinds.owner_module_path(node),
            at_root=op_kinds.at_root(node),
            remat=self._remat(node),
        )


def _op_classes(node: fx.Node) -> dict:
    """The NodeProfile fields of ``node``'s op alone (for an op overload,
    the same for every node calling it)."""
    return dict(
        op=op_kinds.op_name(node),
        is_view=op_kinds.is_view(node),
        is_pointwise=op_kinds.is_pointwise(node),
        is_random=op_kinds.is_random(node),
        is_compute_intensive=op_kinds.is_compute_intensive(node),
    )


def _not_recomputable(node: fx.Node, inputs: list[fx.Node], nodes: dict[str, NodeProfile],
                      mutated, reasons: op_kinds.PerOp, rerun_custom_ops: bool) -> str:
    """Why the node cannot run again in backward ("" if it can); ``inputs``
    its input nodes, ``mutated`` the inputs the step writes, which a
    recompute would read updated; ``reasons``:
    ops.not_recomputable_reason, read once per op where the op decides it;
    ``rerun_custom_ops``: custom operators may run again anywhere, not only
    in a region asking to recompute them."""
    if node.target is operator.getitem and node.args[0].name in nodes:
        parent = node.args[0]
        if op_kinds.returns_state(parent, node.args[1]) and \
                any(i in mutated for i in parent.all_input_nodes):
            return ("the new value of a running statistic (a recompute would update "
                    "the already updated one)")
        return nodes[parent.name].not_recomputable
    reason = reasons(node)
    if reason and op_kinds.is_custom_op(node) and (
            rerun_custom_ops or node.meta.get("recompute") in _RERUN_REGIONS):
        reason = op_kinds.not_recomputable_reason(node, rerun_custom=True)
    reads = [i.name for i in inputs
             if i in mutated and not op_kinds.reads_only_for_state(node, i)]
    if not reason and reads:
        reason = (f"reads {reads[0]}, an input the step mutates in "
                  "place (a recompute would read the new value)")
    return reason


def _written_inputs(graph: fx.Graph) -> set[fx.Node]:
    """Inputs the forward graph itself copies a new value into (AOTAutograd
    keeps such mutations in the graph where it can)."""
    return {node.args[0] for node in graph.find_nodes(op="call_function",
                                                      target=torch.ops.aten.copy_.default)
            if isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"}


def _mutated_inputs(graph: fx.Graph) -> set[fx.Node]:
    """Inputs AOTAutograd copies a new value into after forward, read from the
    descriptions it leaves on the output node."""
    descs = graph.output_node().meta.get("desc") or []
    targets = [getattr(d, "mutated_input", None) for d in descs
               if type(d).__name__ == "InputMutationAOTOutput"]
    return {n for n in graph.find_nodes(op="placeholder")
            if n.meta.get("desc") is not None and n.meta.get("desc") in targets}


def _is_parameter_or_buffer(node: fx.Node) -> bool:
    return type(node.meta.get("desc")).__name__ in ("ParamAOTInput", "BufferAOTInput")


def tangent_dependent(graph: fx.Graph) -> set[fx.Node]:
    """Nodes computed from a tangent: the backward proper."""
    backward: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "output":
            continue
        if (node.op == "placeholder" and node.name.startswith("tangents")) or \
                any(i in backward for i in node.all_input_nodes):
            backward.add(node)
    return backward


def _bytes_moved(node: fx.Node, inputs: list[fx.Node], value_bytes: dict[fx.Node, int]) -> int:
    """Bytes an op reads and writes: its inputs' values and its own
    (``value_bytes``: tensor_bytes of each node's value, inputs first)."""
    if node.op != "call_function":
        return 0
    return sum(value_bytes[i] for i in inputs) + value_bytes[node]


def _flops(node: fx.Node) -> int:
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload) \
            or target.overloadpacket not in flop_registry:
        return 0  # no formula (op_flops' 0), without reading the arguments' values
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    try:
        return op_flops(node.target, args, kwargs, node.meta.get("val"))
    except Exception:  # a formula that cannot read symbolic shapes: price by traffic only
        return 0


def op_flops(op, args, kwargs, out) -> int:
    """FLOPs of one op call by torch's formulas (0 where it has none): on fake
    tensors while planning, on real ones where steps are counted."""
    if not isinstance(op, OpOverload):
        return 0
    formula = flop_registry.get(op.overloadpacket)
    return concrete(formula(*args, **kwargs, out_val=out)) if formula is not None else 0

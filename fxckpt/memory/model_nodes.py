"""The joint graph read once into plain per-node records, for the schedule
model (memory/schedule.py): each node's inputs, storages (numbered), bytes,
workspace, device, purity and what the rewrite asks of it."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxckpt.compat.ops import (OpOverload, is_mutable, pytree, run_and_save_rng_state,
                               run_with_rng_state, schema)
from fxckpt.memory.model import StorageMemo, fuses, is_reduction, storage_allocation
from fxckpt.memory.scratch import workspace_bytes
from fxckpt.memory.values import device_type
from fxckpt.ops import Impurity, PerOp, random_op_device, rng_state_bytes
from fxckpt.types import BACKWARD, Profile


@dataclass
class ModelNode:
    name: str
    kind: str                       # "primal", "tangent", "op"
    inputs: tuple[int, ...]         # joint indices, in all_input_nodes order
    storages: tuple[tuple[object, int], ...]
    workspace: int
    counted: bool                   # on the graph's device (or no device)
    impure: bool                    # kept by dead-code elimination (random ops too)
    side_effect: bool               # kept by the backward schedule (random ops not)
    backward: bool                  # profile phase is backward
    getitem: bool                   # takes an element out of a tuple
    # Per storage: (input position, its storage position) where the value is
    # a view of that input's storage, else None (a storage of its own).
    aliases: tuple = ()
    state_bytes: int = 0            # generator state, if it is random
    # Of those, the bytes on the graph's device: a CUDA generator's state
    # (its philox seed and offset) is saved and replayed in host memory.
    state_device_bytes: int = 0
    grows: bool = False             # allocates more than its inputs hold (memory.grows_memory)
    allocates: bool = True          # makes a storage of its own (not only views)
    # What Inductor's inlining reads of the op (memory.inlined_keys): it
    # lowers to pointwise code, it is a reduction, its name, on the CPU.
    fuses: bool = False
    reduction: bool = False
    op: str = ""
    cpu: bool = False
    # An input's mutation (``_input_mutation``): in forward only, as
    # AOTAutograd's extraction places mutations outside backward.
    forward_only: bool = False


@dataclass(frozen=True)
class JointRead:
    nodes: list[ModelNode]
    fwd_outputs: list[int]         # forward's outputs, joint indices
    bwd_outputs: list[int]         # backward's outputs (gradients)
    first_backward: int            # index of the first backward op


def read_joint(joint: fx.GraphModule, profile: Profile, *, num_fwd_outputs: int
               ) -> JointRead | None:
    """The records of ``joint`` (the graph ``rewrite`` is given), or None
    for a graph the model does not cover (several devices, in-place ops,
    placeholders other than primals and tangents). Tensor constants
    (get_attr) are ops without inputs."""
    graph = joint.graph
    nodes = [n for n in graph.nodes if n.op != "output"]
    index = {n: i for i, n in enumerate(nodes)}
    storages = StorageMemo()
    device_of = {n: device_type(n) for n in nodes}
    devices = set(device_of.values()) - {""}
    if len(devices) > 1:
        return None
    device = devices.pop() if devices else "cpu"
    model_nodes = []
    ids: dict = {}  # storages as numbers (generator states are negative)
    numbered_of: dict[fx.Node, tuple] = {}  # read once: a node's, then as an input
    impure = Impurity()
    view_arguments = PerOp(lambda node: _view_arguments(node.target))

    def numbered(node: fx.Node):
        found = numbered_of.get(node)
        if found is None:
            found = numbered_of[node] = tuple((ids.setdefault(ref, len(ids)), nbytes)
                                              for ref, nbytes in storages(node))
        return found

    for n in nodes:
        made = _model_node(n, index, numbered, profile, device, device_of[n], impure,
                           view_arguments)
        if made is None:
            return None
        model_nodes.append(made)
    flat = pytree.arg_tree_leaves(*graph.output_node().args)
    fwd = [index[x] for x in flat[:num_fwd_outputs] if isinstance(x, fx.Node)]
    bwd = [index[x] for x in flat[num_fwd_outputs:] if isinstance(x, fx.Node)]
    first_backward = next((i for i, m in enumerate(model_nodes)
                           if m.kind == "op" and m.backward), len(model_nodes))
    return JointRead(model_nodes, fwd, bwd, first_backward)


def _model_node(node: fx.Node, index, storages, profile: Profile, device: str,
                node_device: str, impure: Impurity, view_arguments: PerOp):
    """The record of ``node``, or None where the model does not cover it.
    ``storages``: its numbered storages; ``node_device``: its device type;
    ``impure``: its purity, read once per op; ``view_arguments``:
    ``_view_arguments`` of its op, read once per op."""
    mutates = False   # an in-place op: only an input's mutation is covered
    if node.op == "placeholder":
        if node.name.startswith("primals"):
            kind = "primal"
        elif node.name.startswith("tangents"):
            kind = "tangent"
        else:
            return None  # seeds, backward state
    elif node.op == "call_function":
        kind = "op"
        target = node.target
        mutates = isinstance(target, OpOverload) and is_mutable(target)
        if mutates and not _input_mutation(node, profile):
            return None
    elif node.op == "get_attr":
        # A tensor constant (HF T5's): AOTAutograd's extraction copies it
        # into each graph, at its place, as it does an op with no inputs;
        # dead-code elimination drops it where unread.
        kind = "op"
    else:
        return None
    info = profile.nodes.get(node.name)
    random = info is not None and info.is_random
    own = tuple(storages(node))
    input_nodes = node.all_input_nodes
    inputs = [storages(a) for a in input_nodes]
    # The bytes it makes, and those its inputs hold (memory.allocation).
    made, held = storage_allocation(own, inputs)
    state_bytes = rng_state_bytes(random_op_device(node)) if random else 0
    return ModelNode(
        name=node.name, kind=kind, inputs=tuple(index[a] for a in input_nodes),
        # The profile read the workspace already (the same graph).
        storages=own, workspace=info.workspace if info is not None else workspace_bytes(node),
        aliases=_aliases(own, inputs, _schema_view_of(node, input_nodes, view_arguments)),
        counted=node_device in (device, ""),
        impure=kind == "op" and impure(node),
        side_effect=kind == "op" and impure(node, impure_random=False),
        backward=info is not None and info.phase == BACKWARD,
        getitem=node.target is operator.getitem,
        state_bytes=state_bytes,
        state_device_bytes=state_bytes if device == "cpu" else 0,
        # memory.grows_memory, allocated_bytes
        grows=kind == "op" and node.op == "call_function" and made > held,
        allocates=kind == "op" and made > 0,
        fuses=fuses(node), reduction=is_reduction(node),
        op=getattr(node.target, "__name__", "") if kind == "op" else "",
        cpu=node_device == "cpu",
        forward_only=mutates)


def _input_mutation(node: fx.Node, profile: Profile) -> bool:
    """An input's mutation as AOTAutograd keeps it in a training graph
    (``keep_inference_input_mutations``): a forward ``copy_`` into a primal
    that nothing reads (batch norm's running statistics). It writes the
    input's storage, which no graph counts, and holds its source until it
    runs, as any op reading it does; forward runs it, backward never (the
    joint graph places it after backward's ops)."""
    info = profile.nodes.get(node.name)
    return (node.target is torch.ops.aten.copy_.default and not node.users
            and info is not None and info.phase != BACKWARD
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder"
            and node.args[0].name.startswith("primals"))


def _aliases(own: tuple, inputs: list, view_of: int | None = None) -> tuple:
    """For each of a node's storages, (input position, storage position) of
    the input storage it is, or None. ``view_of``: the input the op's schema
    says its one output is a view of, for when the joint graph's metadata
    does not show it (Inductor's joint passes can give a view, such as the
    unsqueeze of a causal mask's iota, a storage of its own): the rewrite's
    copies get their metadata again, and there the view shares its input's
    storage."""
    where = {}
    for k, found in enumerate(inputs):
        for q, (ref, _) in enumerate(found):
            where.setdefault(ref, (k, q))
    aliases = tuple(where.get(ref) for ref, _ in own)
    if view_of is not None and aliases == (None,) and len(inputs[view_of]) == 1:
        return ((view_of, 0),)
    return aliases


def _schema_view_of(node: fx.Node, input_nodes: list[fx.Node],
                    view_arguments: PerOp) -> int | None:
    """Position among ``input_nodes`` (``node.all_input_nodes``) of the
    input an op with one output returns a view of (by its schema's alias
    annotations), or None. ``view_arguments``: ``_view_arguments`` of a
    node's op."""
    if not isinstance(node.target, OpOverload):
        return None
    for k in view_arguments(node):
        if k < len(node.args) and isinstance(node.args[k], fx.Node):
            return input_nodes.index(node.args[k])
    return None


def _view_arguments(op: OpOverload) -> tuple[int, ...]:
    """Positions of the arguments the one output of ``op`` may be a view of
    (read-only alias annotations it shares), in order; () for ops with
    several outputs or whose output aliases nothing."""
    returns = schema(op).returns
    if len(returns) != 1:
        return ()
    alias = returns[0].alias_info
    if alias is None or alias.is_write:
        return ()
    return tuple(k for k, argument in enumerate(schema(op).arguments)
                 if argument.alias_info is not None and not argument.alias_info.is_write
                 and argument.alias_info.before_set & alias.before_set)


def rng_calls_impure() -> tuple[bool, bool]:
    """Whether FX counts run_with_rng_state and run_and_save_rng_state calls
    impure (dead-code elimination keeps them)."""
    graph = fx.Graph()
    state = graph.placeholder("state")
    op = torch.ops.aten.rand.default
    return (graph.call_function(run_with_rng_state, (state, op, [1])).is_impure(),
            graph.call_function(run_and_save_rng_state, (op, [1])).is_impure())

"""Common-subexpression elimination on the joint graph, before planning.

A causal mask each layer rebuilds from the same inputs is one value, not one
per layer: torch's partitioner merges such repeats before it plans, and so
does fxckpt. This pass merges a node into an earlier one with the same
target and the same (already merged) arguments, and never merges:
* random ops (they would share their draw), ``aten.empty`` (its values are
  whatever memory held);
* nodes whose storage the graph returns (eager gives each its own tensor);
* values of unbacked symbols (their metadata would go stale);
* nodes on either side of an op that mutates its arguments: a mutation
  starts a new region, and only nodes of one region merge.

The same rules as torch's ``fx_graph_cse``, so that the graph planned is
the one torch's partitioner sees, to the node, with one exception: floats
are compared by their bits (0.0 and -0.0 differ, a NaN equals itself),
where torch compares them with ``==`` and merges ``full(0.0)`` into
``full(-0.0)``, changing results (1 / -0.0 is -inf). A node is looked up by
the hash of its target and arguments, as torch does, so that a node whose
arguments hash like an earlier, different node's (Python hashes -1 and -2
alike: ``unsqueeze(x, -1)`` after ``unsqueeze(x, -2)``) is kept, and so are
its repeats. Written here because that function imports Inductor's pattern
matcher (seconds of a cold compile that ``compiler="eager"`` has no other
use for) and writes region ids into the metadata of the graph it is given.
This pass returns a new graph and leaves its input as it was.
"""

from __future__ import annotations

import struct

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.immutable_collections import immutable_dict, immutable_list

from fxckpt.compat.ops import OpOverload, is_mutable, mutable_args, pytree, storage_id
from fxckpt.ops import PerOp, is_random, packet
from fxckpt.ops import Impurity
from fxckpt.passes.graphs import lazy_graph_module

aten = torch.ops.aten
# Random ops that carry no ``nondeterministic_seeded`` tag.
_RANDOM_PACKETS = frozenset({aten.dropout, aten._fused_dropout, aten.native_dropout,
                             aten.rrelu, aten.bernoulli, aten.multinomial, aten.normal,
                             aten.poisson, aten.binomial, aten._standard_gamma,
                             aten.rand_like, aten.rand, aten.randint, aten.randn,
                             aten.randperm})
_SYM_TYPES = (torch.SymBool, torch.SymInt, torch.SymFloat)


def deduplicated(joint: fx.GraphModule) -> fx.GraphModule:
    """``joint`` with repeated identical computations merged (``joint``
    itself when nothing merges)."""
    graph = merged_graph(joint.graph)
    if len(graph.nodes) == len(joint.graph.nodes):
        return joint
    return lazy_graph_module(joint, graph)


def merged_graph(graph: fx.Graph) -> fx.Graph:
    """A new graph: ``graph`` with repeats merged."""
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    # hash key -> (token, node in the new graph, its mutation region)
    seen: dict[tuple, tuple[tuple, fx.Node, int]] = {}
    kept = _never_merged(graph)
    region = 0
    for node in graph.nodes:
        if _mutates(node):
            region += 1
        if node in kept:
            env[node] = new_graph.node_copy(node, lambda x: env[x])
            continue
        keyed = _keyed(node, env)
        earlier = seen.get(keyed[0]) if keyed is not None else None
        if earlier is not None and earlier[0] == keyed[1] and earlier[2] == region:
            env[node] = earlier[1]
            continue
        env[node] = new_graph.node_copy(node, lambda x: env[x])
        if keyed is not None and (earlier is None or earlier[0] == keyed[1]):
            # New, or a repeat in a later region (later repeats merge into
            # this one); a different node under the same hash is not kept.
            seen[keyed[0]] = (keyed[1], env[node], region)
    return new_graph


def _never_merged(graph: fx.Graph) -> set[fx.Node]:
    output = next(iter(reversed(graph.nodes)))
    returned = {_storage(n) for n in output.all_input_nodes} - {None}
    kept = _mutable_bases(graph)
    impure = Impurity()
    kept_op = PerOp(lambda node: _kept_op(node, impure))
    for node in graph.nodes:
        if node.op != "call_function" or kept_op(node) or _storage(node) in returned \
                or _unbacked(node):
            kept.add(node)
    return kept


def _kept_op(node: fx.Node, impure: Impurity) -> bool:
    """Whether the op of call_function ``node`` is never merged: impure,
    random, or ``aten.empty`` (for an op overload, the op alone decides)."""
    return (impure(node) or is_random(node) or packet(node) in _RANDOM_PACKETS
            or packet(node) is aten.empty)


def _mutable_bases(graph: fx.Graph) -> set[fx.Node]:
    """Buffers a functionalized mutation writes (``auto_functionalized``'s
    bases, a Triton kernel's cloned tensors): two identical factories
    feeding two such buffers are two buffers."""
    bases: set[fx.Node] = set()

    def add(value):
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, fx.Node):
                bases.add(item)

    hops = torch.ops.higher_order
    for node in graph.find_nodes(op="call_function", target=hops.auto_functionalized_v2):
        add(node.kwargs.get("_all_bases", ()))
    for node in graph.find_nodes(op="call_function", target=hops.auto_functionalized):
        for name in mutable_args(node.args[0]):
            add(node.kwargs.get(name))
    for node in graph.nodes:
        if getattr(node.target, "__name__", None) == "triton_kernel_wrapper_functional":
            inner = node.kwargs.get("kwargs", {})
            for name in node.kwargs.get("tensors_to_clone", ()):
                add(inner.get(name))
    return bases


def _storage(node: fx.Node):
    """What identifies the storage of ``node``'s value (views share it), or
    None: the storage's address, as StorageWeakRef compares them, without
    making and freeing a weak reference per node (the graph's values hold
    their storages alive while the pass runs)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return storage_id(val)
    except NotImplementedError:
        return None


def _unbacked(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, _SYM_TYPES) and bool(free_unbacked_symbols(val))


def _mutates(node: fx.Node) -> bool:
    target = node.target
    if isinstance(target, OpOverload):
        return is_mutable(target)
    return node.op == "call_function" and (getattr(target, "__name__", "").endswith("_")
                                           or node.kwargs.get("out") is not None)


def _keyed(node: fx.Node, env: dict[fx.Node, fx.Node]) -> tuple[tuple, tuple] | None:
    """(hash key, token) of a node: the token is what makes two nodes the
    same computation (the target and the arguments, merged nodes replaced by
    what they merged into, each leaf with its type: 1 and 1.0 differ); the
    key is the target and the token's hash. None where an argument cannot be
    hashed (the node is kept)."""
    def leaves(tree):
        flat, spec = _flattened(tree)
        out = []
        for value in flat:
            if isinstance(value, fx.Node):
                value = env.get(value, value)
            elif isinstance(value, _SYM_TYPES):
                value = value.node
            value = _bits(value)
            out.append((value, type(value)))
        return tuple(out), spec
    args, kwargs = leaves(node.args), leaves(node.kwargs)
    try:
        digest = hash((args[0], kwargs[0]))
    except TypeError:
        return None
    return (node.target, digest), (node.target, *args, *kwargs, _context(node))


def _flattened(tree) -> tuple[list, object]:
    """(leaves, structure) of a node's args or kwargs, as pytree flattens
    them: the structure is ``str`` of pytree's spec, or, for arguments made
    only of tuples, lists, dicts (FX's immutable ones too) and plain leaves
    (nodes, numbers, strings, None, dtypes, devices, layouts, memory
    formats, symbols), a tuple that tells the same structures apart (and
    is compared as it is: not made a string, which costs as much as the
    rest of the key). Most arguments are the latter, read without
    ``tree_flatten``, which costs more and leaves a reference cycle per
    call (its recursive helper) to Python's cyclic collector: ~100,000
    objects on a 58-layer GPT. Which form a node gets depends only on its
    arguments' types, so two nodes whose pytree structures and leaf types
    are equal get equal structures, and others never do (a tuple is never
    a ``str``)."""
    flat: list = []
    structure = _plain_structure(tree, flat)
    if structure is not None:
        return flat, structure
    flat, spec = pytree.tree_flatten(tree)
    return flat, str(spec)


def _plain_structure(tree, flat: list):
    """The structure of ``tree`` as nested (type, keys, children) tuples
    (leaves: "*"), its leaves appended to ``flat`` in pytree's order; None
    where it holds anything else."""
    kind = type(tree)
    if kind in _PLAIN_LEAVES:
        flat.append(tree)
        return "*"
    if kind in _SEQUENCES:
        children = tree
        keys = None
    elif kind in _MAPPINGS:
        children = tree.values()
        keys = repr(list(tree))     # as pytree's spec shows its keys
    else:
        return None
    inner = []
    for child in children:
        structure = _plain_structure(child, flat)
        if structure is None:
            return None
        inner.append(structure)
    return kind, keys, tuple(inner)


# Types pytree flattens as leaves (exact types: a subclass may be a pytree
# node, as named tuples are), and containers it flattens in order.
_PLAIN_LEAVES = frozenset({fx.Node, int, float, bool, complex, str, type(None), torch.dtype,
                           torch.device, torch.layout, torch.memory_format, *_SYM_TYPES})
_SEQUENCES = frozenset({tuple, list, immutable_list})
_MAPPINGS = frozenset({dict, immutable_dict})


def _bits(value):
    """Floats by their bits: 0.0 and -0.0 are different arguments."""
    if type(value) is float:
        return ("float", struct.pack(">d", value))
    if type(value) is complex:
        return ("complex", struct.pack(">dd", value.real, value.imag))
    return value


def _context(node: fx.Node) -> tuple:
    """The stream and memory pool a node was put on: nodes of different
    ones never merge."""
    custom = node.meta.get("custom") or {}
    return custom.get("stream", 0), custom.get("mempool"), custom.get("mempool_device")

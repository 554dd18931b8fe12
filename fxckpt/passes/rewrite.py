"""Joint graph + Decision -> forward and backward graphs.

In order, with no interleaving:
1. copy the joint graph (the input is never edited);
2. build the recompute subgraph: a clone of every recomputed forward value,
   reading saved values or other clones, random ops replaying their saved
   RNG state; backward nodes are pointed at the clones;
3. split with AOTAutograd's own extractor, so the forward returns exactly the
   saved values in the layout its runtime expects;
4. schedule backward so each clone runs just before its first use, and drop
   anything backward does not need. FX's code generator frees every value
   after its last use, so a recomputed value lives only as long as it must.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch.partitioners import _extract_fwd_bwd_modules
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from fxckpt.types import BACKWARD, Decision, Profile, recomputed_name
from fxckpt.passes import rng
from fxckpt.passes import offload as _registers_offload_ops  # noqa: F401  (fxckpt::offload, fxckpt::reload)
from fxckpt.passes.graphs import copy_graph_module, fake_mode_of

@dataclass(frozen=True)
class Rewritten:
    forward: fx.GraphModule
    backward: fx.GraphModule
    saved: tuple[str, ...]          # forward outputs kept for backward, in order
    rng_states: tuple[str, ...]     # the saved generator states among them
    rng_state_bytes: dict[str, int]  # bytes of each saved generator state
    clones: dict[str, str]          # recomputed value -> its node in backward


def rewrite(joint: fx.GraphModule, profile: Profile, decision: Decision, *,
            num_fwd_outputs: int) -> Rewritten:
    """The graphs are lazy GraphModules: their Python code is generated when
    first run, so plans only simulated (the frontier's candidates) skip it."""
    with _use_lazy_graph_module(True):
        return _rewrite(joint, profile, decision, num_fwd_outputs)


def _rewrite(joint, profile, decision, num_fwd_outputs) -> Rewritten:
    work = copy_graph_module(joint)
    graph = work.graph
    by_name = {n.name: n for n in graph.nodes}
    hosts = _offload(graph, by_name, decision.offloaded)
    clones, states = _build_recompute(graph, profile, decision, num_fwd_outputs,
                                      hosts={by_name[v]: h for v, h in hosts.items()})
    _ensure_topological(graph)
    saved_nodes = [hosts.get(name, by_name[name])
                   for name in _in_graph_order(graph, decision.saved)]
    saved_values = [n for n in saved_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    saved_values += states
    saved_sym = [n for n in saved_nodes if not isinstance(n.meta.get("val"), torch.Tensor)]
    forward, backward = _extract_fwd_bwd_modules(
        work, saved_values, saved_sym, num_fwd_outputs=num_fwd_outputs)
    backward.graph = _schedule_just_in_time(backward.graph, set(clones.values()))
    backward.recompile()
    return Rewritten(
        forward=forward, backward=backward,
        saved=tuple(n.name for n in saved_sym + saved_values),
        rng_states=tuple(n.name for n in states),
        rng_state_bytes={n.name: _storage_nbytes(n.meta.get("val")) for n in states},
        clones=clones)


def _storage_nbytes(val) -> int:
    try:
        return int(val.untyped_storage().nbytes())
    except AttributeError:
        return 0


def _in_graph_order(graph: fx.Graph, names) -> list[str]:
    names = set(names)
    return [n.name for n in graph.nodes if n.name in names]


def _offload(graph: fx.Graph, by_name: dict[str, fx.Node], offloaded) -> dict[str, fx.Node]:
    """A copy to host right after each offloaded value is produced; forward
    saves the copy instead of the value. Returns name -> host copy."""
    fake_mode = fake_mode_of(graph)
    hosts = {}
    for name in offloaded:
        value = by_name[name]
        with graph.inserting_after(value):
            host = graph.create_node("call_function", torch.ops.fxckpt.offload.default, (value,),
                                     name=f"{name}_offloaded")
        with fake_mode:
            host.meta = {"val": torch.empty_like(value.meta["val"], device="cpu")}
        hosts[name] = host
    return hosts


def _build_recompute(graph: fx.Graph, profile: Profile, decision: Decision,
                     num_fwd_outputs: int, *, hosts: dict[fx.Node, fx.Node]
                     ) -> tuple[dict[str, str], list[fx.Node]]:
    """Clone recomputed values in front of the backward; return clone names
    (reloads of offloaded values among them) and the RNG-state nodes forward
    must now save. Backward reads an offloaded value through its reload."""
    order = [n for n in graph.nodes if n.name in decision.recomputed]
    first_backward = next(
        (n for n in graph.nodes
         if n.op != "placeholder" and profile.nodes.get(n.name) is not None
         and profile.nodes[n.name].phase == BACKWARD),
        graph.output_node())
    clone_of: dict[fx.Node, fx.Node] = {}
    for value, host in hosts.items():
        with graph.inserting_before(first_backward):
            reload = graph.create_node("call_function", torch.ops.fxckpt.reload.default,
                                       (host, value.meta["val"].device),
                                       name=f"{value.name}_reloaded")
        reload.meta = dict(value.meta)
        clone_of[value] = reload
    states: list[fx.Node] = []
    fake_mode = fake_mode_of(graph) if any(profile.nodes[n.name].is_random for n in order) \
        else None  # read once: finding it reads every node
    for node in order:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                       lambda a: clone_of.get(a, a))
        name = recomputed_name(node.name)
        with graph.inserting_before(first_backward):
            if profile.nodes[node.name].is_random:
                state, forward_value = rng.save_rng_state_in_forward(
                    graph, node, fake_mode=fake_mode)
                clone = rng.replay_call(graph, node, state, args, kwargs, name)
                states.append(state)
                # Forward users now read ``forward_value``; clones of them must
                # read the replay instead.
                clone_of[forward_value] = clone
            else:
                clone = graph.create_node(node.op, node.target, args, kwargs, name=name)
                clone.meta = dict(node.meta)
        clone_of[node] = clone
    for node in list(graph.nodes):
        if node.op == "output" or profile.nodes.get(node.name, None) is None:
            continue
        if profile.nodes[node.name].phase == BACKWARD:
            for original in [i for i in node.all_input_nodes if i in clone_of]:
                node.replace_input_with(original, clone_of[original])
    _point_backward_outputs_at_clones(graph, num_fwd_outputs, clone_of)
    clone_names = {orig.name: c.name for orig, c in clone_of.items()}
    return clone_names, states


def _ensure_topological(graph: fx.Graph) -> None:
    """Move nodes so each comes after its inputs. Clones sit in front of the
    backward, but may read forward-side values the joint graph placed among
    backward nodes (say pow(x, 1) for the gradient of x ** 2): those move
    up. Everything else keeps its order."""
    placed: set[fx.Node] = set()

    def place(node: fx.Node) -> None:
        for parent in node.all_input_nodes:
            if parent not in placed:
                node.prepend(parent)
                place(parent)
        placed.add(node)

    for node in list(graph.nodes):
        if node not in placed:
            place(node)


def _point_backward_outputs_at_clones(graph, num_fwd: int, clone_of) -> None:
    output = graph.output_node()
    flat, spec = pytree.tree_flatten(output.args)
    flat = flat[:num_fwd] + [clone_of.get(x, x) for x in flat[num_fwd:]]
    output.args = pytree.tree_unflatten(flat, spec)


def _schedule_just_in_time(graph: fx.Graph, recomputed: set[str]) -> fx.Graph:
    """Reorder so each recomputed node runs right before its first user, and
    drop nodes nothing uses (a random op is dropped too: backward must not draw
    numbers nobody reads)."""
    needed = _live_nodes(graph)
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}

    def emit(node: fx.Node) -> None:
        if node in env:
            return
        for arg in node.all_input_nodes:
            emit(arg)
        env[node] = new_graph.node_copy(node, lambda a: env[a])

    for node in graph.nodes:
        if node.op == "placeholder" or (node in needed and node.name not in recomputed):
            emit(node)
    return new_graph


def _live_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes the output needs, plus real side effects (random draws excluded)."""
    live: set[fx.Node] = set()
    stack = [n for n in graph.nodes
             if n.op == "output" or (n.op == "call_function" and n.is_impure(impure_random=False))]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    return live

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

A value the decision recomputes again (Decision.copy_steps) gets one clone per
range of backward steps; what needs it within a range reads that range's
copy, so an earlier copy is freed once its readers ran and the value is
made again when backward next needs it. The copies of a random op replay
the one saved generator state, so they are equal.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from fxckpt.compat.aot import extract_forward_backward, lazy_graph_modules
from fxckpt.compat.ops import pytree
from fxckpt.types import (BACKWARD, Decision, Profile, copy_recomputed_name,
                          recomputed_name)
from fxckpt.memory.model import StorageMemo, allocation
from fxckpt.passes import rng
from fxckpt.kernels import offload as _registers_offload_ops  # noqa: F401  (fxckpt::offload, fxckpt::reload)
from fxckpt.ops import Impurity
from fxckpt.passes.graphs import copy_graph_module, fake_mode_of, lazy_graph_module

@dataclass(frozen=True)
class Rewritten:
    forward: fx.GraphModule
    backward: fx.GraphModule
    saved: tuple[str, ...]          # forward outputs kept for backward, in order
    rng_states: tuple[str, ...]     # the saved generator states among them
    rng_state_bytes: dict[str, int]  # bytes of each saved generator state
    clones: dict[str, str]          # recomputed value -> the node backward's own nodes read
    # value recomputed more than once -> its copies before the last, in order
    earlier: dict[str, tuple[str, ...]] = field(default_factory=dict)


def rewrite(joint: fx.GraphModule, profile: Profile, decision: Decision, *,
            num_fwd_outputs: int, sink_growing: bool = True) -> Rewritten:
    """The graphs are lazy GraphModules: their Python code is generated when
    first run, so plans only simulated (the frontier's candidates) skip it.
    ``sink_growing``: backward nodes that grow memory wait for their users
    (see _just_in_time_order); off where a compiler schedules the graph
    itself (Inductor)."""
    return rewrite_orders(joint, profile, decision, num_fwd_outputs=num_fwd_outputs,
                          orders=(sink_growing,))[0]


def rewrite_orders(joint: fx.GraphModule, profile: Profile, decision: Decision, *,
                   num_fwd_outputs: int, orders=(False, True)) -> list[Rewritten]:
    """``decision`` rewritten once, its backward scheduled with each of
    ``orders`` (``sink_growing`` values): one Rewritten per distinct
    backward order, in the order asked (an order the one before it already
    gives is left out). The forward graph is shared."""
    with lazy_graph_modules():
        return _rewrite(joint, profile, decision, num_fwd_outputs, orders)


def _rewrite(joint, profile, decision, num_fwd_outputs, orders) -> list[Rewritten]:
    work = copy_graph_module(joint)
    graph = work.graph
    by_name = {n.name: n for n in graph.nodes}
    hosts = _offload(graph, by_name, decision.offloaded)
    clones, earlier, states = _build_recompute(graph, profile, decision, num_fwd_outputs,
                                      hosts={by_name[v]: h for v, h in hosts.items()})
    _ensure_topological(graph)
    saved_nodes = [hosts.get(name, by_name[name])
                   for name in _in_graph_order(graph, decision.saved)]
    saved_values = [n for n in saved_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    saved_values += states
    saved_sym = [n for n in saved_nodes if not isinstance(n.meta.get("val"), torch.Tensor)]
    forward, extracted = extract_forward_backward(
        work, saved_values, saved_sym, num_fwd_outputs=num_fwd_outputs)
    recomputed = set(clones.values()) | {c for made in earlier.values() for c in made}
    shared = dict(
        forward=forward, saved=tuple(n.name for n in saved_sym + saved_values),
        rng_states=tuple(n.name for n in states),
        rng_state_bytes={n.name: _storage_nbytes(n.meta.get("val")) for n in states},
        clones=clones, earlier=earlier)
    made, seen = [], []
    for count, sink in enumerate(orders, 1):
        # The extracted graph is this rewrite's own: the last order is
        # scheduled in it, the others in copies.
        order = _just_in_time_order(extracted.graph, recomputed, sink_growing=sink)
        names = [node.name for node in order]
        if names in seen:
            continue
        seen.append(names)
        if count < len(orders):
            backward = lazy_graph_module(extracted, _copied_in_order(order))
        else:
            _reorder_in_place(extracted.graph, order)
            extracted.recompile()
            backward = extracted
        made.append(Rewritten(backward=backward, **shared))
    return made


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
                     ) -> tuple[dict[str, str], dict[str, tuple[str, ...]], list[fx.Node]]:
    """Clone recomputed values in front of the backward; return the names of
    their last copies (reloads of offloaded values among them), of the
    earlier copies of values recomputed more than once, and the RNG-state
    nodes forward must now save. Backward reads an offloaded value through
    its reload."""
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
    copies, states = _emit_copies(graph, profile, order, dict(decision.copy_steps), clone_of,
                                  before=first_backward)
    at = _backward_steps(profile)
    last = {**clone_of, **{value: made[-1][1] for value, made in copies.items()}}
    for node in list(graph.nodes):
        if node.op == "output" or profile.nodes.get(node.name, None) is None:
            continue
        if profile.nodes[node.name].phase == BACKWARD:
            step = at[node.name]
            for original in [i for i in node.all_input_nodes if i in last]:
                node.replace_input_with(original, _pick(original, step, copies, clone_of))
    _point_backward_outputs_at_clones(graph, num_fwd_outputs, last)
    clone_names = {orig.name: c.name for orig, c in last.items()}
    earlier = {orig.name: tuple(c.name for _, c in made[:-1])
               for orig, made in copies.items() if len(made) > 1}
    return clone_names, earlier, states


def _backward_steps(profile: Profile) -> dict[str, int]:
    """Each backward node's index among backward nodes, in graph order: the
    steps Decision.copy_steps names."""
    backward = [name for name, node in profile.nodes.items() if node.phase == BACKWARD]
    return {name: k for k, name in enumerate(backward)}


def _pick(value: fx.Node, step: float, copies, clone_of) -> fx.Node:
    """What a reader needing ``value`` at backward ``step`` reads: the last
    copy begun by then (the one clone, or a reload, for other values)."""
    if value not in copies:
        return clone_of.get(value, value)
    made = copies[value]
    starts = [start for start, _ in made]
    return made[max(bisect.bisect_right(starts, step) - 1, 0)][1]


def _emit_copies(graph: fx.Graph, profile: Profile, order: list[fx.Node], again: dict,
                 clone_of: dict[fx.Node, fx.Node], *, before: fx.Node):
    """Clone each recomputed node in front of ``before``, once, or once per
    step range where ``again`` names steps for it. Returns value -> [(first
    step served, copy)], and the generator states forward must save. A copy
    reads, of each input, the copy serving the step it starts at, so that
    the schedule can free an earlier copy once its readers ran. All copies
    of a random op replay the one saved state: they are equal."""
    need = _first_needs(profile, order)
    # Read once (finding it reads every node).
    fake_mode = fake_mode_of(graph) if order else None
    copies: dict[fx.Node, list[tuple[float, fx.Node]]] = {}
    states: list[fx.Node] = []
    for node in order:
        starts = [need[node], *(s for s in again.get(node.name, ()) if s > need[node])]
        # Read before a random op is replaced in forward (which clears them).
        node_args, node_kwargs = node.args, node.kwargs
        made = []
        with graph.inserting_before(before):
            state = forward_value = None
            if profile.nodes[node.name].is_random:
                state, forward_value = rng.save_rng_state_in_forward(graph, node,
                                                                     fake_mode=fake_mode)
                states.append(state)
            for j, start in enumerate(starts):
                args, kwargs = fx.node.map_arg(
                    (node_args, node_kwargs), lambda a: _pick(a, start, copies, clone_of))
                name = recomputed_name(node.name) if j == len(starts) - 1 \
                    else copy_recomputed_name(node.name, j)
                if state is not None:
                    clone = rng.replay_call(graph, node, state, args, kwargs, name)
                else:
                    clone = graph.create_node(node.op, node.target, args, kwargs, name=name)
                # Every copy is an allocation of its own (or a view of its
                # inputs' copies), never the original's storage: a view of
                # the original that forward saved keeps that storage alive.
                clone.meta = {**node.meta, "val": _fresh_value(fake_mode, node, args, kwargs)}
                made.append((start, clone))
        # Forward users of a random op now read ``forward_value``; clones of
        # them must read the replay instead.
        for original in (node, forward_value) if forward_value is not None else (node,):
            copies[original] = made
    return copies, states


def _first_needs(profile: Profile, order: list[fx.Node]) -> dict[fx.Node, float]:
    """The first backward step needing each recomputed node: reading it, or
    a recomputed node that backward needs (then its first copy is made)."""
    recomputed = set(order)
    at = _backward_steps(profile)
    end = len(at)
    need = {node: min((at[u.name] for u in node.users if u.name in at), default=end)
            for node in order}
    for node in reversed(order):
        for user in node.users:
            if user in recomputed:
                need[node] = min(need[node], need[user])
    return need


def _fresh_value(fake_mode, node: fx.Node, args, kwargs):
    """``node``'s value computed again from the values of ``args``: new
    storages, and views of its inputs' storages where the op is a view."""
    def value(a):
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    args, kwargs = fx.node.map_arg((args, kwargs), value)
    try:
        with fake_mode:
            return node.target(*args, **kwargs)
    except Exception:  # an op fake tensors cannot run: a fresh allocation
        with fake_mode:
            return pytree.tree_map_only(
                torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                            device=t.device),
                node.meta.get("val"))


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


def _just_in_time_order(graph: fx.Graph, recomputed: set[str], *,
                        sink_growing: bool = True) -> list[fx.Node]:
    """The graph's nodes in the order to run them: each recomputed node right
    before its first user, and nodes nothing uses left out (a random op is
    left out too: backward must not draw numbers nobody reads).

    A backward node that allocates more than its inputs hold together (a
    matmul whose output is a sequence-by-sequence gradient) runs right
    before its first user too, after that user's other inputs: moved later,
    it never raises the memory live in between, and it no longer holds its
    output while the recomputes before its user run.

    The elements of a node that returns several tensors are taken out right
    after it: the tuple holds every element alive until its last element is
    taken, so an element taken just in time would keep its siblings alive
    until then (a recomputed dropout's output, held until the backward op
    that reads its mask)."""
    needed = _live_nodes(graph)
    grown = _grown(graph, recomputed) if sink_growing else set()
    lazy = set(recomputed) | grown
    placed: set[fx.Node] = set()
    order: list[fx.Node] = []

    def emit(node: fx.Node) -> None:
        if node in placed:
            return
        # A grown input last: it is not held while recomputes run.
        for arg in sorted(node.all_input_nodes, key=lambda a: a.name in grown):
            emit(arg)
        placed.add(node)
        order.append(node)
        for user in node.users:
            if user.target is operator.getitem and user in needed:
                emit(user)

    for node in graph.nodes:
        if node.op == "placeholder" or (node in needed and node.name not in lazy):
            emit(node)
    # An element reached again while its node was being placed (through
    # the node's other elements) is listed twice: it runs where listed last.
    last = {node: position for position, node in enumerate(order)}
    return [node for position, node in enumerate(order) if last[node] == position]


def _copied_in_order(order: list[fx.Node]) -> fx.Graph:
    """A new graph of copies of ``order``'s nodes, in that order."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in order:
        env[node] = graph.node_copy(node, lambda a: env[a])
    return graph


def _reorder_in_place(graph: fx.Graph, order: list[fx.Node]) -> None:
    """``graph`` holding ``order``'s nodes, in that order (the same nodes,
    names and code as ``_copied_in_order``), its other nodes erased. On a
    58-layer GPT's backward, 6,620 nodes neither copied nor left as garbage
    for Python's cyclic collector."""
    kept = set(order)
    for node in reversed(graph.nodes):
        if node not in kept:
            graph.erase_node(node)
    output = graph.output_node()
    for node in order:
        if node is not output:
            output.prepend(node)


def _grown(graph: fx.Graph, recomputed: set[str]) -> set[str]:
    """Names of the backward nodes that grow memory (memory.grows_memory),
    and of views of them (a view emitted early would hold its base): they
    wait for a user."""
    grown: set[str] = set()
    storages, impure = StorageMemo(), Impurity()
    for node in graph.nodes:
        if node.op != "call_function" or node.name in recomputed \
                or impure(node, impure_random=False):
            continue
        made, held = allocation(node, storages)
        if made > held or (made == 0 and any(
                arg.name in grown for arg in node.all_input_nodes)):
            grown.add(node.name)
    return grown


def _live_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes the output needs, plus real side effects (random draws excluded)."""
    live: set[fx.Node] = set()
    impure = Impurity()
    stack = [n for n in graph.nodes
             if n.op == "output" or (n.op == "call_function" and impure(n, impure_random=False))]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    return live

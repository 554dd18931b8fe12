"""The runtime-optimal plan: fewest saved bytes without recomputing anything
costly, as a minimum s-t cut.

Each forward value v is an edge v_in -> v_out whose capacity is the bytes that
saving v keeps alive. Data edges u_out -> v_in and the edges tying values to
the source (must run in forward) and to the sink (backward reads it) are
infinite. A finite cut separates what runs in forward from what backward
recomputes; the values on cut edges are the ones saved.
"""

from __future__ import annotations

import time

import networkx as nx
from torch.utils.checkpoint import CheckpointPolicy

from ..errors import PolicyError
from ..types import Decision, Profile, Tag
from .common import recompute_closure

SOURCE, SINK = "__source__", "__sink__"
# Saving a value a default tag would rather recompute costs a hair more than
# its bytes, so among cuts of equal bytes the one that recomputes it wins.
_PREFER_RECOMPUTE_PENALTY = 1.001


def solve_mincut(profile: Profile, tags: dict[str, Tag]) -> Decision:
    start = time.perf_counter()
    graph = nx.DiGraph()
    for node in profile.forward_nodes():
        tag = tags[node.name]
        policy = tag.policy
        node_in, node_out = ("in", node.name), ("out", node.name)
        capacity = _save_capacity(profile, node, tag)
        if capacity is None:
            graph.add_edge(node_in, node_out)            # never saved
        else:
            graph.add_edge(node_in, node_out, capacity=capacity)
        if node.is_input or policy in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE):
            graph.add_edge(SOURCE, node_in)              # never recomputed
        elif node.replay_bytes:
            # Recomputing a random op (node_in on the sink side) saves its
            # generator state: cutting this edge charges those bytes.
            graph.add_edge(SOURCE, node_in, capacity=float(node.replay_bytes))
        if node.name in profile.needed_by_backward:
            graph.add_edge(node_out, SINK)
        for name in node.inputs:
            graph.add_edge(("out", name), node_in)
    if SINK not in graph:
        return Decision(frozenset(), frozenset(), "mincut", time.perf_counter() - start)
    graph.add_node(SOURCE)
    try:
        _, (reachable, _) = nx.minimum_cut(graph, SOURCE, SINK)
    except nx.NetworkXUnbounded:
        raise PolicyError(
            "the tags leave no feasible plan: some value backward needs may "
            "neither be saved nor recomputed. Check MUST_RECOMPUTE policies on "
            "values whose inputs cannot be recomputed either.") from None
    saved = frozenset(
        node.name for node in profile.forward_nodes()
        if ("in", node.name) in reachable and ("out", node.name) not in reachable)
    recomputed = recompute_closure(profile, saved)
    return Decision(saved=saved, recomputed=recomputed, solver="mincut",
                    solve_seconds=time.perf_counter() - start, gap=0.0)


def _save_capacity(profile: Profile, node, tag: Tag) -> float | None:
    """Bytes kept alive by saving ``node``; None where it cannot be saved."""
    if not node.is_tensor:
        return 1.0 if node.is_symbolic else None
    if tag.policy == CheckpointPolicy.MUST_RECOMPUTE or node.is_mutated_input:
        return None
    if tag.policy == CheckpointPolicy.PREFER_RECOMPUTE and tag.origin != "default":
        return None
    owner = profile.nodes[node.storage]
    size = 0.0 if owner.is_static else float(owner.bytes)
    if tag.policy == CheckpointPolicy.PREFER_RECOMPUTE:
        return size * _PREFER_RECOMPUTE_PENALTY + 1.0
    return size

"""Part of the adapter (problem.py): what torch's min-cut partitioner
(functorch's partitioners) knows of each forward value, as arrays, so
that a reference strategy can plan as torch.compile does without a graph.

Torch's partitioner saves the values of a minimum cut in which a value
costs its size times 1.1 to the power of its distance from backward
(doubled where all its users fuse with it) to save, and nothing to
recompute, unless a rule bans recomputing it: graph inputs, ops off its
allowlist, values backward must materialise anyway, reductions. This module
computes those numbers and the rules that do not depend on checkpoint tags;
solve/partitioner.py applies the ones that do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fxckpt.compat.aot import functorch_config
from fxckpt.types import BACKWARD, NodeProfile, Profile, RematKind

_FAR = 10**9          # distance from backward of a value backward never reaches
_MAX_DISTANCE = 100   # distances beyond this weigh as this


@dataclass(frozen=True)
class RematClasses:
    weight: np.ndarray        # save weight (inf: cannot be saved)
    banned: np.ndarray        # recompute banned whatever the tags
    tag_bans: np.ndarray      # a MUST_SAVE tag bans recomputing it
    view: np.ndarray          # never banned
    required: np.ndarray      # forward outputs need it
    order: np.ndarray         # position among required values (-1: not required)
    users: tuple[np.ndarray, ...]   # required users of each value
    fuses: tuple[np.ndarray, ...]   # whether the value fuses with each of those users


def kind(node: NodeProfile) -> RematKind:
    """The node's classes, or for a profile made without them, the nearest
    the other fields give."""
    if node.remat is not None:
        return node.remat
    return RematKind(view=node.is_view, fusible=node.is_pointwise or node.is_view,
                     allowed=node.recomputable and not node.is_compute_intensive
                     and not node.is_random, bytes=node.bytes)


def remat_classes(profile: Profile, index: dict[str, int]) -> RematClasses:
    nodes = list(profile.nodes.values())
    kinds = {node.name: kind(node) for node in nodes}
    users: dict[str, list[str]] = {node.name: [] for node in nodes}
    for node in nodes:
        for parent in dict.fromkeys(node.inputs):
            users[parent].append(node.name)

    def fuses(a: str, b: str) -> bool:
        return kinds[b].fuses_inputs or (kinds[a].fusible and kinds[b].fusible)

    required = _required(profile)
    distance = _distance(nodes, users, required)
    rules = _Rules.read()
    n = len(index)
    weight, banned = np.zeros(n), np.zeros(n, dtype=bool)
    tag_bans, view = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for name, i in index.items():
        node, k = profile.nodes[name], kinds[name]
        materialized = node.is_input or not all(fuses(name, u) for u in users[name])
        weight[i] = _weight(node, k, distance[name], materialized, rules)
        called = not node.is_input and node.op != "constant" and not k.getitem
        tag_bans[i] = name in required and called
        banned[i] = node.is_input or (tag_bans[i] and _banned(
            node, k, _materialized_in_backward(name, kinds, users, required, fuses), rules))
        view[i] = k.view
    order = np.full(n, -1)
    ranked = [index[name] for name in profile.nodes if name in required and name in index]
    order[ranked] = np.arange(len(ranked))
    fw_users = tuple(np.array([index[u] for u in users[name] if u in required], dtype=np.int64)
                     for name in index)
    fw_fuses = tuple(np.array([fuses(name, u) for u in users[name] if u in required], dtype=bool)
                     for name in index)
    return RematClasses(weight=weight, banned=banned, tag_bans=tag_bans, view=view,
                        required=np.array([name in required for name in index]),
                        order=order, users=fw_users, fuses=fw_fuses)


def _required(profile: Profile) -> set[str]:
    """Values the forward outputs need (from the graph's inputs)."""
    required: set[str] = set()
    stack = [name for name in profile.forward_outputs if name in profile.nodes]
    while stack:
        name = stack.pop()
        if name in required or profile.nodes[name].phase == BACKWARD:
            continue
        required.add(name)
        stack.extend(profile.nodes[name].inputs)
    return required


def _distance(nodes, users, required) -> dict[str, int]:
    """Steps from each required value to the nearest value outside the
    forward (0 for those)."""
    distance: dict[str, int] = {}
    for node in reversed(nodes):
        if node.name not in required:
            distance[node.name] = 0
        else:
            distance[node.name] = min([distance[u] + 1 for u in users[node.name]] + [_FAR])
    return distance


@dataclass(frozen=True)
class _Rules:
    """The settings of torch's partitioner the classes follow, read once
    per graph (each read of torch's config goes through its module's
    attribute hook: thousands per graph)."""

    parameters_free: bool
    allowlist: bool
    materialized_backward: bool
    reductions: bool

    @staticmethod
    def read() -> "_Rules":
        return _Rules(
            parameters_free=bool(functorch_config.treat_parameters_as_free_to_save),
            allowlist=bool(functorch_config.ban_recompute_not_in_allowlist),
            materialized_backward=bool(functorch_config.ban_recompute_materialized_backward),
            reductions=bool(functorch_config.ban_recompute_reductions))


def _weight(node: NodeProfile, k: RematKind, distance: int, materialized: bool,
            rules: _Rules) -> float:
    if node.is_static and rules.parameters_free:
        return 0.0
    if node.is_symbolic:
        return float(k.bytes)
    if not node.is_tensor:
        return np.inf
    scaled = int(k.bytes * 1.1 ** max(min(distance, _MAX_DISTANCE), 1))
    return float(scaled if materialized else 2 * scaled)


def _banned(node: NodeProfile, k: RematKind, materialized_in_backward: bool,
            rules: _Rules) -> bool:
    """The partitioner's rules that ban recomputing a required value, tags aside."""
    if rules.allowlist:
        if not k.allowed:
            return True
    elif node.is_random or node.is_compute_intensive or not node.recomputable:
        return True
    if rules.materialized_backward and materialized_in_backward:
        return True
    return bool(rules.reductions and k.reduction)


def _materialized_in_backward(name, kinds, users, required, fuses) -> bool:
    """Some op outside the forward reads it (or a view of it) without fusing."""
    if kinds[name].view:
        return False
    pending = [name]
    while pending:
        current = pending.pop()
        for user in users[current]:
            if user not in required and not fuses(current, user):
                return True
            if kinds[user].view:
                pending.append(user)
    return False

"""Profile + graph annotations + policy -> Tags, one per forward value.

Precedence, strongest first:
1. what the op allows: a value that cannot be recomputed is MUST_SAVE;
2. ``torch.utils.checkpoint`` regions in the model (``node.meta["recompute"]``),
   the user's explicit choice in code;
3. the ``policy`` option;
4. defaults: views and cheap pointwise ops prefer recompute, matmuls,
   convolutions and attention prefer save, everything else is the solver's call.

A MUST_RECOMPUTE that cannot be honoured raises, naming the node and its source
line; a PREFER_RECOMPUTE that cannot is turned into MUST_SAVE with the reason.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..errors import PolicyError
from ..types import FORWARD, NodeProfile, Profile, Tag

# A resolved policy: called once per forward value with its profile and the
# node's op; answers a CheckpointPolicy or None (no opinion).
NodePolicy = Callable[[NodeProfile, object], Optional[CheckpointPolicy]]

_RECOMPUTE = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def region_annotations(joint: fx.GraphModule) -> dict[str, CheckpointPolicy]:
    """Policies left on the joint graph by checkpoint regions in the model."""
    found = {}
    for node in joint.graph.nodes:
        policy = node.meta.get("recompute")
        if isinstance(policy, CheckpointPolicy):
            found[node.name] = policy
    return found


def tag_forward_values(profile: Profile, *, regions: dict[str, CheckpointPolicy],
                       policy: NodePolicy | None = None,
                       targets: dict[str, object] | None = None) -> dict[str, Tag]:
    """Tag every forward value. ``targets`` maps node name to its op, for policies."""
    tags: dict[str, Tag] = {}
    for node in profile.forward_nodes():
        tags[node.name] = _tag_one(node, regions.get(node.name), policy,
                                   (targets or {}).get(node.name))
    return tags


def _tag_one(node: NodeProfile, region: CheckpointPolicy | None,
             policy: NodePolicy | None, target: object) -> Tag:
    wanted: Tag | None = None
    if region is not None:
        wanted = Tag(region, "torch.utils.checkpoint region in the model", "region")
    elif policy is not None:
        answer = policy(node, target)
        if answer is not None:
            wanted = Tag(answer, "policy", "policy")
    if not node.recomputable:
        if wanted is not None and wanted.policy == CheckpointPolicy.MUST_RECOMPUTE:
            raise PolicyError(
                f"{wanted.reason} asks to recompute {node.name} ({node.op}), which "
                f"cannot be recomputed: it is a {node.not_recomputable}"
                + (f" [{node.source}]" if node.source else "")
                + ". Save it instead (MUST_SAVE / PREFER_SAVE) or move it out of "
                "the recomputed region.")
        reason = f"cannot be recomputed: {node.not_recomputable}"
        if wanted is not None and wanted.policy in _RECOMPUTE:
            reason += f" (overrides {wanted.reason}: {wanted.policy.name})"
        return Tag(CheckpointPolicy.MUST_SAVE, reason, "op")
    if wanted is not None:
        return wanted
    return _default(node)


def _default(node: NodeProfile) -> Tag:
    if node.is_view:
        return Tag(CheckpointPolicy.PREFER_RECOMPUTE, "view: recomputing it is free")
    if node.op.startswith("getitem"):
        return Tag(None, "element of a multi-output op")
    if node.is_compute_intensive:
        return Tag(CheckpointPolicy.PREFER_SAVE, "matmul/conv/attention: costly to recompute")
    if node.is_random:
        return Tag(None, "random op: recompute replays its RNG state")
    if node.is_pointwise:
        return Tag(CheckpointPolicy.PREFER_RECOMPUTE, "cheap pointwise op")
    return Tag(None, "default: the solver decides")

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

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..errors import PolicyError
from ..policy_api import OpCall, PolicyFactory
from ..types import NodeProfile, Profile, Tag

_RECOMPUTE = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def tag_forward_values(joint: fx.GraphModule, profile: Profile, *,
                       policy: PolicyFactory | None = None) -> dict[str, Tag]:
    """Tag every forward value of ``joint``. Does not modify the graph."""
    decide = policy.for_graph() if policy is not None else None
    nodes = {n.name: n for n in joint.graph.nodes}
    tags: dict[str, Tag] = {}
    for info in profile.forward_nodes():
        node = nodes[info.name]
        region = node.meta.get("recompute")
        region = region if isinstance(region, CheckpointPolicy) else None
        answer = None
        if decide is not None and node.op == "call_function":
            answer = decide(op_call(node, info))
        tags[info.name] = _tag_one(info, region, answer)
    return tags


def op_call(node: fx.Node, info: NodeProfile) -> OpCall:
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    return OpCall(name=node.name, op=node.target, args=tuple(args), kwargs=dict(kwargs),
                  module_path=info.module_path, source=info.source,
                  value_names=tuple(node.meta.get("fxckpt_names", ())),
                  profile=info)


def _tag_one(node: NodeProfile, region: CheckpointPolicy | None,
             answer: CheckpointPolicy | None) -> Tag:
    wanted: Tag | None = None
    if region is not None:
        wanted = Tag(region, "torch.utils.checkpoint region in the model", "region")
    elif answer is not None:
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

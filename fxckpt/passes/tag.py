"""Profile + graph annotations + policy -> Tags, one per forward value.

Precedence, strongest first:
1. what the op allows: a value that cannot be recomputed is MUST_SAVE;
2. ``torch.utils.checkpoint`` regions in the model (``node.meta["recompute"]``),
   the user's explicit choice in code; as in torch's partitioner, a value a
   region recomputes but a later region reads (two checkpointed blocks one
   after the other) is saved at that boundary, PREFER_SAVE: recomputing it
   would run the region before it again in the later one's backward;
3. the ``policy`` option;
4. defaults: views and cheap pointwise ops prefer recompute, matmuls,
   convolutions and attention prefer save, everything else is the solver's call.

A MUST_RECOMPUTE that cannot be honoured raises, naming the node and its source
line; a PREFER_RECOMPUTE that cannot is turned into MUST_SAVE with the reason.
A *_CPU_OFFLOAD answer stands for values on an offload device (CUDA); for
values already in host memory it becomes the matching *_SAVE, with the
answer kept in the reason and a one-time warning.

The policy is asked once per forward op in forward order (``ask_policy``), with
the names ``fxckpt.name`` left on the node that produced a value.
"""

from __future__ import annotations

import operator

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.compat.ops import HigherOrderOperator, OpOverload
from fxckpt.errors import PolicyError, warn_once
from fxckpt.passes.dropout import answered_by, original_call
from fxckpt.policies.api import OpCall, PolicyFactory, check_answer, finish
from fxckpt.types import NodeProfile, Origin, Profile, Tag
from fxckpt.ops import SEED_DRAW

P = CheckpointPolicy
_RECOMPUTE = (P.MUST_RECOMPUTE, P.PREFER_RECOMPUTE)
# What an offload answer becomes for a value already in host memory.
_OFFLOAD_AS_SAVE = {P.MUST_CPU_OFFLOAD: P.MUST_SAVE, P.PREFER_CPU_OFFLOAD: P.PREFER_SAVE}
# Devices whose values can be offloaded to host memory. On the host itself
# offload means nothing: it degrades to save.
OFFLOAD_DEVICES = frozenset({"cuda"})


def tag_forward_values(joint: fx.GraphModule, profile: Profile, *,
                       policy: PolicyFactory | None = None) -> dict[str, Tag]:
    """Tag every forward value of ``joint``. Does not modify the graph."""
    nodes = {n.name: n for n in joint.graph.nodes}
    answers = ask_policy(policy, nodes, profile) if policy is not None else {}
    asker = f"policy {policy!r}"
    tags: dict[str, Tag] = {}
    for info in profile.forward_nodes():
        node = nodes[info.name]
        region = _region(node)
        reason = _REGION
        if region in _RECOMPUTE and _read_by_a_later_region(node):
            region, reason = P.PREFER_SAVE, _BOUNDARY
        tags[info.name] = _tag_one(info, region, answers.get(info.name), asker, reason)
    return tags


_REGION = "torch.utils.checkpoint region in the model"
_BOUNDARY = ("torch.utils.checkpoint region's output that the next region reads (saved at "
             "the boundary, as torch does)")


def _region(node: fx.Node) -> CheckpointPolicy | None:
    region = node.meta.get("recompute")
    return region if isinstance(region, CheckpointPolicy) else None


def _read_by_a_later_region(node: fx.Node) -> bool:
    """Whether a region after ``node``'s own (a higher ``ac_graph_id``)
    recomputes a reader of it: torch's partitioner saves such a value
    (cleanup_recompute_tags) rather than recompute both regions in the
    later one's backward."""
    own = node.meta.get("ac_graph_id")
    if own is None:
        return False
    return any(_region(user) in _RECOMPUTE and user.meta.get("ac_graph_id") is not None
               and user.meta["ac_graph_id"] > own for user in node.users)


def ask_policy(policy: PolicyFactory, nodes: dict[str, fx.Node],
               profile: Profile) -> dict[str, CheckpointPolicy | None]:
    """The policy's answer for every forward op, in forward order, with the
    decider's revisions applied. Ops are what torch's selective checkpointing
    would show it (OpOverloads and higher-order ops); an element of a
    multi-output op takes the op's answer, and so does the mask of a host
    dropout split for planning (asked about as the ``native_dropout`` it was)."""
    decide = policy.for_graph()
    answers: dict[str, CheckpointPolicy | None] = {}
    elements = []
    for info in profile.forward_nodes():
        node = nodes[info.name]
        if _answered_by(node) is not None:
            elements.append(node)
        elif isinstance(node.target, (OpOverload, HigherOrderOperator)):
            answers[node.name] = decide(op_call(node, info))
    answers.update(finish(decide))
    for name, answer in answers.items():
        check_answer(answer, what=f"policy {policy!r}, {name} ({_asked_op(nodes[name])})")
    for node in elements:
        answers[node.name] = answers.get(_answered_by(node))
    return answers


def op_call(node: fx.Node, info: NodeProfile) -> OpCall:
    """What the policy is shown of ``node``: its op call, or for the output
    of a split host dropout (passes/dropout.py) the ``native_dropout`` call
    it stands for, output and mask together."""
    call = original_call(node)
    op, args, kwargs = call or (node.target, node.args, node.kwargs)
    read: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), read.append)
    args, kwargs = fx.node.map_arg((args, kwargs), lambda a: a.meta.get("val"))
    output = node.meta.get("val")
    if call is not None:
        mask = next(u for u in node.all_input_nodes if answered_by(u) == node.name)
        output = (output, mask.meta.get("val"))
    inputs = tuple(dict.fromkeys((_element_of(i) or i).name for i in read))
    return OpCall(name=node.name, op=op, args=tuple(args), kwargs=dict(kwargs),
                  module_path=info.module_path, source=info.source,
                  value_names=_value_names(node), profile=info, output=output, inputs=inputs)


def _answered_by(node: fx.Node) -> str | None:
    """The node whose answer ``node`` takes: the op it is an element of, or
    the output of the split dropout it is the mask of."""
    element_of = _element_of(node)
    return element_of.name if element_of is not None else answered_by(node)


def _asked_op(node: fx.Node):
    return (original_call(node) or (node.target,))[0]


def _element_of(node: fx.Node) -> fx.Node | None:
    """The multi-output op ``node`` takes an element of, if it does."""
    if node.op == "call_function" and node.target is operator.getitem \
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "call_function":
        return node.args[0]
    return None


def _value_names(node: fx.Node) -> tuple[str, ...]:
    """Names ``fxckpt.name`` gave the op's value, or any element of it."""
    names = list(node.meta.get("fxckpt_names", ()))
    for user in node.users:
        if _element_of(user) is node:
            names += user.meta.get("fxckpt_names", ())
    return tuple(dict.fromkeys(names))


def _tag_one(node: NodeProfile, region: CheckpointPolicy | None,
             answer: CheckpointPolicy | None, asker: str = "policy",
             region_reason: str = _REGION) -> Tag:
    wanted: Tag | None = None
    if region is not None:
        wanted = Tag(region, region_reason, Origin.REGION)
    elif answer is not None:
        wanted = Tag(answer, asker, Origin.POLICY)
    if wanted is not None and wanted.policy in _OFFLOAD_AS_SAVE \
            and node.device not in OFFLOAD_DEVICES:
        wanted = _offload_as_save(wanted)
    if node.not_recomputable == SEED_DRAW:
        # A policy asking to recompute a random op is served by recomputing the
        # inductor_random ops from the saved seeds, so no request is refused.
        return Tag(CheckpointPolicy.MUST_SAVE, SEED_DRAW, Origin.OP)
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
        if wanted is not None and wanted.policy in _OFFLOAD_AS_SAVE:
            return Tag(P.MUST_CPU_OFFLOAD, f"{reason}; offloaded as {wanted.reason} asks",
                       Origin.OP)
        return Tag(CheckpointPolicy.MUST_SAVE, reason, Origin.OP)
    if wanted is not None:
        return wanted
    return _default(node)


def _offload_as_save(wanted: Tag) -> Tag:
    warn_once("offload on host", "CPU offload asked for values that already live in host "
              "memory: they are saved where they are (offload degrades to save on CPU)",
              stacklevel=3)
    return Tag(_OFFLOAD_AS_SAVE[wanted.policy],
               f"{wanted.reason}: {wanted.policy.name}; offload degrades to save on CPU",
               wanted.origin)


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

"""A policy as torch's selective checkpointing reads it, for the regions
torch itself traces: ``fxckpt.checkpoint`` under ``torch.compile`` becomes a
``torch.utils.checkpoint`` region whose ``context_fn`` is ``contexts_for``.

torch asks a ``policy_fn(ctx, op, *args, **kwargs)`` once per op of the
region's forward and again while tracing its recomputation
(``ctx.is_recompute``); each gets a decider of its own from the policy, so
counting policies count the same ops both times. What the policy leaves
unanswered, or defers, is recomputed (the region's default). torch acts on
each answer at once, so revisions (``policies.api.finish``) are not applied:
the first answers are safe. Offload answers keep the tensor in place, as
``fxckpt.checkpoint`` does eagerly.
"""

from __future__ import annotations

from typing import Callable

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from fxckpt.policies.api import DEFER, P, OpCall, PolicyFactory
from fxckpt.policies.resolve import resolve_policy

_IN_PLACE = {P.MUST_CPU_OFFLOAD: P.MUST_SAVE, P.PREFER_CPU_OFFLOAD: P.PREFER_SAVE}


def contexts_for(policy) -> tuple:
    """(forward context, recomputation context) following ``policy`` (anything
    ``resolve_policy`` accepts), made afresh for every region torch traces."""
    return create_selective_checkpoint_contexts(policy_fn_for(resolve_policy(policy)))


def policy_fn_for(factory: PolicyFactory) -> Callable:
    """torch's ``policy_fn`` asking deciders of ``factory``."""
    deciders: dict[bool, Callable] = {}
    counts: dict[bool, int] = {}

    def policy_fn(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        phase = bool(ctx.is_recompute)
        decide = deciders.get(phase)
        if decide is None:
            decide = deciders[phase] = factory.for_graph()
        index = counts[phase] = counts.get(phase, -1) + 1
        answer = decide(OpCall(name=str(index), op=op, args=args, kwargs=kwargs,
                               output=getattr(ctx, "op_output", None)))
        if answer is None or answer is DEFER:
            return P.PREFER_RECOMPUTE
        return _IN_PLACE.get(answer, answer)

    return policy_fn

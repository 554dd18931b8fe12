"""The contract between policies and the stages that ask them.

A policy is asked once per forward op, in forward order, with an ``OpCall``;
it answers a ``CheckpointPolicy`` or None (no opinion). The graph path asks
with fake tensors as arguments, the eager path (``fxckpt.checkpoint``) with
real ones. Policies that count (every n-th matmul) keep their count in the
decider returned by ``for_graph``, so each graph starts afresh.

A decider may also have a ``finish()`` method, called once after the last op:
it returns answers that replace earlier ones, by ``OpCall.name``, for policies
that can only tell what an op was once they have seen what came after it
(the matmul that feeds a softmax is attention's score matmul). The graph path
applies them; a caller that must act on each answer at once may ignore them,
since the first answers are always safe to follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from torch.utils.checkpoint import CheckpointPolicy

Decider = Callable[["OpCall"], Optional[CheckpointPolicy]]


@dataclass(frozen=True)
class OpCall:
    name: str                    # node name (graph path) or a running index (eager path)
    op: Any                      # usually a torch OpOverload
    args: tuple
    kwargs: dict
    module_path: str = ""        # "blocks.0.attn", from nn_module_stack
    source: str = ""             # "file.py:12 code"
    value_names: tuple[str, ...] = ()   # names given with fxckpt.name(...)
    profile: Any = field(default=None, compare=False)  # NodeProfile on the graph path
    # What the op returned (torch's SelectiveCheckpointContext.op_output); None
    # where the caller asks before running the op.
    output: Any = field(default=None, compare=False)
    # The names of the calls that produced this op's tensor arguments, where
    # the caller knows them (an element of a multi-output op is named by the op).
    inputs: tuple[str, ...] = ()


class PolicyFactory(Protocol):
    def for_graph(self) -> Decider: ...


def finish(decide: Decider) -> Mapping[str, Optional[CheckpointPolicy]]:
    """The revised answers of ``decide`` (see the module docstring); {} if none."""
    revise = getattr(decide, "finish", None)
    return revise() if revise is not None else {}

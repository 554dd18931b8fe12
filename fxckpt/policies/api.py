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

from fxckpt.errors import PolicyError

Decider = Callable[["OpCall"], Optional[CheckpointPolicy]]
P = CheckpointPolicy


class _Defer:
    """The answer that hands an op back to the planner's defaults."""

    def __repr__(self) -> str:
        return "DEFER"


DEFER = _Defer()
Answer = Optional["CheckpointPolicy | _Defer"]


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


class Policy:
    """Base of the vocabulary. Subclasses are frozen dataclasses; stateless ones
    answer in ``__call__``, stateful ones override ``for_graph``."""

    def __call__(self, call: OpCall) -> Answer:
        raise NotImplementedError

    def for_graph(self):
        return self


def as_checkpoint_policy(answer, call: OpCall, fn=None) -> CheckpointPolicy:
    """A policy function's answer as torch reads it: True is MUST_SAVE, False
    PREFER_RECOMPUTE; anything but a bool or a CheckpointPolicy is an error."""
    if isinstance(answer, CheckpointPolicy):
        return answer
    if isinstance(answer, bool):
        return P.MUST_SAVE if answer else P.PREFER_RECOMPUTE
    hint = " (did it miss a return statement?)" if answer is None else ""
    who = getattr(fn, "__qualname__", "the policy function")
    raise TypeError(
        f"{who} returned {answer!r}{hint} for op {call.op} ({call.name}"
        + (f", {call.source}" if call.source else "") + "); a policy function "
        "must return a torch.utils.checkpoint.CheckpointPolicy or a bool "
        "(True: MUST_SAVE, False: PREFER_RECOMPUTE)")


def check_answer(answer, *, what: str) -> Optional[CheckpointPolicy]:
    """A decider's answer, or PolicyError saying ``what`` was answered wrongly:
    a decider answers a CheckpointPolicy or None."""
    if answer is not None and not isinstance(answer, CheckpointPolicy):
        raise PolicyError(f"{what}: the policy answered {answer!r}; a policy answers a "
                          "torch.utils.checkpoint.CheckpointPolicy or None")
    return answer

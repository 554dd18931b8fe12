"""What users pass as ``policy=`` -> a factory of per-graph deciders.

A policy from the vocabulary (its unanswered ops are recomputed), a torch
selective-checkpoint function, a list of ops to save, or anything with a
``for_graph()``. Resolved once, in ``Options.create``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.utils.checkpoint import SAC_IGNORED_OPS, CheckpointPolicy

from fxckpt.compat.autograd import selective_context
from fxckpt.policies.api import (DEFER, P, Answer, Decider, OpCall, Policy, PolicyFactory,
                                 as_checkpoint_policy)
from fxckpt.policies.builtin import MappedDecider, must, save_ops
from fxckpt.policies.digest import function_text, policy_text

_ACCEPTED = (
    "policy= accepts a policy from fxckpt.policies (save_matmuls(), first(...), ...), "
    "a torch selective-checkpoint function policy_fn(ctx, op, *args, **kwargs) "
    "returning a CheckpointPolicy or a bool, or a list/tuple/set of ops to save "
    "(torch.ops.aten.mm.default, or a packet such as torch.ops.aten.mm)"
)


def resolve_policy(user_policy) -> PolicyFactory | None:
    """What a user passes as ``policy=`` -> a factory of per-graph deciders."""
    if user_policy is None:
        return None
    if isinstance(user_policy, type) and issubclass(user_policy, Policy):
        raise TypeError(f"policy={user_policy.__name__} is the policy class, not a policy: "
                        f"call it, policy={user_policy.__name__}(...)")
    if isinstance(user_policy, Policy):
        return _Resolved(user_policy)
    if hasattr(user_policy, "for_graph"):
        return user_policy
    if isinstance(user_policy, (list, tuple, set, frozenset)):
        # torch's create_selective_checkpoint_contexts(list): these MUST_SAVE,
        # everything else PREFER_RECOMPUTE.
        return _Resolved(must(save_ops(*user_policy)))
    if callable(user_policy):
        return _PolicyFunction(user_policy)
    raise TypeError(f"policy={user_policy!r} ({type(user_policy).__name__}) is not a "
                    f"policy: {_ACCEPTED}")


@dataclass(frozen=True)
class _Resolved:
    """The top of a policy: what it leaves unanswered is recomputed."""

    policy: Policy

    def for_graph(self) -> Decider:
        return MappedDecider(self.policy.for_graph(), _settle)

    def cache_text(self) -> str:
        """The policy written out for the plan cache's key, or Unkeyable
        (fxckpt/policies/digest.py)."""
        return "policy " + policy_text(self.policy)

    def __repr__(self) -> str:
        return repr(self.policy)


def _settle(answer: Answer) -> CheckpointPolicy | None:
    if answer is None:
        return P.PREFER_RECOMPUTE
    return None if answer is DEFER else answer


@dataclass(frozen=True)
class _PolicyFunction:
    """``policy_fn(ctx, op, *args, **kwargs)`` as torch's selective checkpointing
    calls it: once per forward op, ``ctx.is_recompute`` False (fxckpt asks only
    while planning the forward), ``ctx.op_output`` the op's (fake) output.
    State the function keeps (counters) lives on across graphs."""

    fn: Callable

    def for_graph(self) -> Decider:
        return self._decide

    def cache_text(self) -> str:
        """The function written out for the plan cache's key, or Unkeyable
        (fxckpt/policies/digest.py)."""
        return "policy function " + function_text(self.fn)

    def _decide(self, call: OpCall) -> CheckpointPolicy | None:
        if call.op in SAC_IGNORED_OPS:    # torch never shows these to policy_fn
            return None
        ctx = selective_context(is_recompute=False, op_output=call.output)
        return as_checkpoint_policy(self.fn(ctx, call.op, *call.args, **call.kwargs),
                                    call, self.fn)

    def __repr__(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

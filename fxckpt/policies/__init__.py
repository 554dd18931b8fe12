"""The policy vocabulary (builtin, attention), the contract between policies
and the stages that ask them (api), and what users may pass as ``policy=``
(resolve).

A policy is a small frozen value: it prints, hashes and compares. Asked about
one forward op (an ``OpCall``) it answers a ``CheckpointPolicy``, None (no
opinion: in ``first(...)`` the next policy answers) or ``DEFER`` (leave it to
the planner's defaults). What no part of a policy answers is recomputed, as in
torch's selective checkpointing: ``save_matmuls()`` saves matmuls and
recomputes the rest. ``PREFER_*`` answers are followed unless a memory budget
forces otherwise; ``MUST_*`` answers are never overridden.
"""

from fxckpt.policies.api import DEFER, Policy
from fxckpt.policies.builtin import (by_module, defaults, every_nth_matmul, first,
                                     megatron_selective, must, offload, recompute_all,
                                     recompute_ops, save_all, save_matmuls, save_names,
                                     save_ops)
from fxckpt.policies.resolve import resolve_policy
from fxckpt.ops import is_matmul_op as is_matmul

__all__ = [
    "Policy", "DEFER", "resolve_policy", "is_matmul", "save_all", "recompute_all", "defaults",
    "save_matmuls", "save_ops", "recompute_ops", "save_names", "by_module",
    "every_nth_matmul", "megatron_selective", "offload", "must", "first",
]

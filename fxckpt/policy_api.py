"""The contract between policies and the stages that ask them.

A policy is asked once per forward op, in forward order, with an ``OpCall``;
it answers a ``CheckpointPolicy`` or None (no opinion). The graph path asks
with fake tensors as arguments, the eager path (``fxckpt.checkpoint``) with
real ones. Policies that count (every n-th matmul) keep their count in the
decider returned by ``for_graph``, so each graph starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

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


class PolicyFactory(Protocol):
    def for_graph(self) -> Decider: ...

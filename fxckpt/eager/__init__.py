"""Checkpointing outside the compiler: ``fxckpt.checkpoint`` on saved-tensor
hooks (checkpoint, modes, state, tensors) and the graph-break fallback that
wraps what Dynamo could not capture (fallback)."""

from fxckpt.eager.checkpoint import checkpoint, checkpoint_sequential
from fxckpt.eager.modes import RecomputeMismatchError

__all__ = ["checkpoint", "checkpoint_sequential", "RecomputeMismatchError"]

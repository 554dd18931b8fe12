"""Values a plan under Inductor never saves: constant fills."""

from __future__ import annotations

import numpy as np

from fxckpt.types import Origin, Profile, Tag


def constant_fill(node, profile: Profile) -> bool:
    """A value made from no other value (``full``, ``scalar_tensor``,
    ``iota``): Inductor writes it into the code of each kernel that reads it,
    or fills a buffer where an extern kernel reads it. Saved, it is a buffer
    held from forward to the end of backward, and one that many backward
    kernels read: Inductor fuses kernels that share reads, so a saved zeros
    tensor read by every layer's softmax pulls the recomputation of one layer
    into the kernels of another, holding its values early."""
    return (not node.inputs and not node.is_input and node.recomputable
            and not node.is_random and node.is_tensor
            and node.name not in profile.forward_outputs
            and node.name not in profile.backward_outputs)


def default_constant_fills(profile: Profile, tags: dict[str, Tag], forward) -> np.ndarray:
    """Per forward value: a constant fill left to the defaults (a policy or
    a checkpoint region that tags it is followed)."""
    return np.array([tags[node.name].origin == Origin.DEFAULT and constant_fill(node, profile)
                     for node in forward], dtype=bool)

"""Reference strategies: save everything backward reads, or recompute all
that can be recomputed."""

from __future__ import annotations

import time

from torch.utils.checkpoint import CheckpointPolicy

from ..types import Decision, Profile, Tag
from .common import recompute_closure


def solve_save_all(profile: Profile, tags: dict[str, Tag]) -> Decision:
    start = time.perf_counter()
    saved = frozenset(name for name in profile.needed_by_backward
                      if tags[name].policy != CheckpointPolicy.MUST_RECOMPUTE
                      and _savable(profile, name))
    return Decision(saved, recompute_closure(profile, saved), "save_all",
                    time.perf_counter() - start)


def solve_recompute_all(profile: Profile, tags: dict[str, Tag]) -> Decision:
    """Save only what cannot be recomputed (inputs, MUST_SAVE values) and
    recompute everything else backward needs."""
    start = time.perf_counter()
    anchors = {n.name for n in profile.forward_nodes()
               if (n.is_input and not n.is_mutated_input)
               or tags[n.name].policy == CheckpointPolicy.MUST_SAVE}
    closure = recompute_closure(profile, frozenset(anchors))
    saved = frozenset(a for a in anchors if a in closure or a in profile.needed_by_backward
                      or any(a in profile.nodes[c].inputs for c in closure))
    saved = frozenset(s for s in saved if _savable(profile, s))
    return Decision(saved, recompute_closure(profile, saved), "recompute_all",
                    time.perf_counter() - start)


def _savable(profile: Profile, name: str) -> bool:
    node = profile.nodes[name]
    return (node.is_tensor or node.is_symbolic) and not node.is_mutated_input

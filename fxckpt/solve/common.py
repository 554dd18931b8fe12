"""Helpers every strategy shares."""

from __future__ import annotations

from ..types import Profile


def recompute_closure(profile: Profile, saved: frozenset[str]) -> frozenset[str]:
    """Forward values backward must recompute when only ``saved`` crosses over:
    everything it needs, walking inputs back until a saved value."""
    recomputed: set[str] = set()
    stack = [name for name in profile.needed_by_backward if name not in saved]
    while stack:
        name = stack.pop()
        if name in recomputed:
            continue
        recomputed.add(name)
        for parent in profile.nodes[name].inputs:
            if parent not in saved and parent not in recomputed:
                stack.append(parent)
    return frozenset(recomputed)


def run_in_forward(profile: Profile, saved: frozenset[str]) -> frozenset[str]:
    """Forward values the forward graph computes: what its outputs and the
    saved values depend on."""
    seen: set[str] = set()
    stack = [*profile.forward_outputs, *saved]
    while stack:
        name = stack.pop()
        if name in seen or name not in profile.nodes:
            continue
        seen.add(name)
        stack.extend(profile.nodes[name].inputs)
    return frozenset(seen)

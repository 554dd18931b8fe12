"""Helpers every strategy shares."""

from __future__ import annotations

from fxckpt.types import Profile


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

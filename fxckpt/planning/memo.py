"""Frontiers built in this process, reused when a graph is planned again.

A graph's trade-off frontier (solve/frontier) depends on the graph, its
tags and the options, never on the budget: the budget only selects from
it. So planning the same graph again at another budget selects from the
frontier built the first time instead of solving again. That happens
often: the step's re-plan after its first run gives each graph a new
budget; under Inductor a plan whose compiled code peaks over its budget is
planned again lower; ``fxckpt.explain`` at several budgets; a recompile
after ``torch.compiler.reset()``.

The memo keeps the last ``KEEP`` frontiers, keyed by a digest of the joint
graph's code, its profile, its tags and the options that shape a frontier
(solver, compiler, runs per step, offload bandwidth). It keeps numbers and
decisions only: each candidate's rewritten graphs are dropped (they belong
to the graph they were made from), so the plan chosen from a recalled
frontier is rewritten again for the graph at hand.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch.fx as fx

from fxckpt.memory.schedule import Simulated
from fxckpt.types import Profile, Tag

KEEP = 8


class FrontierMemo:
    """The last ``keep`` frontiers, by key (see ``frontier_key``)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._kept: OrderedDict[str, list] = OrderedDict()

    def recall(self, key: str) -> list | None:
        frontier = self._kept.get(key)
        if frontier is not None:
            self._kept.move_to_end(key)
        return frontier

    def remember(self, key: str, frontier: list) -> None:
        self._kept[key] = [_without_graphs(c) for c in frontier]
        self._kept.move_to_end(key)
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


FRONTIERS = FrontierMemo()


@dataclass(frozen=True)
class Recall:
    """Where one planning's frontier comes from: recalled from the process's
    memo under ``key``, or built and kept there (``key`` None: built, not
    kept). ``on_recall`` is called when it was recalled."""

    key: str | None
    on_recall: Callable[[bool], Any] | None = None

    def exact(self, exact: bool) -> "Recall":
        """Frontiers of the schedule model and of real rewrites apart."""
        key = None if self.key is None else f"{self.key}/{'exact' if exact else 'model'}"
        return replace(self, key=key)

    def frontier(self, build: Callable[[], list]) -> list:
        if self.key is None:
            return build()
        frontier = FRONTIERS.recall(self.key)
        if frontier is not None:
            if self.on_recall is not None:
                self.on_recall(True)
            return frontier
        frontier = build()
        FRONTIERS.remember(self.key, frontier)
        return frontier


def frontier_key(joint: fx.GraphModule, profile: Profile, tags: dict[str, Tag],
                 options) -> str:
    """What a graph's frontier depends on, as a digest: the joint graph's
    nodes (each one's name, op, target and arguments: what its code says,
    without generating the code, 0.25 s on a 58-layer GPT's 10,028 nodes),
    what profiling measured of each value, each value's tag, and the options
    other than the budget that shape the frontier."""
    digest = hashlib.sha256()
    for node in joint.graph.nodes:
        digest.update(f"{node.name}|{node.op}|{node.target}|{node.args}|{node.kwargs}\n".encode())
    for node in profile.nodes.values():
        digest.update(repr(node).encode())
    for name in sorted(tags):
        tag = tags[name]
        digest.update(f"{name}|{tag.policy}|{tag.origin}|{tag.reason}".encode())
    digest.update(repr((profile.needed_by_backward and sorted(profile.needed_by_backward),
                        profile.forward_outputs, profile.backward_outputs)).encode())
    digest.update(repr((options.solver, options.compiler, options.runs_per_step,
                        options.offload_bandwidth)).encode())
    return digest.hexdigest()


def _without_graphs(candidate):
    """The candidate with its rewritten graphs replaced by what the frontier
    reads of them (the generator-state bytes forward saves)."""
    rewritten = candidate.rewritten
    if isinstance(rewritten, Simulated):
        return candidate
    return replace(candidate, rewritten=Simulated(dict(rewritten.rng_state_bytes)))

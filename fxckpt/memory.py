"""The memory model: forward and backward schedules in, a peak and a timeline out.

Allocations are storages, so views cost nothing and share their base's
lifetime. A storage is allocated when the node producing it runs and freed
after the last node that reads it, unless it outlives the graph: forward
outputs (saved values and what the caller receives) and backward outputs
(gradients) stay alive to the end of the step. Graph inputs (parameters,
buffers, the batch) exist before the step and are not counted, matching a
measurement taken above the memory in use when the step starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef


@dataclass(frozen=True)
class MemoryTimeline:
    peak_bytes: int
    peak_at: str                                  # "forward:<node>" or "backward:<node>"
    points: tuple[tuple[str, str, int], ...]      # (phase, node, live bytes after it ran)


def simulate(forward: fx.Graph, backward: fx.Graph | None = None) -> MemoryTimeline:
    live: dict[StorageWeakRef, int] = {}
    not_counted = {ref for node in forward.find_nodes(op="placeholder")
                   for ref, _ in _storages(node)}
    state = _Walk(live, not_counted)
    state.run(forward, "forward", keep=_output_storages(forward))
    if backward is not None:
        for node in backward.find_nodes(op="placeholder"):
            state.allocate(node)        # saved values are live already; tangents are new
        state.run(backward, "backward", keep=_output_storages(backward))
    return MemoryTimeline(state.peak, state.peak_at, tuple(state.points))


class _Walk:
    def __init__(self, live, not_counted):
        self.live = live
        self.not_counted = not_counted
        self.peak, self.peak_at, self.points = 0, "", []

    def allocate(self, node: fx.Node) -> None:
        for ref, nbytes in _storages(node):
            if ref not in self.live and ref not in self.not_counted:
                self.live[ref] = nbytes

    def run(self, graph: fx.Graph, phase: str, *, keep: set) -> None:
        last_use = _last_uses(graph)
        for index, node in enumerate(graph.nodes):
            if node.op == "output":
                break
            self.allocate(node)
            total = sum(self.live.values())
            if total > self.peak:
                self.peak, self.peak_at = total, f"{phase}:{node.name}"
            for ref in [r for r, last in last_use.items() if last == index]:
                if ref not in keep:
                    self.live.pop(ref, None)
            self.points.append((phase, node.name, sum(self.live.values())))


def _storages(node: fx.Node) -> list[tuple[StorageWeakRef, int]]:
    found = []
    for val in pytree.tree_leaves(node.meta.get("val")):
        if isinstance(val, torch.Tensor):
            storage = val.untyped_storage()
            found.append((StorageWeakRef(storage), _concrete(storage.nbytes())))
    return found


def _concrete(x) -> int:
    if isinstance(x, torch.SymInt):
        return int(x.node.hint or 0)
    return int(x)


def _last_uses(graph: fx.Graph) -> dict[StorageWeakRef, int]:
    """Index of the last node reading each storage (its producer if none does)."""
    last: dict[StorageWeakRef, int] = {}
    for index, node in enumerate(graph.nodes):
        for ref, _ in _storages(node):
            last.setdefault(ref, index)
        for arg in node.all_input_nodes:
            for ref, _ in _storages(arg):
                last[ref] = index
    return last


def _output_storages(graph: fx.Graph) -> set[StorageWeakRef]:
    output = graph.output_node()
    return {ref for arg in output.all_input_nodes for ref, _ in _storages(arg)}

"""Dynamic shapes: a plan made for symbolic sizes, checked at the sizes it
runs with.

Dynamo compiles a graph with symbolic sizes (``dynamic=True``,
``mark_dynamic``, or automatically after a recompile) once, and the plan is
made at the sizes of the first call (the symbols' hints). The same graph
then runs at other sizes, where what it holds grows with them.

- ``SizesSeen``: a frame that turns dynamic after a recompile (Dynamo's
  automatic dynamic, say on a smaller last batch) is planned at the largest
  sizes its earlier graphs ran with, not at the call that made it dynamic:
  the memory model and the profile read sizes through ``memory.at_sizes``.
- ``SizeCheck`` binds the symbols to each call's sizes and reads the planned
  graphs' peak there with the memory model, before the graph runs; where the
  budget would be exceeded it raises BudgetError naming the sizes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from fxckpt.errors import BudgetError
from fxckpt.memory.model import simulate
from fxckpt.memory.values import at_sizes
from fxckpt.options import format_bytes


class SizeCheck:
    def __init__(self, gm: fx.GraphModule, graphs: tuple[fx.Graph, fx.Graph], *,
                 budget: int, planned_peak: int, fused: bool = False) -> None:
        self.sources = _symbol_sources(gm)
        self.graphs = graphs
        self.fused = fused              # read with Inductor's inlining
        self.budget = budget
        self.planned_peak = planned_peak
        self.checked: dict[tuple, int] = {}

    @staticmethod
    def needed(gm: fx.GraphModule) -> bool:
        return bool(_symbol_sources(gm))

    def over_budget(self, args) -> tuple[dict, int] | None:
        """(the sizes, the plan's peak there) when a call with ``args`` would
        exceed the budget; None when it fits."""
        bindings = {symbol: _read(args, where) for symbol, where in self.sources.items()}
        key = tuple(sorted((str(s), v) for s, v in bindings.items()))
        peak = self.checked.get(key)
        if peak is None:
            with at_sizes(bindings):
                peak = simulate(*self.graphs, fused=self.fused).peak_bytes
            self.checked[key] = peak
        return (bindings, peak) if peak > self.budget else None

    def refusal(self, bindings: dict, peak: int) -> BudgetError:
        return BudgetError(
            f"at the sizes this call runs with ({describe(bindings)}) the plan of this "
            f"dynamic-shape graph peaks at {format_bytes(peak)}, over the "
            f"{format_bytes(self.budget)} the budget leaves it (it was planned at a peak of "
            f"{format_bytes(self.planned_peak)}, at the largest sizes it had run with). "
            "Run the largest sizes first (fxckpt then plans for them), mark the dimension "
            "static, or raise the budget", floor_bytes=None)


def describe(bindings: dict) -> str:
    return ", ".join(f"{symbol}={value}" for symbol, value in
                     sorted(bindings.items(), key=lambda kv: str(kv[0])))


def _symbol_sources(gm: fx.GraphModule) -> dict[Any, tuple[int, int | None]]:
    """Each plain size symbol of the graph's inputs -> (input index, dim), or
    (input index, None) for a size passed as an int."""
    sources: dict[Any, tuple[int, int | None]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            sources.setdefault(value.node.expr, (index, None))
        elif isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    sources.setdefault(size.node.expr, (index, dim))
    return sources


def _read(args, where: tuple[int, int | None]) -> int:
    index, dim = where
    value = args[index]
    return int(value) if dim is None else int(value.shape[dim])


class SizesSeen:
    """The largest size each input dimension of a frame's graphs had, by
    Dynamo frame, so a frame that turns dynamic is planned for them."""

    def __init__(self) -> None:
        # frame -> (placeholder name, dim) -> size; Dynamo names an input
        # after its source, alike across a frame's recompiles.
        self.largest: dict[int, dict[tuple[str, int | None], int]] = {}

    def plan_at(self, frame: int, gm: fx.GraphModule) -> dict:
        """Record ``gm``'s concrete input sizes; bind its size symbols to the
        largest sizes the frame has seen where they exceed the symbols' hints."""
        seen = self.largest.setdefault(frame, {})
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        bindings = {}
        for node in placeholders:
            value = node.meta.get("example_value", node.meta.get("val"))
            if not isinstance(value, torch.Tensor):
                continue
            for dim, size in enumerate(value.shape):
                key = (node.name, dim)
                if isinstance(size, torch.SymInt):
                    largest = seen.get(key)
                    if largest is not None and size.node.expr.is_Symbol \
                            and largest > (size.node.hint or 0):
                        bindings[size.node.expr] = max(largest, bindings.get(size.node.expr, 0))
                elif isinstance(size, int):
                    seen[key] = max(seen.get(key, 0), size)
        return bindings

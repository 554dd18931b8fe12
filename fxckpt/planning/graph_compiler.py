"""One graph planned and compiled for given options: what the backend asks
of planning for each graph Dynamo hands it, and again when the step's
budget moves a graph to another plan. It owns nothing of the step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch.fx as fx

from fxckpt.compat.dynamo import copy_of_dynamo_graph
from fxckpt.errors import BudgetError
from fxckpt.memory.values import at_sizes
from fxckpt.options import Budget, Options
from fxckpt.planning.pipeline import Planner
from fxckpt.report.plan import Plan


class GraphCompiler:
    """``compile_fn`` hands a graph and its Planner to AOTAutograd and a
    compiler (``capture.compile_planned``); ``on_plan`` gets every plan
    made for a graph the step runs."""

    def __init__(self, compile_fn: Callable[[fx.GraphModule, list[Any], Planner], Any],
                 on_plan: Callable[[Plan], Any]) -> None:
        self.compile_fn = compile_fn
        self.on_plan = on_plan

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                sizes: dict) -> tuple[Planner, Any]:
        """The graph planned under ``options`` at ``sizes`` (the largest its
        frame ran with, for symbolic ones) and compiled; BudgetError where
        no plan fits."""
        planner = Planner(options, on_plan=self.on_plan)
        with at_sizes(sizes):
            compiled = self.compile_fn(gm, example_inputs, planner)
        return planner, compiled

    def own_floor(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                  sizes: dict) -> int | None:
        """The lowest peak the graph's planning names (under Inductor the
        lowest compiled peak, which can lie far below the compiled peak of
        the memory model's floor plan: HF ConvNeXt 329,552 B against
        1,710,560 B); None if a plan fits a budget of one byte after all."""
        planner = Planner(replace(options, budget=Budget(bytes=1)))
        try:
            with at_sizes(sizes):
                self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        except BudgetError as refused:
            return refused.floor_bytes
        return None

    def frontier_for_runs(self, gm: fx.GraphModule, example_inputs: list[Any],
                          options: Options, runs: int) -> tuple:
        """The frontier of a graph that runs ``runs`` times per step, each
        plan's peak counted with its other runs' saved bytes."""
        planner = Planner(replace(options, budget=Budget(bytes=2**62), runs_per_step=runs))
        self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        return planner.frontiers_seen[-1]

    def recompile(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                  step_peak: int, runs: int) -> tuple[Plan, Any]:
        """The graph compiled again with the frontier plan whose peak plus its
        other runs' saved bytes is ``step_peak`` (the cheapest that fits it
        is that plan)."""
        options = replace(options, budget=Budget(bytes=step_peak), runs_per_step=runs)
        planner = Planner(options, on_plan=self.on_plan)
        compiled = self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        return planner.plans[-1], compiled

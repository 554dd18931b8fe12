"""One graph planned and compiled for given options: what the backend asks
of planning for each graph Dynamo hands it, and again when the step's
budget moves a graph to another plan. It owns nothing of the step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch.fx as fx

from fxckpt.compat.dynamo import copy_of_dynamo_graph
from fxckpt.memory.values import at_sizes
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner
from fxckpt.report.plan import Plan
from fxckpt.solve.select import Fits, Floor, Request, RuntimeOptimal


class GraphCompiler:
    """``compile_fn`` hands a graph and its Planner to AOTAutograd and a
    compiler (``capture.compile_planned``); ``on_plan`` gets every plan
    made for a graph the step runs."""

    def __init__(self, compile_fn: Callable[[fx.GraphModule, list[Any], Planner], Any],
                 on_plan: Callable[[Plan], Any]) -> None:
        self.compile_fn = compile_fn
        self.on_plan = on_plan

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                sizes: dict, request: Request | None = None) -> tuple[Planner, Any]:
        """The graph planned under ``options`` at ``sizes`` (the largest its
        frame ran with, for symbolic ones) for ``request`` (None: the
        options' budget) and compiled; BudgetError where no plan fits."""
        planner = Planner(options, on_plan=self.on_plan, request=request)
        with at_sizes(sizes):
            compiled = self.compile_fn(gm, example_inputs, planner)
        return planner, compiled

    def floor_plan(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                   sizes: dict) -> Plan | None:
        """The graph's floor plan: under Inductor the lowest compiled peak of
        three plans (capture.py's ``_lowest``), which can lie far below the
        compiled peak of the memory model's floor plan (HF ConvNeXt); None
        where the compile was served from caches without its plan."""
        planner = Planner(options, request=Floor())
        with at_sizes(sizes):
            self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        return planner.plans[-1] if planner.plans else None

    def frontier_for_runs(self, gm: fx.GraphModule, example_inputs: list[Any],
                          options: Options, runs: int) -> tuple:
        """The frontier of a graph that runs ``runs`` times per step, each
        plan's peak counted with its other runs' saved bytes."""
        planner = Planner(replace(options, runs_per_step=runs), request=RuntimeOptimal())
        self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        return planner.frontiers_seen[-1]

    def recompile(self, gm: fx.GraphModule, example_inputs: list[Any], options: Options,
                  step_peak: int, runs: int) -> tuple[Plan, Any]:
        """The graph compiled again with the frontier plan whose peak plus its
        other runs' saved bytes is ``step_peak`` (the cheapest that fits it
        is that plan)."""
        planner = Planner(replace(options, runs_per_step=runs), on_plan=self.on_plan,
                          request=Fits(step_peak))
        compiled = self.compile_fn(copy_of_dynamo_graph(gm), example_inputs, planner)
        return planner.plans[-1], compiled

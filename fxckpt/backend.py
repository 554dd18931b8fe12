"""The torch.compile backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch.fx as fx

from .capture import compile_planned
from .errors import BudgetError, FxckptError, surface_through_dynamo
from .options import DEFAULT_COMPILER, Budget, Options, format_bytes
from .pipeline import Planner
from .types import Plan


class Backend:
    """A dynamo backend that checkpoints every graph it is given.

    ``plans`` holds one Plan per graph compiled with a backward, in order.

    ``reserved_bytes`` (optional) returns the bytes that pieces of the step
    other than this backend's graphs (eager fallback regions) hold for
    backward so far; a byte budget is shared with them. ``on_graph``
    (optional) is called with each graph Dynamo hands over and the plans
    made for it.
    """

    def __init__(self, options: Options, *, node_policy=None,
                 reserved_bytes: Callable[[], int] | None = None,
                 on_graph: Callable[[fx.GraphModule, list[Plan]], Any] | None = None) -> None:
        self.options = options
        self.node_policy = node_policy
        self.reserved_bytes = reserved_bytes
        self.on_graph = on_graph
        self.plans: list[Plan] = []
        self.graphs_without_backward = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]):
        try:
            planner = Planner(self._options_for_next_graph(), on_plan=self.plans.append,
                              node_policy=self.node_policy)
            compiled = compile_planned(gm, example_inputs, planner)
        except FxckptError as error:
            raise surface_through_dynamo(error) from None
        if not planner.plans:
            # No input or parameter requires grad (or grad mode is off): AOTAutograd
            # built an inference graph, there is nothing to save for backward.
            self.graphs_without_backward += 1
        if self.on_graph is not None:
            self.on_graph(gm, list(planner.plans))
        return compiled

    def _options_for_next_graph(self) -> Options:
        """Split a byte budget across the graphs of one step (graph breaks).

        Graphs compile in the order their forwards run. While graph k runs,
        forward or backward, the activations graphs 1..k-1 saved are still
        held; graphs after k have either not run yet (forward) or already
        freed theirs (backward). So the step's peak is the largest, over k, of
        graph k's own peak plus what the earlier graphs saved, and graph k is
        given the budget minus those saved bytes. A fraction budget is read per
        graph, as a fraction of that graph's runtime-optimal peak.

        Eager fallback regions (``reserved_bytes``) count like earlier graphs:
        what they hold is measured as they run, before the graphs after them
        compile."""
        budget = self.options.budget
        if budget is None or budget.bytes is None:
            return self.options
        held_by_graphs = sum(plan.saved_bytes for plan in self.plans)
        held_elsewhere = self.reserved_bytes() if self.reserved_bytes is not None else 0
        held = held_by_graphs + held_elsewhere
        if held == 0:
            return self.options
        remaining = budget.bytes - held
        if remaining <= 0:
            holders = [f"the {format_bytes(held_by_graphs)} that the {len(self.plans)} "
                       "graph(s) before this one"] if self.plans else []
            if held_elsewhere:
                holders.append(f"the {format_bytes(held_elsewhere)} that eager fallback regions")
            raise BudgetError(
                f"the budget of {format_bytes(budget.bytes)} is used up by "
                f"{' and '.join(holders)} save for backward; raise the budget",
                floor_bytes=held + 1)
        return replace(self.options, budget=Budget(bytes=remaining))

    def __repr__(self) -> str:
        o = self.options
        return (f"fxckpt.backend(budget={o.budget}, policy={o.policy!r}, "
                f"compiler={o.compiler!r}, solver={o.solver!r}"
                + (f", offload_bandwidth={o.offload_bandwidth:g}" if o.offload_bandwidth else "")
                + ")")


def backend(*, budget=None, policy=None, compiler: str = DEFAULT_COMPILER,
            solver: str = "auto", offload_bandwidth=None) -> Backend:
    """A torch.compile backend that plans activation checkpointing.

    ``budget``: bytes (int), a string such as "512MiB", or a float in (0, 1]
    read as a fraction of the runtime-optimal plan's peak; None for the
    runtime-optimal plan. ``compiler``: "inductor" or "eager".
    ``offload_bandwidth``: bytes per second (or a string such as "12GB/s")
    between device and pinned host memory, the price of CPU offload under a
    budget; None measures it on the device once per process.
    """
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth)
    return Backend(options, node_policy=_node_policy(options.policy))


def fxckpt_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, **_):
    """Entry point for ``torch.compile(model, backend="fxckpt", options={...})``."""
    return _from_mapping(options)(gm, example_inputs)


def _from_mapping(options: dict | None) -> Backend:
    resolved = Options.from_mapping(options)
    return Backend(resolved, node_policy=_node_policy(resolved.policy))


def _node_policy(policy):
    if policy is None:
        return None
    from .policies import resolve_policy

    return resolve_policy(policy)

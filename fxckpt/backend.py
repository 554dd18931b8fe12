"""The torch.compile backend."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from .capture import compile_planned
from .options import Options
from .pipeline import Planner
from .types import Plan


class Backend:
    """A dynamo backend that checkpoints every graph it is given.

    ``plans`` holds one Plan per graph compiled with a backward, in order.
    """

    def __init__(self, options: Options, *, node_policy=None) -> None:
        self.options = options
        self.node_policy = node_policy
        self.plans: list[Plan] = []
        self.graphs_without_backward = 0

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]):
        planner = Planner(self.options, on_plan=self.plans.append,
                          node_policy=self.node_policy)
        compiled = compile_planned(gm, example_inputs, planner)
        if not planner.plans:
            # No input or parameter requires grad (or grad mode is off): AOTAutograd
            # built an inference graph, there is nothing to save for backward.
            self.graphs_without_backward += 1
        return compiled

    def __repr__(self) -> str:
        o = self.options
        return (f"fxckpt.backend(budget={o.budget}, policy={o.policy!r}, "
                f"compiler={o.compiler!r}, solver={o.solver!r})")


def backend(*, budget=None, policy=None, compiler: str = "inductor",
            solver: str = "auto") -> Backend:
    """A torch.compile backend that plans activation checkpointing.

    ``budget``: bytes (int), a string such as "512MiB", or a float in (0, 1]
    read as a fraction of the runtime-optimal plan's peak; None for the
    runtime-optimal plan. ``compiler``: "inductor" or "eager".
    """
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver)
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

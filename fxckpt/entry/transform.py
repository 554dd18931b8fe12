"""fxckpt.transform: a GraphModule in, a module that trains by the plan out."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.fx as fx

from fxckpt.compat.ops import pytree
from fxckpt.planning.capture import compile_planned
from fxckpt.errors import FxckptError
from fxckpt.budget.fit import fitted_budget
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner


class Transformed(torch.nn.Module):
    """Runs ``module`` through the planned forward and backward graphs.

    ``plan`` is the Plan (None when nothing needs grad: no backward, nothing to
    save). Parameters are the original module's, shared, not copied.
    """

    def __init__(self, module: fx.GraphModule, compiled, out_spec, plan) -> None:
        super().__init__()
        self.module = module
        self._compiled = compiled
        self._out_spec = out_spec
        self.plan = plan

    def forward(self, *args):
        flat = self._compiled(*args)
        return pytree.tree_unflatten(list(flat), self._out_spec)


def transform(gm: fx.GraphModule, *example_inputs, budget=None, policy=None,
              compiler: str = "eager", solver: str = "auto",
              offload_bandwidth=None) -> Transformed:
    """Plan activation checkpointing for a traced graph and compile it.

    Args:
        gm: a ``torch.fx.GraphModule`` (``torch.fx.symbolic_trace(model)``);
            its parameters and buffers are shared, not copied.
        *example_inputs: tensors of the shapes the module trains on.
        budget: as ``fxckpt.backend``'s, for this one graph (bytes, a string
            such as "512MiB", a fraction 0..1, "fit"); None: the
            runtime-optimal plan.
        policy: as ``fxckpt.backend``'s.
        compiler: "eager" (the default here: the planned graphs run as aten
            ops) or "inductor".
        solver: one of ``fxckpt.options.SOLVERS``.
        offload_bandwidth: bytes per second (or "12GB/s") pricing CPU
            offload; None measures it.

    Returns:
        A ``Transformed`` module that trains by the plan: call it as ``gm``;
        its ``plan`` is the Plan (None where nothing needs grad).

    Raises:
        BudgetError: no plan fits ``budget``; its ``floor_bytes`` is the
            smallest budget that does.

    Example:
        >>> gm = torch.fx.symbolic_trace(model)
        >>> run = fxckpt.transform(gm, x, budget=0.5)
        >>> run(x).sum().backward()
        >>> print(run.plan)
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(
            f"fxckpt.transform takes a torch.fx.GraphModule, got {type(gm).__name__}; "
            "trace it first (torch.fx.symbolic_trace(model)) or use "
            "torch.compile(model, backend=fxckpt.backend(...)) for a plain nn.Module")
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth)
    if options.budget is not None and options.budget.fit:
        options = replace(options, budget=fitted_budget(options.budget, list(example_inputs)))
    lifted = len(list(gm.named_parameters(remove_duplicate=False))) + \
        len(list(gm.named_buffers(remove_duplicate=False)))
    planner = Planner(options, num_lifted_params=lifted)
    flat_gm, out_spec = _flatten_outputs(gm, example_inputs)
    compiled = compile_planned(flat_gm, list(example_inputs), planner)
    plan = planner.plans[-1] if planner.plans else None
    return Transformed(gm, compiled, out_spec, plan)


def _flatten_outputs(gm: fx.GraphModule, example_inputs):
    """A view of ``gm`` that returns a flat tuple, and the structure to rebuild.

    AOTAutograd wants a flat sequence of outputs; the structure is read from
    the graph's output node, so nothing is executed."""
    graph = fx.Graph()
    result = graph.graph_copy(gm.graph, {})
    flat, spec = pytree.tree_flatten(result)
    if any(not isinstance(x, (fx.Node, type(None))) for x in flat):
        raise FxckptError("fxckpt.transform supports graphs whose outputs are tensors "
                          "(possibly nested in tuples, lists or dicts)")
    graph.output(tuple(flat))
    flat_gm = fx.GraphModule(gm, graph)
    return flat_gm, spec

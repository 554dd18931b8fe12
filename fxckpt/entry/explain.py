"""fxckpt.explain: the Plan for a model or graph, without training it."""

from __future__ import annotations

import warnings

import torch
import torch.fx as fx

from fxckpt.entry.backend import Backend
from fxckpt.planning.capture import capture_once
from fxckpt.errors import BudgetError, FxckptError
from fxckpt.options import DEFAULT_COMPILER, Options
from fxckpt.report.plan import Plan, merge_plans


def explain(model_or_gm, *example_inputs, budget=None, policy=None,
            solver: str = "auto", offload_bandwidth=None,
            compiler: str = DEFAULT_COMPILER) -> Plan:
    """Plan checkpointing for ``model_or_gm`` on ``example_inputs``, without training.

    A GraphModule is planned directly; an nn.Module is captured with Dynamo
    on a copy (its buffers and your RNG are left untouched), which runs one
    forward on the example inputs.

    Args:
        model_or_gm: an ``nn.Module``, a function, or a ``GraphModule``.
        *example_inputs: the inputs of one training step's forward.
        budget, policy, solver, offload_bandwidth: as ``fxckpt.backend``'s.
        compiler: the backend's; the default matches ``fxckpt.backend()``,
            so the plan explained is the plan run (Inductor's joint-graph
            passes change the graph that is planned).

    Returns:
        The Plan (``print`` it for the table of what is saved, recomputed
        and offloaded, why and at what cost).

    Raises:
        BudgetError: no plan fits ``budget``; its ``floor_bytes`` names the
            smallest budget that does.

    Example:
        >>> print(fxckpt.explain(model, x, budget=0.5))
    """
    if isinstance(model_or_gm, fx.GraphModule):
        from fxckpt.entry.transform import transform

        plan = transform(model_or_gm, *example_inputs, budget=budget, policy=policy,
                         compiler=compiler, solver=solver,
                         offload_bandwidth=offload_bandwidth).plan
        if plan is None:
            raise FxckptError(_NO_GRAD)
        return plan
    if not isinstance(model_or_gm, torch.nn.Module) and not callable(model_or_gm):
        raise TypeError(f"explain takes an nn.Module or a GraphModule, got "
                        f"{type(model_or_gm).__name__}")
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth)
    be = Backend(options, refuse_at_compile=True)
    try:
        _capture(model_or_gm, example_inputs, be)
    except BudgetError:
        # The first graph cannot fit. Where the model splits into several
        # graphs, the budget that works is the step's floor: name that.
        if options.budget is not None and options.budget.bytes is not None:
            step = _step_refusal(model_or_gm, example_inputs, options)
            if step is not None:
                raise step from None
        raise
    if not be.plans:
        if be.graphs_without_backward:
            raise FxckptError(_NO_GRAD)
        raise FxckptError(
            "Dynamo captured no graph from this model, so there is nothing to plan; "
            "run with TORCH_LOGS=graph_breaks to see why")
    plans = [e.plan for e in be.ledger.run_order()] if be.replans else be.plans
    if len(plans) == 1:
        return plans[0]
    return merge_plans(plans)


def _capture(model, example_inputs, be: Backend) -> None:
    """One forward under ``be``, then the step's check its backward would
    make: a graph that ran at its floor (what the graphs before it hold left
    too little) has the step planned again together, or BudgetError names
    the step's floor. The warnings that speak of the step's backward are
    not the caller's: explain runs none."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="fxckpt: this graph")
        warnings.filterwarnings("ignore", message="fxckpt: the first training step")
        capture_once(model, example_inputs, be)
        be.forward_only_step_ended()


def _step_refusal(model, example_inputs, options: Options) -> BudgetError | None:
    """BudgetError naming the step's floor, from a capture with every graph
    that cannot fit at its floor; None for a model of one graph (its own
    refusal says more: where its floor peaks, and of what), told by a
    capture that plans nothing, so that asking a one-graph model for its
    floor costs one planning, as before."""
    if _graph_count(model, example_inputs) <= 1:
        return None
    be = Backend(options)
    try:
        _capture(model, example_inputs, be)
    except BudgetError as refused:
        return refused
    return None


def _graph_count(model, example_inputs) -> int:
    """How many graphs Dynamo splits one forward of ``model`` into."""
    graphs = []

    def counting(gm, _):
        graphs.append(gm)
        return gm.forward

    capture_once(model, example_inputs, counting)
    return len(graphs)


_NO_GRAD = ("nothing requires grad (no parameter or input has requires_grad=True, or "
            "grad mode is off), so there is no backward and nothing to checkpoint")


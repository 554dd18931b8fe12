"""fxckpt.explain: the Plan for a model or graph, without training it."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.entry.backend import Backend
from fxckpt.planning.capture import capture_once
from fxckpt.errors import FxckptError
from fxckpt.options import DEFAULT_COMPILER, Options
from fxckpt.report.plan import Plan, merge_plans


def explain(model_or_gm, *example_inputs, budget=None, policy=None,
            solver: str = "auto", offload_bandwidth=None,
            compiler: str = DEFAULT_COMPILER) -> Plan:
    """Plan checkpointing for ``model_or_gm`` on ``example_inputs`` and return the
    Plan. A GraphModule is planned directly; an nn.Module is captured with
    Dynamo on a copy (its buffers and your RNG are left untouched), which runs
    one forward on the example inputs. ``compiler`` is the backend's: the
    default matches ``fxckpt.backend()``, so the plan explained is the plan
    run (Inductor's joint-graph passes change the graph that is planned)."""
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
    capture_once(model_or_gm, example_inputs, be)
    if not be.plans:
        if be.graphs_without_backward:
            raise FxckptError(_NO_GRAD)
        raise FxckptError(
            "Dynamo captured no graph from this model, so there is nothing to plan; "
            "run with TORCH_LOGS=graph_breaks to see why")
    if len(be.plans) == 1:
        return be.plans[0]
    return merge_plans(be.plans)


_NO_GRAD = ("nothing requires grad (no parameter or input has requires_grad=True, or "
            "grad mode is off), so there is no backward and nothing to checkpoint")


"""Steep steps of the frontier are filled (solve/frontier.py,
``_steps_filled``): where one frontier plan costs much more recompute than
the next one up, its plan filled to a peak between the two joins the
frontier, so a budget inside the step pays less. Checked on random graphs
(the proxy as the exact model: never costlier at any budget, every plan
runnable) and on the zoo GPT (filled plans reach the frontier, and one
trains bitwise equal to eager); on it and a tiny HF Llama the floor is
the floor without them."""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxckpt
from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.models import make_model
from fxckpt.solve.frontier import pareto_frontier
from fxckpt.solve.problem import build_problem
from fxckpt.solve.runtime_optimal import runtime_optimal

try:
    from tests.harness import assert_bitwise_equal, run_step
    from tests.random_graphs import proxy_evaluate, random_profile
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step
    from random_graphs import proxy_evaluate, random_profile

frontier_module = importlib.import_module("fxckpt.solve.frontier")


def _masks(problem, names):
    return np.array([n in names for n in problem.names])


def _frontier(problem, solver):
    evaluate = proxy_evaluate(problem)
    optimal = runtime_optimal(problem)
    return pareto_frontier(problem, evaluate, solver, (optimal, *evaluate(optimal)))


def _cost_at(frontier, budget):
    costs = [c.cost for c in frontier if c.peak <= budget]
    return min(costs) if costs else None


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["ilp", "fast", "auto"]),
       st.booleans())
def test_filled_steps_never_cost_more_and_stay_runnable(seed, solver, offload):
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    filled = _frontier(problem, solver)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frontier_module, "_STEP_FILLS", 0)
        plain = _frontier(problem, solver)
    assert not any(c.decision.solver == "fill" for c in plain)
    for c in filled:
        masks = [_masks(problem, names) for names in
                 (c.decision.saved, c.decision.recomputed, c.decision.offloaded)]
        assert problem.is_feasible(*masks) == ""
    for budget in sorted({c.peak for c in filled + plain}):
        with_fills, without = _cost_at(filled, budget), _cost_at(plain, budget)
        assert (with_fills is None) == (without is None)
        if without is not None:
            assert with_fills <= without + 1e-15


def test_a_budget_inside_a_steep_step_gets_a_filled_plan_that_trains_bitwise(reset_dynamo):
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    sweep = fxckpt.pareto(Step(model, loss_fn), *inputs, compiler="eager")
    filled = [plan for plan in sweep.frontier if plan.solver == "fill"]
    assert filled, [(p.peak_bytes, p.solver) for p in sweep.frontier]
    chosen = filled[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frontier_module, "_STEP_FILLS", 0)
        plain = fxckpt.pareto(Step(model, loss_fn), *inputs, compiler="eager")
    without = min(p.recompute_cost for p in plain.frontier if p.peak_bytes <= chosen.peak_bytes)
    assert chosen.recompute_cost < without

    backend = fxckpt.backend(compiler="eager", budget=chosen.peak_bytes)
    compiled = torch.compile(Step(copy.deepcopy(model), loss_fn), backend=backend)
    ours = run_step(compiled, inputs, lambda loss: loss)
    reference = run_step(Step(copy.deepcopy(model), loss_fn), inputs, lambda loss: loss)
    assert [plan.solver for plan in backend.plans] == ["fill"]
    assert backend.plans[0].peak_bytes <= chosen.peak_bytes
    assert_bitwise_equal(ours, reference)


@pytest.mark.parametrize("name", ["gpt", "hf_llama"])
def test_filled_steps_leave_the_floor_where_it_was(name, reset_dynamo):
    """Recomputing again starts from the lowest plans; a filled plan peaks
    about as low as the plan it fills and costs less, and must not take
    its place there (on the tiny HF Llama the floor rose from 110,280 to
    118,216 bytes when it did)."""
    model, inputs, loss_fn = make_bench_model(name, size="tiny")
    with_fills = fxckpt.pareto(Step(model, loss_fn), *inputs, budgets=[], compiler="eager")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frontier_module, "_STEP_FILLS", 0)
        plain = fxckpt.pareto(Step(model, loss_fn), *inputs, budgets=[], compiler="eager")
    assert with_fills.floor_bytes == plain.floor_bytes
    assert with_fills.frontier[0].solver.endswith("+again")

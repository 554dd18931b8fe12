"""Budgets in bytes are honoured or refused.

On the zoo's GPT (with dropout), a sweep of budgets from fxckpt's floor to
the runtime-optimal plan's peak: the measured peak stays within each budget
(5% for measurement), peaks rise with the budget, recompute cost falls, and
gradients stay bit for bit equal to eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes

try:
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.test_memory_model import Step, measured_and_predicted
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, fresh, run_step
    from test_memory_model import Step, measured_and_predicted
    from zoo import ZOO

pytestmark = pytest.mark.releases


def _floor_and_optimal():
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    step = Step(model, loss_fn)
    optimal = fxckpt.explain(step, *inputs, compiler="eager")
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(step, *inputs, budget=1, compiler="eager")
    return refused.value.floor_bytes, optimal.peak_bytes


@pytest.mark.slow
def test_budget_sweep_on_gpt():
    floor, optimal = _floor_and_optimal()
    # A range worth sweeping (0.82 since the rewrite takes a tuple's
    # elements out at once, which lowered the runtime-optimal peak).
    assert floor < 0.85 * optimal
    budgets = [int(b) for b in np.linspace(floor, optimal, 8)]
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    reference = run_step(Step(model, loss_fn), inputs, lambda loss: loss)
    rows = []
    for budget in budgets:
        # One compile per budget: its first step (the compile's) and its
        # second are measured, with no tolerance; the third is compared with
        # eager.
        torch._dynamo.reset()
        model, inputs, loss_fn = fresh(ZOO["gpt"])
        be = fxckpt.backend(compiler="eager", budget=budget)
        step = torch.compile(Step(model, loss_fn), backend=be)
        first = measure_peak_bytes(lambda: step(*inputs).backward())
        model.zero_grad(set_to_none=True)
        measured = measure_peak_bytes(lambda: step(*inputs).backward())
        model.zero_grad(set_to_none=True)
        assert_bitwise_equal(reference, run_step(step, inputs, lambda loss: loss))
        predicted = sum(p.peak_bytes for p in be.plans)
        assert predicted <= budget
        assert first <= budget and measured <= budget, (budget, first, measured)
        rows.append((budget, measured, be.plans[0].recompute_cost))
    measured_peaks = [m for _, m, _ in rows]
    costs = [c for _, _, c in rows]
    assert measured_peaks == sorted(measured_peaks), rows
    assert costs == sorted(costs, reverse=True), rows


def test_too_small_budget_names_the_floor_and_the_floor_is_met():
    floor, _ = _floor_and_optimal()
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    compiled = torch.compile(Step(model, loss_fn),
                             backend=fxckpt.backend(compiler="eager", budget=floor - 1))
    # The first step runs at the floor (the step's floor is known once it has
    # run), and its backward ends with the refusal.
    with pytest.warns(UserWarning, match="alone does not fit"), \
            pytest.raises(fxckpt.BudgetError, match=str(floor)) as refused:
        compiled(*inputs).backward()
    assert refused.value.floor_bytes == floor
    assert "made of" in str(refused.value)
    measured, predicted, _ = measured_and_predicted("gpt", budget=floor)
    assert predicted <= floor and measured <= floor


def test_budget_above_runtime_optimal_peak_recomputes_nothing_extra():
    """A budget the runtime-optimal plan fits gets a plan that recomputes no
    more than it and peaks no higher (the frontier may hold one that beats
    it on both)."""
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    step = Step(model, loss_fn)
    optimal = fxckpt.explain(step, *inputs, compiler="eager")
    for budget in (optimal.peak_bytes, optimal.peak_bytes * 2):
        roomy = fxckpt.explain(step, *inputs, budget=budget, compiler="eager")
        assert roomy.recompute_cost <= optimal.recompute_cost
        assert roomy.peak_bytes <= budget
        assert roomy.budget_bytes == budget


@pytest.mark.parametrize("budget", ["64MiB", 0.85])
def test_budget_forms_reach_the_solver(budget):
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    plan = fxckpt.explain(Step(model, loss_fn), *inputs, budget=budget,
                          compiler="eager")
    assert plan.budget_bytes is not None and plan.peak_bytes <= plan.budget_bytes


class RMSNorm(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_recompute_reading_values_the_joint_graph_placed_late():
    """pow(x, 1) (for the gradient of x ** 2) sits among backward nodes in the
    joint graph; plans that save it and recompute what reads it must still
    form a valid graph, and train bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(RMSNorm(), x, budget=1, compiler="eager")
    floor = refused.value.floor_bytes
    reference = run_step(RMSNorm(), (x,), lambda y: y.square().sum())
    torch._dynamo.reset()
    be = fxckpt.backend(compiler="eager", budget=floor)
    got = run_step(torch.compile(RMSNorm(), backend=be), (x,), lambda y: y.square().sum())
    assert be.plans[0].peak_bytes <= floor
    assert_bitwise_equal(reference, got)
    # The plan without a budget recomputes (at the floor a plan saving the
    # recomputed value too peaks as low).
    torch._dynamo.reset()
    be = fxckpt.backend(compiler="eager")
    got = run_step(torch.compile(RMSNorm(), backend=be), (x,), lambda y: y.square().sum())
    assert be.plans[0].recomputed
    assert_bitwise_equal(reference, got)

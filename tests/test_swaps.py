"""A budget's step gets its cheaper plan swapped (solve/local_search/swap.py,
local_search.step_plans): a saved value live where it peaks recomputed, a
recomputed value saved back. Checked on random graphs (every swap a
runnable plan other than the one it starts from; the step's plans inside
the step, runnable, never costlier at any budget than without swaps, and
solve_budgeted monotone; nothing weighed beyond _MAX_VALUES) and on the
compile suite's 4-layer GPT with the fast solver, where a plan at 5.284 us
peaked 512 B above the exact programme's plan of the same cost: a swapped
plan makes a budget at its peak pay over 5% less than without swaps, the
step's measured peak holds within it, and it trains bitwise equal to
eager."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxckpt
from fxckpt.bench.compile import gpt_step
from fxckpt.solve.candidates import masks, plan_cost
from fxckpt.solve.frontier import solve_budgeted, step_plans
from fxckpt.solve.problem import build_problem
from fxckpt.solve.runtime_optimal import runtime_optimal
from fxckpt.solve.effort import effort_for
from fxckpt.solve.local_search.swap import step_swaps, swaps

try:
    from tests.efforts import with_effort
    from tests.step_checks import assert_compiled_at_its_peak, most_gained
    from tests.random_graphs import cost_at, proxy_evaluate, proxy_frontier, random_profile
except ImportError:  # pragma: no cover
    from efforts import with_effort
    from step_checks import assert_compiled_at_its_peak, most_gained
    from random_graphs import cost_at, proxy_evaluate, proxy_frontier, random_profile

@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.booleans())
def test_every_swap_is_a_runnable_plan_other_than_its_start(seed, offload):
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    for start in proxy_frontier(problem, "fast"):
        if start.decision.copy_steps:
            continue
        plan = masks(problem, start.decision)
        made = swaps(problem, plan, effort_for(problem.n).swap_width)
        keys = {tuple(m.tobytes() for m in trial) for trial in made}
        assert len(keys) == len(made)
        assert tuple(m.tobytes() for m in plan) not in keys
        for trial in made:
            assert problem.is_feasible(*trial) == "", problem.is_feasible(*trial)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["ilp", "fast", "auto"]),
       st.booleans())
def test_a_budget_inside_a_step_also_gets_the_upper_plan_swapped(seed, solver, offload):
    """At selection the budget's step offers the upper plan swapped
    (swap.step_swaps) besides the fills and descents: each plan inside
    the step and runnable; a budget pays no more than without swaps, and
    never more than a smaller budget."""
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    evaluate = proxy_evaluate(problem)
    optimal = runtime_optimal(problem)
    frontier = proxy_frontier(problem, solver)
    budgets = []
    for below, lower, upper in zip([None] + frontier, frontier, frontier[1:]):
        inside = step_plans(problem, evaluate, lower, upper, below)
        plain = step_plans(problem, evaluate, lower, upper, below,
                           replace(effort_for(problem.n), swap_evaluations=0))
        assert not any(c.decision.solver == "swap" for c in plain)
        for c in inside:
            assert lower.peak < c.peak < upper.peak and upper.cost <= c.cost < lower.cost
            assert problem.is_feasible(*masks(problem, c.decision)) == ""
        for budget in sorted({c.peak for c in inside + plain} | {upper.peak - 1}):
            assert cost_at([lower] + inside, budget) <= cost_at([lower] + plain, budget) + 1e-15
            budgets.append(budget)
    costs = []
    for budget in sorted(budgets):
        decision, _, _ = solve_budgeted(problem, evaluate, budget, solver,
                                        runtime_optimal=(optimal, *evaluate(optimal)),
                                        frontier=frontier)
        costs.append(plan_cost(problem, decision))
    assert all(a >= b - 1e-15 for a, b in zip(costs, costs[1:]))


def test_large_graphs_get_no_swaps():
    """At the effort of a graph beyond 600 forward values a step weighs and
    evaluates no swap, on a graph where it evaluates swaps otherwise."""
    assert effort_for(600).swaps and not effort_for(601).swaps
    for seed in range(200):
        profile, tags = random_profile(seed)
        problem = build_problem(profile, tags)
        frontier = proxy_frontier(problem, "fast")
        evaluate = proxy_evaluate(problem)
        evaluated = []

        def counted(decision):
            evaluated.append(decision)
            return evaluate(decision)
        if any(step_swaps(problem, counted, lower, upper, effort_for(problem.n))
               for lower, upper in zip(frontier, frontier[1:])):
            break
    else:
        pytest.fail("no random graph gets a swap")
    evaluated.clear()
    large = replace(effort_for(problem.n), swaps=effort_for(601).swaps)
    assert not any(step_swaps(problem, counted, lower, upper, large)
                   for lower, upper in zip(frontier, frontier[1:]))
    assert evaluated == []


def test_a_swapped_plan_closes_a_step_and_trains_bitwise(reset_dynamo):
    """On the compile suite's GPT of 4 layers, or of 5 where no swap of the
    4-layer one lands inside its step (the frontier's plans there differ by
    machine: on an AMD EPYC its swaps come out cheaper than the plan they
    are swapped from, which step_swaps leaves out, as a budget would then
    pay more above that plan than below it), a swap closes a step: a budget
    at its peak pays over 4% less than without swaps, and compiles it."""
    for layers in (4, 5):
        step, inputs = gpt_step(layers)
        full = fxckpt.pareto(step, *inputs, compiler="eager", solver="fast")
        made = [p for p in full.frontier if p.solver == "swap"]
        if made:
            break
    assert made, [(p.peak_bytes, p.solver) for p in full.frontier]
    with pytest.MonkeyPatch.context() as patch:
        with_effort(patch, swap_evaluations=0)
        plain = fxckpt.pareto(step, *inputs, compiler="eager", solver="fast")
    assert not any(p.solver == "swap" for p in plain.frontier)
    # The one a budget at its peak gains most on: without swaps that budget
    # pays 5.0% more on the 4-layer GPT on an Intel Xeon, 4.9% on the 5-layer
    # on an AMD EPYC (`python -m pytest tests/test_swaps.py -k closes`).
    gain, chosen = most_gained(made, plain)
    assert gain > 1.04, gain
    assert_compiled_at_its_peak(step, inputs, "fast", chosen)

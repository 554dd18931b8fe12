"""Steep steps of the frontier are walked down (solve/local_search/descend.py): the
cheaper plan of a step, measured where it peaks, lowered one recomputed
value at a time (solve/fast.py's ``lowered``). Checked on random graphs
(each move lowers the proxy's peak and leaves a runnable plan; the
frontier is never costlier at any budget, every plan runnable) and on the
compile suite's 4-layer GPT with the fast solver, where the sweep left a
step from 15.6 us to 119.9 us of recompute within 1.5% of peak: a
descended plan lies inside it, a budget at its peak holds the step's
measured peak within it, and trains bitwise equal to eager."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fxckpt
from fxckpt.bench.compile import gpt_step
from fxckpt.solve.candidates import masks, plan_cost
from fxckpt.solve.fast import lowered
from fxckpt.solve.problem import build_problem
from fxckpt.solve.runtime_optimal import runtime_optimal

from fxckpt.solve.effort import effort_for
from fxckpt.solve.frontier import solve_budgeted, step_plans, without
from fxckpt.solve.local_search.fill import step_fills

try:
    from tests.efforts import with_effort
    from tests.step_checks import assert_compiled_at_its_peak, most_gained
    from tests.random_graphs import (assert_runnable_and_never_costlier, cost_at,
                                     proxy_evaluate, proxy_frontier, random_profile)
except ImportError:  # pragma: no cover
    from efforts import with_effort
    from step_checks import assert_compiled_at_its_peak, most_gained
    from random_graphs import (assert_runnable_and_never_costlier, cost_at, proxy_evaluate,
                               proxy_frontier, random_profile)

@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.booleans())
def test_each_move_lowers_the_proxy_peak_and_leaves_a_runnable_plan(seed, offload):
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    plan = masks(problem, runtime_optimal(problem))
    # The proxy's peak falls at every move, so the walk ends.
    for _ in range(10 * problem.n):
        made = lowered(problem, plan)
        if made is None:
            break
        assert problem.peak(*made) < problem.peak(*plan)
        assert problem.is_feasible(*made) == ""
        plan = made


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["ilp", "fast", "auto"]),
       st.booleans())
def test_descended_steps_never_cost_more_and_stay_runnable(seed, solver, offload):
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    descended = proxy_frontier(problem, solver)
    plain = proxy_frontier(problem, solver, stages=without("steep steps walked down"))
    assert not any(c.decision.solver == "descent" for c in plain)
    assert_runnable_and_never_costlier(problem, descended, plain)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["ilp", "fast"]),
       st.booleans())
def test_a_budget_inside_a_step_also_gets_the_upper_plan_walked_down(seed, solver, offload):
    """At selection the budget's step offers the lower plan filled
    (fill.step_fills) and the upper plan walked down
    (descend.step_descents): each plan inside the step, runnable; a budget
    pays no more than with the fills alone, and never more than a smaller
    budget."""
    profile, tags = random_profile(seed, offload=offload)
    problem = build_problem(profile, tags, bandwidth=2.5e5 if offload else None)
    evaluate = proxy_evaluate(problem)
    optimal = runtime_optimal(problem)
    frontier = proxy_frontier(problem, solver)
    budgets = []
    for lower, upper in zip(frontier, frontier[1:]):
        inside = step_plans(problem, evaluate, lower, upper)
        fills = step_fills(problem, evaluate, lower, upper, None, effort_for(problem.n))
        for c in inside:
            assert lower.peak < c.peak < upper.peak and upper.cost <= c.cost < lower.cost
            assert problem.is_feasible(*masks(problem, c.decision)) == ""
        for budget in sorted({c.peak for c in inside + fills} | {upper.peak - 1}):
            with_both = cost_at([lower] + inside, budget)
            assert with_both <= cost_at([lower] + fills, budget) + 1e-15
            budgets.append(budget)
    costs = [evaluate_cost(problem, evaluate, budget, solver, optimal, frontier)
             for budget in sorted(budgets)]
    assert all(a >= b - 1e-15 for a, b in zip(costs, costs[1:]))


def evaluate_cost(problem, evaluate, budget, solver, optimal, frontier):
    decision, _, _ = solve_budgeted(problem, evaluate, budget, solver,
                                    runtime_optimal=(optimal, *evaluate(optimal)),
                                    frontier=frontier)
    return plan_cost(problem, decision)


def test_a_descended_plan_closes_a_steep_step_and_trains_bitwise(reset_dynamo):
    step, inputs = gpt_step(4)
    descended, plain = _made_and_plain(step, inputs, "fast", "steps_descended", "descent")

    # The one a budget at its peak gains most on: without descents that
    # budget paid at least twice the recompute (the step it lies in).
    gain, chosen = most_gained(descended, plain)
    assert gain > 2.0
    assert_compiled_at_its_peak(step, inputs, "fast", chosen)


def _made_and_plain(step, inputs, solver, switch, label):
    """The frontier plans of solver ``label``, and the frontier with the
    effort's ``switch`` at 0, which has none of them."""
    full = fxckpt.pareto(step, *inputs, compiler="eager", solver=solver)
    with pytest.MonkeyPatch.context() as patch:
        with_effort(patch, **{switch: 0})
        plain = fxckpt.pareto(step, *inputs, compiler="eager", solver=solver)
    assert not any(p.solver == label for p in plain.frontier)
    made = [p for p in full.frontier if p.solver == label]
    assert made, [(p.peak_bytes, p.solver) for p in full.frontier]
    return made, plain


def test_tiny_llama_budgets_get_the_upper_plan_walked_down(reset_dynamo):
    """Tiny HF Llama (no weights), solver="auto": the plans a budget inside
    a step gets from its upper plan walked down (descend.step_descents,
    solver "step descent") make some budget pay less than half of what the
    fills alone leave it; a budget at such a plan's peak compiles exactly
    that plan, holds its measured peak, and trains bitwise equal to eager."""
    pytest.importorskip("transformers")
    from fxckpt.bench.ways import Step
    from fxckpt.bench.zoo import make_bench_model

    model, inputs, loss_fn = make_bench_model("hf_llama", size="tiny")
    step = Step(model, loss_fn)
    made, plain = _made_and_plain(step, inputs, "auto", "step_descent_moves", "step descent")
    gain, chosen = most_gained(made, plain)
    assert gain > 2.0
    assert_compiled_at_its_peak(step, inputs, "auto", chosen)

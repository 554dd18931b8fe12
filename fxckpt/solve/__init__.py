"""Strategies that decide what to save. Every strategy sees a Problem (numbers,
not a graph) and returns a Decision; ``solve`` picks one from the options
and applies the budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..errors import BudgetError
from ..options import Options, format_bytes
from ..types import Decision, Profile, Tag
from .baselines import per_block, recompute_all, save_all, sqrt_segments
from .budgeted import solve_budgeted
from .mincut import runtime_optimal
from .problem import build_problem

BASELINES = {
    "save_all": save_all,
    "recompute_all": recompute_all,
    "per_block": per_block,
    "sqrt_n": sqrt_segments,
    "mincut": runtime_optimal,
}

# evaluate(decision) -> (rewritten graphs, memory timeline)
Evaluate = Callable[[Decision], tuple]


def solve(profile: Profile, tags: dict[str, Tag], evaluate: Evaluate, options: Options):
    """Return (decision, rewritten, timeline) for the options' solver and budget."""
    problem = build_problem(profile, tags)
    if options.solver in BASELINES:
        decision = BASELINES[options.solver](problem)
        rewritten, timeline = evaluate(decision)
        return _within_budget(decision, rewritten, timeline, options)
    optimal = runtime_optimal(problem)
    rewritten, timeline = evaluate(optimal)
    if options.budget is None:
        return optimal, rewritten, timeline
    # With a budget, plans come from the trade-off frontier, of which the
    # runtime-optimal plan is one candidate: a budget it fits gets it or a
    # plan that is no more costly and peaks no higher.
    budget = options.budget.resolve(timeline.peak_bytes)
    return solve_budgeted(problem, evaluate, budget, options.solver,
                          runtime_optimal=(optimal, rewritten, timeline))


def _within_budget(decision, rewritten, timeline, options):
    if options.budget is None:
        return decision, rewritten, timeline
    budget = options.budget.resolve(timeline.peak_bytes)
    if timeline.peak_bytes > budget:
        raise BudgetError(
            f"the {decision.solver} strategy peaks at {format_bytes(timeline.peak_bytes)}, "
            f"over the budget of {format_bytes(budget)}; use solver='auto' to plan "
            "within the budget", floor_bytes=None)
    return replace(decision, budget_bytes=budget), rewritten, timeline

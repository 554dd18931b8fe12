"""Strategies that decide what to save. Every strategy returns a Decision;
``solve`` picks one from the options and applies the budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..errors import BudgetError
from ..options import Options, format_bytes
from ..types import Decision, Profile, Tag
from .baselines import solve_recompute_all, solve_save_all
from .mincut import solve_mincut

STRATEGIES = {
    "mincut": solve_mincut,
    "save_all": solve_save_all,
    "recompute_all": solve_recompute_all,
}

# evaluate(decision) -> (rewritten graphs, memory timeline)
Evaluate = Callable[[Decision], tuple]


def solve(profile: Profile, tags: dict[str, Tag], evaluate: Evaluate, options: Options):
    """Return (decision, rewritten, timeline) for the options' solver and budget."""
    if options.solver in ("save_all", "recompute_all"):
        decision = STRATEGIES[options.solver](profile, tags)
        rewritten, timeline = evaluate(decision)
        return _check_budget(decision, rewritten, timeline, options, None)
    runtime_optimal = solve_mincut(profile, tags)
    rewritten, timeline = evaluate(runtime_optimal)
    if options.budget is None:
        return runtime_optimal, rewritten, timeline
    budget = options.budget.resolve(timeline.peak_bytes)
    if timeline.peak_bytes <= budget:
        return replace(runtime_optimal, budget_bytes=budget), rewritten, timeline
    from .budgeted import solve_budgeted  # the budgeted solvers
    return solve_budgeted(profile, tags, evaluate, budget, options.solver,
                          runtime_optimal=(runtime_optimal, rewritten, timeline))


def _check_budget(decision, rewritten, timeline, options, _):
    if options.budget is None:
        return decision, rewritten, timeline
    budget = options.budget.resolve(timeline.peak_bytes)
    if timeline.peak_bytes > budget:
        raise BudgetError(
            f"the {decision.solver} strategy peaks at {format_bytes(timeline.peak_bytes)}, "
            f"over the budget of {format_bytes(budget)}; use solver='auto' to plan "
            "within the budget", floor_bytes=None)
    return replace(decision, budget_bytes=budget), rewritten, timeline

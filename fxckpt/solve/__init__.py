"""Strategies that decide what to save. Every strategy sees a Problem (numbers,
not a graph) and returns a Decision; ``solve`` picks one from the options
and applies the budget."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from torch.utils.checkpoint import CheckpointPolicy

from ..bandwidth import offload_bandwidth
from ..errors import BudgetError
from ..options import Options, format_bytes
from ..types import Decision, Profile, Tag
from .baselines import per_block, recompute_all, save_all, sqrt_segments
from .budgeted import solve_budgeted
from .mincut import runtime_optimal
from .problem import build_problem

_OFFLOAD_POLICIES = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)

BASELINES = {
    "save_all": save_all,
    "recompute_all": recompute_all,
    "per_block": per_block,
    "sqrt_n": sqrt_segments,
    "mincut": runtime_optimal,
}

# evaluate(decision) -> (rewritten graphs, memory timeline)
Evaluate = Callable[[Decision], tuple]


def problem_for(profile: Profile, tags: dict[str, Tag], options: Options):
    """The numeric Problem of a profiled, tagged graph. Offload is priced only
    where some value is tagged *_CPU_OFFLOAD: then the options' bandwidth, or
    the device's measured one."""
    devices = sorted({profile.nodes[name].device for name, tag in tags.items()
                      if tag.policy in _OFFLOAD_POLICIES})
    bandwidth = offload_bandwidth(devices[0], options.offload_bandwidth) if devices else None
    return build_problem(profile, tags, bandwidth=bandwidth)


def solve(profile: Profile, tags: dict[str, Tag], evaluate: Evaluate, options: Options):
    """Return (decision, rewritten, timeline) for the options' solver and budget."""
    problem = problem_for(profile, tags, options)
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

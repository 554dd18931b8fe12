"""Building a graph's frontier from its stages, and choosing under a budget."""

from __future__ import annotations

import time
from dataclasses import replace

from fxckpt.solve.candidates import Candidate, Evaluate, plan_cost, plan_key
from fxckpt.solve.effort import Effort, effort_for
from fxckpt.solve.frontier.search import Search, Stage, run_stages
from fxckpt.solve.frontier.stages import STAGES
from fxckpt.solve.local_search import step_plans
from fxckpt.solve.problem import Problem
from fxckpt.solve.select import Fits, select
from fxckpt.types import Decision


def pareto_frontier(problem: Problem, evaluate: Evaluate, solver: str, runtime_optimal,
                    *, again_from_seeds: bool = True, effort: Effort | None = None,
                    stages: tuple[Stage, ...] = STAGES) -> list[Candidate]:
    """Plans on the exact peak / time cost frontier, lowest peak first.

    Args:
        problem: the graph's numbers (solve/problem.py).
        evaluate: decision -> (rewritten, timeline), the exact memory model.
        solver: "auto", "fast" or "ilp": the strategy the solver stages use.
        runtime_optimal: (decision, rewritten, timeline) of the plan without
            a budget; the frontier's top and its first plan.
        again_from_seeds: values recomputed again start from the region
            seeds too (not where a compiler reorders and fuses the copies:
            Inductor).
        effort: how hard each stage searches; by default by graph size
            (solve/effort.py).
        stages: the stages run, in order (frontier/stages.py).

    Returns:
        The candidates no other beats on both exact peak and cost.
    """
    # Stages often land on the same plan: each distinct plan is rewritten
    # and simulated once.
    evaluated: dict[tuple, tuple] = {plan_key(runtime_optimal[0]): runtime_optimal[1:]}

    def candidate(decision: Decision) -> Candidate:
        key = plan_key(decision)
        if key not in evaluated:
            evaluated[key] = evaluate(decision)
        return Candidate(decision, *evaluated[key], plan_cost(problem, decision))

    search = Search(base=problem, proxy=problem, candidate=candidate, solver=solver,
                    effort=effort or effort_for(problem.n),
                    again_from_seeds=again_from_seeds)
    top = Candidate(*runtime_optimal, plan_cost(problem, runtime_optimal[0]))
    return run_stages(stages, search, [top])


def solve_budgeted(problem: Problem, evaluate: Evaluate, budget: int, solver: str, *,
                   runtime_optimal, frontier: list[Candidate] | None = None):
    """(decision, rewritten, timeline) of the plan ``Fits(budget)`` selects
    (solve/select.py) from ``frontier``, built here where not given;
    ``runtime_optimal`` is (decision, rewritten, timeline) of the plan
    without a budget."""
    start = time.perf_counter()
    if frontier is None:
        frontier = pareto_frontier(problem, evaluate, solver, runtime_optimal)
    seconds = time.perf_counter() - start
    top = Candidate(*runtime_optimal, plan_cost(problem, runtime_optimal[0]))
    chosen = select(frontier, Fits(budget), runtime_optimal=top,
                    inside=lambda lower, upper, below: step_plans(problem, evaluate, lower,
                                                                  upper, below))
    decision = replace(chosen.decision, budget_bytes=budget, solve_seconds=seconds)
    return decision, chosen.rewritten, chosen.timeline

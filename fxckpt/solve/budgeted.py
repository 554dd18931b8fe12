"""Planning under a budget: pick a strategy, check its plan against the exact
memory model, tighten and retry where the proxy was optimistic, and refuse
with the smallest feasible budget when nothing fits."""

from __future__ import annotations

import time

import numpy as np

from ..errors import BudgetError
from ..options import format_bytes
from .baselines import per_block, recompute_all, sqrt_segments
from .fast import solve_fast
from .ilp import Infeasible, solve_ilp
from .problem import Problem, to_decision

# solver="auto" uses the exact ILP up to this many forward values.
ILP_MAX_VALUES = 400
_RETRIES = 10


def solve_budgeted(problem: Problem, evaluate, budget: int, solver: str, *,
                   runtime_optimal_peak: int):
    strategy = _pick(solver, problem)
    start = time.perf_counter()
    target = float(budget)
    for _ in range(_RETRIES):
        try:
            saved, recomputed, gap = strategy(problem, target)
        except Infeasible:
            break
        decision = to_decision(problem, saved, recomputed, solver=strategy.__name__,
                               seconds=time.perf_counter() - start, gap=gap,
                               budget_bytes=budget)
        rewritten, timeline = evaluate(decision)
        if timeline.peak_bytes <= budget:
            return decision, rewritten, timeline
        # The proxy under-estimated this plan's peak: learn this plan's
        # lifetimes, and ask for that much less.
        problem = problem.refined(recomputed)
        target -= (timeline.peak_bytes - budget) * 0.5 + 1
    raise _budget_error(problem, evaluate, budget, runtime_optimal_peak)


def _pick(solver: str, problem: Problem):
    if solver == "ilp" or (solver == "auto" and problem.n <= ILP_MAX_VALUES):
        return _ilp
    return _fast


def _ilp(problem, target):
    return solve_ilp(problem, target)


def _fast(problem, target):
    saved, recomputed = solve_fast(problem, target)
    return saved, recomputed, None


_ilp.__name__, _fast.__name__ = "ilp", "fast"


def floor_plan(problem: Problem, evaluate):
    """The least-memory plan among the reference strategies (recompute all,
    per block, sqrt(n) segments), by exact simulation."""
    candidates = [recompute_all(problem), per_block(problem), sqrt_segments(problem)]
    evaluated = [(d, *evaluate(d)) for d in candidates]
    return min(evaluated, key=lambda e: e[2].peak_bytes)


def _budget_error(problem, evaluate, budget, runtime_optimal_peak) -> BudgetError:
    decision, rewritten, timeline = floor_plan(problem, evaluate)
    floor = timeline.peak_bytes
    what = dominated_by(rewritten, timeline)
    return BudgetError(
        f"no plan fits a budget of {format_bytes(budget)} for this graph: the smallest "
        f"feasible budget is {format_bytes(floor)} (the runtime-optimal plan peaks at "
        f"{format_bytes(runtime_optimal_peak)}). At that floor the peak is at "
        f"{timeline.peak_at}, dominated by {what}. Raise the budget to at least "
        f"{floor} bytes, or shrink the batch.",
        floor_bytes=floor, dominated_by=what)


def dominated_by(rewritten, timeline) -> str:
    """Say what the memory live at the peak is made of."""
    from ..memory import breakdown

    parts, largest, largest_bytes = breakdown(
        rewritten.forward.graph, rewritten.backward.graph, timeline.peak_at)
    total = sum(parts.values()) or 1
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{name} {format_bytes(b)} ({b / total:.0%})" for name, b in ranked[:3]
                      if b > 0) or "nothing measurable"
    return f"{kinds}; the largest single value is {largest} ({format_bytes(largest_bytes)})"

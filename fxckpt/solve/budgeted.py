"""Planning under a budget: pick a strategy, check its plan against the exact
memory model, tighten and retry where the proxy was optimistic, and refuse
with the smallest feasible budget when nothing fits."""

from __future__ import annotations

import time
from dataclasses import replace

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
_FLOOR_STEPS = 12


def solve_budgeted(problem: Problem, evaluate, budget: int, solver: str, *,
                   runtime_optimal):
    """``runtime_optimal`` is (decision, rewritten, timeline) of the plan
    without a budget; the caller has found it over budget."""
    strategy = _pick(solver, problem)
    problem_at_start = problem
    start = time.perf_counter()
    target = float(budget)
    tried = []
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
        tried.append((decision, rewritten, timeline))
        # The proxy under-estimated this plan's peak: learn this plan's
        # lifetimes, and ask for that much less.
        problem = problem.refined(recomputed)
        target -= (timeline.peak_bytes - budget) * 0.5 + 1
    # Nothing the search found fits. The floor search below does not depend
    # on the budget, so the floor it names is always met when asked for.
    floor = lowest_peak(problem_at_start, evaluate, runtime_optimal)
    fitting = [t for t in tried + [floor] if t[2].peak_bytes <= budget]
    if fitting:
        decision, rewritten, timeline = min(
            fitting, key=lambda t: problem.recompute_cost(_mask(problem, t[0].recomputed)))
        return replace(decision, budget_bytes=budget), rewritten, timeline
    raise _budget_error(floor, budget, runtime_optimal[2].peak_bytes)


def lowest_peak(problem: Problem, evaluate, runtime_optimal):
    """The plan with the lowest exact peak fxckpt can find: the reference
    strategies, then the fast solver asked for ever less memory."""
    found = [runtime_optimal] + [(d, *evaluate(d)) for d in _references(problem)]
    best = min(found, key=lambda t: t[2].peak_bytes)
    target = float(best[2].peak_bytes)
    for _ in range(_FLOOR_STEPS):
        target *= 0.93
        try:
            saved, recomputed = solve_fast(problem, target)
        except Infeasible:
            break
        decision = to_decision(problem, saved, recomputed, solver="fast", seconds=0.0,
                               gap=None, budget_bytes=None)
        candidate = (decision, *evaluate(decision))
        if candidate[2].peak_bytes < best[2].peak_bytes:
            best = candidate
        problem = problem.refined(recomputed)
    return best


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


def _references(problem: Problem):
    return [recompute_all(problem), per_block(problem), sqrt_segments(problem)]


def _mask(problem: Problem, names) -> np.ndarray:
    return np.array([name in names for name in problem.names], dtype=bool)


def _budget_error(floor_plan, budget, runtime_optimal_peak) -> BudgetError:
    _, rewritten, timeline = floor_plan
    floor = timeline.peak_bytes
    what = dominated_by(rewritten, timeline)
    return BudgetError(
        f"no plan fits a budget of {format_bytes(budget)} for this graph: the smallest "
        f"feasible budget is {format_bytes(floor)} ({floor} bytes; the runtime-optimal "
        f"plan peaks at {format_bytes(runtime_optimal_peak)}). At that floor the peak is "
        f"at {timeline.peak_at}, made of {what}. Raise the budget to at least {floor} "
        "bytes, or shrink the batch.",
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

"""Planning under a budget, through the graph's trade-off frontier.

A strategy (the exact ILP or the fast solver) is asked for plans at a
descending series of memory targets below the runtime-optimal plan's peak;
every plan is checked against the exact memory model (the proxy the
strategies optimise can be off either way), and the reference strategies
join in. The plans no other plan beats on both exact peak and time cost
(recompute, plus transfers where values are offloaded) form the frontier. A budget then takes the cheapest frontier plan whose
exact peak fits it.

Because the frontier does not depend on the budget:
* a larger budget never costs more recompute, and never yields a lower
  peak (along a frontier, cheaper means more memory);
* the floor named by BudgetError, the frontier's lowest peak, is always met
  when asked for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..errors import BudgetError
from ..options import format_bytes
from ..types import Decision
from .baselines import per_block, recompute_all, sqrt_segments
from .fast import solve_fast
from .ilp import Infeasible, solve_ilp
from .problem import Problem, to_decision

# solver="auto" uses the exact ILP up to this many forward values.
ILP_MAX_VALUES = 400
# Targets step down geometrically from the runtime-optimal peak.
_TARGET_RATIO = 0.96
_MAX_TARGETS = 16
# Each target's plan is rewritten and simulated exactly, which costs time in
# proportion to the graph: large graphs get fewer targets.
_TARGET_WORK = 40_000
_STALLS_BEFORE_STOP = 3


@dataclass(frozen=True)
class Candidate:
    decision: Decision
    rewritten: object
    timeline: object
    cost: float

    @property
    def peak(self) -> int:
        return self.timeline.peak_bytes


def solve_budgeted(problem: Problem, evaluate, budget: int, solver: str, *,
                   runtime_optimal):
    """``runtime_optimal`` is (decision, rewritten, timeline) of the plan
    without a budget."""
    start = time.perf_counter()
    frontier = pareto_frontier(problem, evaluate, solver, runtime_optimal)
    seconds = time.perf_counter() - start
    fitting = [c for c in frontier if c.peak <= budget]
    if not fitting:
        raise _budget_error(frontier[0], budget, runtime_optimal[2].peak_bytes)
    chosen = min(fitting, key=lambda c: (c.cost, c.peak))
    decision = replace(chosen.decision, budget_bytes=budget, solve_seconds=seconds)
    return decision, chosen.rewritten, chosen.timeline


def pareto_frontier(problem: Problem, evaluate, solver: str, runtime_optimal
                    ) -> list[Candidate]:
    """Plans on the exact peak / time cost frontier, lowest peak first."""
    strategy = _pick(solver, problem)

    def candidate(decision: Decision) -> Candidate:
        rewritten, timeline = evaluate(decision)
        return Candidate(decision, rewritten, timeline, _cost(problem, decision))

    found = [Candidate(*runtime_optimal, _cost(problem, runtime_optimal[0]))]
    found += [candidate(d) for d in (recompute_all(problem), per_block(problem),
                                     sqrt_segments(problem))]

    def solved(target: float) -> Candidate:
        started = time.perf_counter()
        saved, recomputed, offloaded, gap = strategy(problem, target)
        return candidate(to_decision(
            problem, saved, recomputed, offloaded, solver=strategy.__name__,
            seconds=time.perf_counter() - started, gap=gap, budget_bytes=None))

    target = float(found[0].peak)
    if problem.can_offload.any():
        # Offload costs transfer time, so the runtime-optimal plan (which
        # follows every offload tag) is not the cheapest one: the frontier
        # also reaches up to the cheapest plan, whatever its peak.
        found.append(solved(np.inf))
        target = max(target, found[-1].peak / _TARGET_RATIO)
    lowest, stalls = min(c.peak for c in found), 0
    for _ in range(max(4, min(_MAX_TARGETS, _TARGET_WORK // max(problem.n, 1)))):
        target *= _TARGET_RATIO
        try:
            found.append(solved(target))
        except Infeasible:
            break
        # Follow recompute chains this plan uses from now on: the proxy only
        # grows more cautious, so targets below stay honest.
        problem = problem.refined(_mask(problem, found[-1].decision.recomputed))
        # Stalled: aiming below the lowest peak found, and not getting there.
        stalls = stalls + 1 if target < lowest <= found[-1].peak else 0
        lowest = min(lowest, found[-1].peak)
        if stalls >= _STALLS_BEFORE_STOP:
            break
    return _non_dominated(found)


def _non_dominated(found: list[Candidate]) -> list[Candidate]:
    frontier: list[Candidate] = []
    for c in sorted(found, key=lambda c: (c.peak, c.cost)):
        if not frontier or c.cost < frontier[-1].cost:
            frontier.append(c)
    return frontier


def _pick(solver: str, problem: Problem):
    if solver == "ilp" or (solver == "auto" and problem.n <= ILP_MAX_VALUES):
        return _ilp
    return _fast


def _ilp(problem, target):
    return solve_ilp(problem, target)


def _fast(problem, target):
    return (*solve_fast(problem, target), None)


_ilp.__name__, _fast.__name__ = "ilp", "fast"


def _cost(problem: Problem, decision: Decision) -> float:
    """Seconds the plan adds: recompute and offload transfers."""
    return problem.plan_cost(_mask(problem, decision.recomputed),
                             _mask(problem, decision.offloaded))


def _mask(problem: Problem, names) -> np.ndarray:
    return np.array([name in names for name in problem.names], dtype=bool)


def _budget_error(floor: Candidate, budget, runtime_optimal_peak) -> BudgetError:
    what = dominated_by(floor.rewritten, floor.timeline) if floor.rewritten is not None \
        else "values the memory model could not break down"
    return BudgetError(
        f"no plan fits a budget of {format_bytes(budget)} for this graph: the smallest "
        f"feasible budget is {format_bytes(floor.peak)} ({floor.peak} bytes; the "
        f"runtime-optimal plan peaks at {format_bytes(runtime_optimal_peak)}). At that "
        f"floor the peak is at {floor.timeline.peak_at}, made of {what}. Raise the "
        f"budget to at least {floor.peak} bytes, or shrink the batch.",
        floor_bytes=floor.peak, dominated_by=what)


def dominated_by(rewritten, timeline) -> str:
    """Say what the memory live at the peak is made of."""
    from ..memory import breakdown

    parts, largest, largest_bytes = breakdown(
        rewritten.forward.graph, rewritten.backward.graph, timeline.peak_at,
        fused=timeline.fused)
    total = sum(parts.values()) or 1
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{name} {format_bytes(b)} ({b / total:.0%})" for name, b in ranked[:3]
                      if b > 0) or "nothing measurable"
    return f"{kinds}; the largest single value is {largest} ({format_bytes(largest_bytes)})"

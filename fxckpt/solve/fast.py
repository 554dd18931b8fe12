"""The fast strategy: Lagrangian min-cuts, then a greedy fill.

For a price per byte ``lam``, the minimum cut with saving weight lam * size
and recompute weight cost (+ a penalty on user preferences) is the cheapest
plan at that price. Bisecting on lam finds the cheapest such plan whose proxy
peak fits the budget. Cut plans are corners of the cost/memory trade-off, so
the budget usually leaves room: the greedy fill then saves, one at a time,
the recomputed value with the most recompute cost per byte that still fits,
re-deriving what backward must compute after each choice.
"""

from __future__ import annotations

import numpy as np

from .cut import min_cut
from .ilp import Infeasible
from .problem import Problem, computed_in_backward

_BISECTION_STEPS = 24
_FILL_CANDIDATES = 64


def solve_fast(problem: Problem, budget: float) -> tuple[np.ndarray, np.ndarray]:
    recompute_weight = _recompute_weight(problem)

    def plan(lam: float):
        saved = min_cut(problem, lam * problem.size + 1e-12, recompute_weight
                        + lam * problem.replay)
        return saved, computed_in_backward(problem, saved)

    low, high = 0.0, 1.0
    best = plan(high)
    while problem.peak(*best) > budget:
        if high > 1e18:
            raise Infeasible("no cut plan fits the budget under the memory model")
        low, high = high, high * 1e3
        best = plan(high)
    for _ in range(_BISECTION_STEPS):
        mid = np.sqrt(max(low, 1e-30) * high) if low > 0 else high / 1e3
        candidate = plan(mid)
        if problem.peak(*candidate) <= budget:
            high, best = mid, candidate
        else:
            low = mid
        if low > 0 and high / low < 1.01:
            break
    return _fill(problem, budget, *best)


def _recompute_weight(problem: Problem) -> np.ndarray:
    penalty = 10.0 * (float(problem.cost.sum()) + 1e-9) + 1.0
    return problem.cost + penalty * problem.prefer_save + 1e-12


def _fill(problem: Problem, budget: float, saved: np.ndarray, recomputed: np.ndarray):
    """Save recomputed values back while the budget allows, dearest first."""
    saved, recomputed = saved.copy(), recomputed.copy()
    tried: set[int] = set()
    while True:
        candidates = [i for i in np.flatnonzero(recomputed & problem.can_save)
                      if i not in tried and problem.cost[i] > 0]
        if not candidates:
            return saved, recomputed
        candidates.sort(key=lambda i: -problem.cost[i] / (problem.size[i] + 1.0))
        for i in candidates[:_FILL_CANDIDATES]:
            tried.add(i)
            trial = saved.copy()
            trial[i] = True
            trial_recomputed = computed_in_backward(problem, trial)
            # Inputs of a value no longer recomputed may no longer need saving.
            trial &= problem.needed | _read_by(problem, trial_recomputed)
            if problem.peak(trial, trial_recomputed) <= budget and \
                    problem.recompute_cost(trial_recomputed) < problem.recompute_cost(recomputed):
                saved, recomputed = trial, trial_recomputed
                break
        else:
            return saved, recomputed


def _read_by(problem: Problem, computed: np.ndarray) -> np.ndarray:
    read = np.zeros(problem.n, dtype=bool)
    for i in np.flatnonzero(computed):
        read[problem.parents[i]] = True
    return read

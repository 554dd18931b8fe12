"""Property tests on random planning problems (numbers, no graphs): every
strategy's plan is runnable, budgeted strategies stay within budget under the
memory model, the ILP is never beaten, and cost never rises with the budget."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxckpt.errors import BudgetError
from fxckpt.solve import BASELINES
from fxckpt.solve.budgeted import solve_budgeted
from fxckpt.solve.fast import solve_fast
from fxckpt.solve.ilp import Infeasible, solve_ilp
from fxckpt.solve.mincut import runtime_optimal
from fxckpt.solve.problem import build_problem

try:
    from tests.random_graphs import random_profile
except ImportError:  # pragma: no cover
    from random_graphs import random_profile

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(min_value=0, max_value=10_000)


def _problem(seed):
    profile, tags = random_profile(seed)
    return build_problem(profile, tags)


def _masks(problem, decision):
    saved = np.array([n in decision.saved for n in problem.names])
    recomputed = np.array([n in decision.recomputed for n in problem.names])
    return saved, recomputed


def _budgets(problem, count=5):
    low = problem.peak(*_masks(problem, BASELINES["recompute_all"](problem)))
    high = problem.peak(*_masks(problem, BASELINES["save_all"](problem)))
    return sorted({float(b) for b in np.linspace(min(low, high) * 0.9, high * 1.05, count)})


def _tolerance(problem):
    return 1e-3 * float(problem.cost.sum()) + 1e-12


@SETTINGS
@given(seeds)
def test_every_strategy_returns_a_runnable_plan(seed):
    problem = _problem(seed)
    for name, strategy in BASELINES.items():
        saved, recomputed = _masks(problem, strategy(problem))
        assert problem.is_feasible(saved, recomputed) == "", name


@SETTINGS
@given(seeds)
def test_budgeted_solvers_are_feasible_within_budget_and_ilp_is_best(seed):
    problem = _problem(seed)
    tol = _tolerance(problem)
    for budget in _budgets(problem):
        try:
            saved, recomputed, gap = solve_ilp(problem, budget)
        except Infeasible:
            with pytest.raises(Infeasible):
                solve_fast(problem, budget)
            continue
        assert problem.is_feasible(saved, recomputed) == ""
        assert problem.peak(saved, recomputed) <= budget * (1 + 1e-9)
        assert gap is not None and gap <= 1e-3
        ilp_cost = problem.recompute_cost(recomputed)
        try:
            fast_saved, fast_recomputed = solve_fast(problem, budget)
        except Infeasible:
            continue
        assert problem.is_feasible(fast_saved, fast_recomputed) == ""
        assert problem.peak(fast_saved, fast_recomputed) <= budget * (1 + 1e-9)
        assert ilp_cost <= problem.recompute_cost(fast_recomputed) + tol
        for name, strategy in BASELINES.items():
            b_saved, b_recomputed = _masks(problem, strategy(problem))
            if problem.peak(b_saved, b_recomputed) <= budget and \
                    not problem.overrides(b_saved, b_recomputed):
                assert ilp_cost <= problem.recompute_cost(b_recomputed) + tol, name


@SETTINGS
@given(seeds)
def test_ilp_cost_never_increases_when_the_budget_grows(seed):
    problem = _problem(seed)
    costs = []
    for budget in _budgets(problem, count=6):
        try:
            costs.append(problem.recompute_cost(solve_ilp(problem, budget)[1]))
        except Infeasible:
            assert not costs, "feasible at a smaller budget but not at a larger one"
    tol = _tolerance(problem)
    assert all(b <= a + tol for a, b in zip(costs, costs[1:])), costs


def _proxy_evaluate(problem):
    """An evaluate() whose exact model is the proxy itself, so the budgeted
    driver can be checked without graphs."""
    def evaluate(decision):
        peak = problem.peak(*_masks(problem, decision))
        return None, SimpleNamespace(peak_bytes=int(np.ceil(peak)), peak_at="x")
    return evaluate


@SETTINGS
@given(seeds, st.sampled_from(["ilp", "fast"]))
def test_budgeted_driver_is_monotone_and_honours_or_refuses(seed, solver):
    problem = _problem(seed)
    evaluate = _proxy_evaluate(problem)
    optimal = runtime_optimal(problem)
    runtime = (optimal, *evaluate(optimal))
    results = []
    for budget in _budgets(problem, count=6):
        try:
            decision, _, timeline = solve_budgeted(problem, evaluate, int(budget), solver,
                                                   runtime_optimal=runtime)
        except BudgetError as refused:
            assert refused.floor_bytes > int(budget)
            decision, _, timeline = solve_budgeted(
                problem, evaluate, refused.floor_bytes, solver, runtime_optimal=runtime)
            assert timeline.peak_bytes <= refused.floor_bytes
            continue
        assert timeline.peak_bytes <= int(budget)
        results.append((timeline.peak_bytes,
                        problem.recompute_cost(_masks(problem, decision)[1])))
    peaks = [p for p, _ in results]
    costs = [c for _, c in results]
    assert peaks == sorted(peaks)
    assert all(b <= a for a, b in zip(costs, costs[1:]))


@SETTINGS
@given(seeds)
def test_proxy_peak_grows_with_saved_bytes(seed):
    """Saving one more value never lowers the proxy's peak."""
    problem = _problem(seed)
    saved, recomputed = _masks(problem, BASELINES["recompute_all"](problem))
    base = problem.peak(saved, recomputed)
    for i in np.flatnonzero(problem.can_save & ~saved)[:5]:
        more = saved.copy()
        more[i] = True
        assert problem.peak(more, recomputed) >= base - 1e-9

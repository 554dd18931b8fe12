"""The floor BudgetError reports is no higher than any reference strategy's
peak, and asking for it succeeds. Checked on random graphs, with the proxy as
the exact memory model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fxckpt.errors import BudgetError
from fxckpt.solve import BASELINES
from fxckpt.solve.frontier import solve_budgeted
from fxckpt.solve.runtime_optimal import runtime_optimal
from fxckpt.solve.problem import build_problem, computed_in_backward

try:
    from tests.random_graphs import random_profile
except ImportError:  # pragma: no cover
    from random_graphs import random_profile

SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(min_value=0, max_value=10_000)


def _masks(problem, decision):
    return (np.array([n in decision.saved for n in problem.names]),
            np.array([n in decision.recomputed for n in problem.names]))


def _evaluate(problem):
    def evaluate(decision):
        peak = problem.peak(*_masks(problem, decision))
        return None, SimpleNamespace(peak_bytes=int(np.ceil(peak)), peak_at="x")
    return evaluate


def _floor(problem, solver):
    evaluate = _evaluate(problem)
    optimal = runtime_optimal(problem)
    runtime = (optimal, *evaluate(optimal))
    try:
        solve_budgeted(problem, evaluate, 1, solver, runtime_optimal=runtime)
    except BudgetError as refused:
        _, _, timeline = solve_budgeted(problem, evaluate, refused.floor_bytes, solver,
                                        runtime_optimal=runtime)
        assert timeline.peak_bytes <= refused.floor_bytes
        return refused.floor_bytes
    return 1


@SETTINGS
@given(seeds, st.sampled_from(["ilp", "fast", "auto"]))
def test_floor_is_at_most_every_reference_strategy(seed, solver):
    profile, tags = random_profile(seed)
    problem = build_problem(profile, tags)
    floor = _floor(problem, solver)
    evaluate = _evaluate(problem)
    for name, strategy in BASELINES.items():
        peak = evaluate(strategy(problem))[1].peak_bytes
        assert floor <= peak, (name, floor, peak)


def _exhaustive_floor(problem) -> int:
    """The lowest proxy peak over every plan: each value that may be either
    saved or recomputed tried both ways; backward recomputes what it reads
    and is not saved, back to saved values."""
    free = np.flatnonzero(problem.can_save & problem.can_recompute)
    forced = problem.can_save & ~problem.can_recompute
    best = None
    for bits in range(1 << len(free)):
        saved = forced.copy()
        saved[free[[bool((bits >> k) & 1) for k in range(len(free))]]] = True
        recomputed = computed_in_backward(problem, saved)
        if not problem.is_feasible(saved, recomputed):  # "" when feasible
            peak = int(np.ceil(problem.peak(saved, recomputed)))
            best = peak if best is None else min(best, peak)
    assert best is not None
    return best


@settings(max_examples=25, deadline=None)
@given(seeds, st.sampled_from(["auto", "ilp", "fast"]))
def test_floor_is_the_lowest_peak_of_any_plan_on_small_graphs(seed, solver):
    """On graphs small enough to try every plan, the floor the frontier
    reports is the lowest peak any plan reaches (the proxy as the memory
    model), and asking for it succeeds (checked in ``_floor``)."""
    profile, tags = random_profile(seed, n_inputs=2, n_forward=11, n_backward=8)
    problem = build_problem(profile, tags)
    assert _floor(problem, solver) <= _exhaustive_floor(problem)

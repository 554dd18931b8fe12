"""Property tests on random planning problems (numbers, no graphs): every
strategy's plan is runnable, budgeted strategies stay within budget under the
memory model, the ILP is never beaten, and cost never rises with the budget.
Each runs with and without values tagged for CPU offload (then cost is
recompute plus transfer time, at a random bandwidth)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import LinearConstraint, milp

from fxckpt.errors import BudgetError
from fxckpt.solve import BASELINES, highs, ilp
from fxckpt.solve.frontier import solve_budgeted
from fxckpt.solve.fast import CutPlans, cut_plan, solve_fast
from fxckpt.solve.ilp import Infeasible, solve_ilp
from fxckpt.solve.runtime_optimal import runtime_optimal
from fxckpt.solve.problem import (build_problem, computed_after_saving, computed_in_backward,
                                  read_in_backward)

try:
    from tests.random_graphs import proxy_evaluate, random_profile
except ImportError:  # pragma: no cover
    from random_graphs import proxy_evaluate, random_profile

SETTINGS = settings(max_examples=25, deadline=None)
seeds = st.integers(min_value=0, max_value=10_000)
offload = st.booleans()


def _problem(seed, offload=False):
    profile, tags = random_profile(seed, offload=offload)
    # Transfer of a 64-byte unit costs about as much as an average recompute
    # (1e-6..1e-3 s), from a tenth to ten times it.
    bandwidth = 64 * 2 / 5e-4 * 10 ** np.random.default_rng(seed).uniform(-1, 1)
    return build_problem(profile, tags, bandwidth=bandwidth)


def _masks(problem, decision):
    saved = np.array([n in decision.saved for n in problem.names])
    recomputed = np.array([n in decision.recomputed for n in problem.names])
    return saved, recomputed


def _offloaded(problem, decision):
    return np.array([n in decision.offloaded for n in problem.names])


def _budgets(problem, count=5):
    low = problem.peak(*_masks(problem, BASELINES["recompute_all"](problem)))
    high = problem.peak(*_masks(problem, BASELINES["save_all"](problem)))
    return sorted({float(b) for b in np.linspace(min(low, high) * 0.9, high * 1.05, count)})


def _tolerance(problem):
    return 1e-3 * float(problem.cost.sum()) + 1e-12


@SETTINGS
@given(seeds, offload)
def test_every_strategy_returns_a_runnable_plan(seed, offload):
    problem = _problem(seed, offload)
    for name, strategy in BASELINES.items():
        decision = strategy(problem)
        saved, recomputed = _masks(problem, decision)
        assert problem.is_feasible(saved, recomputed, _offloaded(problem, decision)) == "", name


@SETTINGS
@given(seeds, offload)
def test_budgeted_solvers_are_feasible_within_budget_and_ilp_is_best(seed, offload):
    problem = _problem(seed, offload)
    tol = _tolerance(problem)
    for budget in _budgets(problem):
        try:
            saved, recomputed, offloaded, gap = solve_ilp(problem, budget)
        except Infeasible:
            with pytest.raises(Infeasible):
                solve_fast(problem, budget)
            continue
        assert problem.is_feasible(saved, recomputed, offloaded) == ""
        assert problem.peak(saved, recomputed, offloaded) <= budget * (1 + 1e-9)
        assert gap is not None and gap <= 1e-3
        ilp_cost = problem.plan_cost(recomputed, offloaded)
        try:
            fast = solve_fast(problem, budget)
        except Infeasible:
            continue
        assert problem.is_feasible(*fast) == ""
        assert problem.peak(*fast) <= budget * (1 + 1e-9)
        assert ilp_cost <= problem.plan_cost(fast[1], fast[2]) + tol
        for name, strategy in BASELINES.items():
            decision = strategy(problem)
            b_saved, b_recomputed = _masks(problem, decision)
            b_offloaded = _offloaded(problem, decision)
            if problem.peak(b_saved, b_recomputed, b_offloaded) <= budget and \
                    not problem.overrides(b_saved, b_recomputed, b_offloaded):
                assert ilp_cost <= problem.plan_cost(b_recomputed, b_offloaded) + tol, name


@SETTINGS
@given(seeds, offload)
def test_ilp_cost_never_increases_when_the_budget_grows(seed, offload):
    problem = _problem(seed, offload)
    costs = []
    for budget in _budgets(problem, count=6):
        try:
            _, recomputed, offloaded, _ = solve_ilp(problem, budget)
            costs.append(problem.plan_cost(recomputed, offloaded))
        except Infeasible:
            assert not costs, "feasible at a smaller budget but not at a larger one"
    tol = _tolerance(problem)
    assert all(b <= a + tol for a, b in zip(costs, costs[1:])), costs


@SETTINGS
@given(seeds, st.sampled_from(["ilp", "fast", "auto"]), offload)
def test_budgeted_driver_is_monotone_and_honours_or_refuses(seed, solver, offload):
    problem = _problem(seed, offload)
    evaluate = proxy_evaluate(problem)
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
                        problem.plan_cost(_masks(problem, decision)[1],
                                          _offloaded(problem, decision))))
    peaks = [p for p, _ in results]
    costs = [c for _, c in results]
    assert peaks == sorted(peaks)
    assert all(b <= a for a, b in zip(costs, costs[1:]))


@SETTINGS
@given(seeds, offload)
def test_proxy_peak_grows_with_saved_bytes(seed, offload):
    """Saving one more value never lowers the proxy's peak."""
    problem = _problem(seed, offload)
    saved, recomputed = _masks(problem, BASELINES["recompute_all"](problem))
    base = problem.peak(saved, recomputed)
    for i in np.flatnonzero(problem.can_save & ~saved)[:5]:
        more = saved.copy()
        more[i] = True
        assert problem.peak(more, recomputed) >= base - 1e-9


@SETTINGS
@given(seeds)
def test_offloading_a_saved_value_never_raises_the_proxy_peak(seed):
    """An offloaded value holds the device only in backward, from its reload
    to its last use: never more than holding it saved."""
    problem = _problem(seed, offload=True)
    decision = BASELINES["save_all"](problem)
    saved, recomputed = _masks(problem, decision)
    none = np.zeros(problem.n, dtype=bool)
    base = problem.peak(saved, recomputed, none)
    for i in np.flatnonzero(saved & problem.can_offload):
        one = none.copy()
        one[i] = True
        assert problem.peak(saved, recomputed, one) <= base + 1e-9


@SETTINGS
@given(seeds)
def test_ilp_offloads_what_must_be_and_only_what_may_be(seed):
    problem = _problem(seed, offload=True)
    for budget in _budgets(problem, count=3):
        try:
            saved, _, offloaded, _ = solve_ilp(problem, budget)
        except Infeasible:
            continue
        assert not (offloaded & ~(saved & problem.can_offload)).any()
        assert (offloaded[saved & problem.must_offload]).all()


def _weighted_saved(problem, saved):
    """The bytes the runtime-optimal cut minimises (PREFER_RECOMPUTE values
    a little dearer to save, so ties go to recomputing them)."""
    weight = np.where(problem.hint_recompute, problem.size * 1.001 + 1.0, problem.size)
    return float(weight[saved].sum())


@SETTINGS
@given(seeds)
def test_unfused_runtime_optimal_recomputes_only_what_costs_nothing_unfused(seed):
    """compiler="eager" (``fuses=False``): the runtime-optimal plan recomputes
    only values that cost nothing, that no reader needs materialised, or
    that the tags ask to recompute; it saves at least what the minimum cut
    with every recompute allowed saves (a Problem without torch's
    partitioner classes, under Inductor), and no more than saving
    everything backward reads."""
    problem = _problem(seed)
    rng = np.random.default_rng(seed)
    problem = replace(problem, unmaterialized=rng.random(problem.n) < 0.3)
    unfused = runtime_optimal(problem, fuses=False)
    fused = runtime_optimal(replace(problem, remat=None), fuses=True)
    saved, recomputed = _masks(problem, unfused)
    assert problem.is_feasible(saved, recomputed) == ""
    allowed = ((problem.cost <= 0.0) | problem.unmaterialized | problem.prefer_recompute
               | ~problem.can_save)
    assert not (recomputed & ~allowed).any()
    fused_saved, _ = _masks(problem, fused)
    assert _weighted_saved(problem, saved) >= _weighted_saved(problem, fused_saved) - 1e-6
    everything, _ = _masks(problem, BASELINES["save_all"](problem))
    assert problem.size[saved].sum() <= problem.size[everything].sum()


@SETTINGS
@given(seeds)
def test_inductor_runtime_optimal_recomputes_nothing_torch_bans(seed):
    """Under Inductor (``fuses=True``) the runtime-optimal plan is torch's
    partition: runnable, it recomputes no value torch's partitioner bans
    from recompute (views and what the tags ask aside), and holds no saved
    value backward does not read."""
    problem = _problem(seed)
    saved, recomputed = _masks(problem, runtime_optimal(problem, fuses=True))
    assert problem.is_feasible(saved, recomputed) == ""
    asked = problem.prefer_recompute | (~problem.can_save & (problem.size > 0))
    remat = problem.remat
    assert not (recomputed & remat.banned & ~remat.view & ~asked).any()
    assert not (saved & ~read_in_backward(problem, saved)).any()


@SETTINGS
@given(seeds, offload)
def test_fast_plans_do_not_depend_on_the_clock(seed, offload):
    """The fast strategy bounds its work by counts, not time: with a clock
    that runs 100 s per reading (a heavily loaded machine), it plans the
    same as with the real clock."""
    import itertools
    import time
    from unittest import mock

    problem = _problem(seed, offload)
    ticks = itertools.count()

    def slow_clock() -> float:
        return 100.0 * next(ticks)

    for budget in _budgets(problem, count=3):
        try:
            plan = solve_fast(problem, budget)
        except Infeasible:
            continue
        with mock.patch.object(time, "perf_counter", slow_clock), \
                mock.patch.object(time, "monotonic", slow_clock):
            loaded = solve_fast(problem, budget)
        assert all(np.array_equal(a, b) for a, b in zip(plan, loaded))


@SETTINGS
@given(seeds, offload, st.integers(0, 2**32 - 1))
def test_binding_stages_hold_the_peak_of_every_plan(seed, offload, plan_seed):
    """The exact programme keeps only Problem.binding_stages' memory rows:
    under any masks the live bytes peak at one of them, and of equal stages
    one stays. Random problems have dominated stages (seeds 0-7: 11 to 18
    of 37-38 kept; so do all 2,858 checked up to 10,000)."""
    problem = _problem(seed, offload)
    stages = problem.binding_stages
    assert len(stages) < len(problem.stage_base)
    # Every stage twice: one of each pair is kept.
    doubled = replace(problem, stage_saved=np.vstack([problem.stage_saved] * 2),
                      stage_recomputed=np.vstack([problem.stage_recomputed] * 2),
                      stage_base=np.concatenate([problem.stage_base] * 2))
    assert len(doubled.binding_stages) == len(stages)
    rng = np.random.default_rng(plan_seed)
    for _ in range(20):
        saved = rng.random(problem.n) < rng.random()
        recomputed = rng.random(problem.n) < rng.random()
        offloaded = saved & problem.can_offload & (rng.random(problem.n) < 0.5)
        for each in (problem, doubled):
            live = each.stage_live(saved, recomputed, offloaded)
            assert live[each.binding_stages].max() == live.max()


@SETTINGS
@given(seeds, offload, st.integers(0, 2**32 - 1))
def test_stage_bytes_of_a_move_are_the_plans_recounted(seed, offload, plan_seed):
    """Problem.moved_live (the fill's moves, weighed from their plan's stage
    bytes) equals stage_live of the moved plan to the byte, for moves of a
    few values and of many, on the problem as built and refined."""
    problem = _problem(seed, offload)
    rng = np.random.default_rng(plan_seed)

    def random_plan():
        saved = rng.random(problem.n) < rng.random()
        recomputed = rng.random(problem.n) < rng.random()
        return saved, recomputed, saved & problem.can_offload & (rng.random(problem.n) < 0.5)

    for each in (problem, problem.refined(rng.random(problem.n) < 0.5)):
        for _ in range(10):
            plan = random_plan()
            live = each.stage_live(*plan)
            flips = rng.random(problem.n) < (0.1 if rng.random() < 0.7 else 0.6)
            saved, recomputed = plan[0] ^ flips, plan[1] ^ (flips & (rng.random(problem.n) < 0.5))
            offloaded = saved & problem.can_offload & (rng.random(problem.n) < 0.5)
            moved = (saved, recomputed, offloaded)
            np.testing.assert_array_equal(each.moved_live(live, plan, moved),
                                          each.stage_live(*moved))
            assert each.moved_live(live, plan, plan) is live


@SETTINGS
@given(seeds, st.integers(0, 2**32 - 1))
def test_computed_in_backward_is_what_backward_reaches(seed, mask_seed):
    """computed_in_backward against a plain search: the values backward
    reads, and their inputs, never past a saved value."""
    problem = _problem(seed)
    rng = np.random.default_rng(mask_seed)
    for _ in range(10):
        saved = rng.random(problem.n) < rng.random()
        reached: set[int] = set()
        stack = [i for i in range(problem.n) if problem.needed[i] and not saved[i]]
        while stack:
            i = stack.pop()
            if i not in reached and not saved[i]:
                reached.add(i)
                stack.extend(int(j) for j in problem.parents[i])
        expected = np.zeros(problem.n, dtype=bool)
        expected[list(reached)] = True
        np.testing.assert_array_equal(computed_in_backward(problem, saved), expected)


@SETTINGS
@given(seeds, st.integers(0, 2**32 - 1))
def test_computed_after_saving_more_is_computed_in_backward(seed, mask_seed):
    """Saving a few more values: the walk up their chains gives what the
    whole search gives, for members computed or not."""
    problem = _problem(seed)
    rng = np.random.default_rng(mask_seed)
    for _ in range(10):
        saved = rng.random(problem.n) < rng.random()
        computed = computed_in_backward(problem, saved)
        pool = np.flatnonzero(computed) if rng.random() < 0.8 else np.arange(problem.n)
        if not len(pool):
            continue
        members = rng.choice(pool, size=min(len(pool), int(rng.integers(1, 4))), replace=False)
        more = saved.copy()
        more[members] = True
        np.testing.assert_array_equal(computed_after_saving(problem, computed, members),
                                      computed_in_backward(problem, more))


@SETTINGS
@given(seeds, st.sampled_from([1e-12, 1e-9, 1e-7, 1e-5]))
def test_cut_plans_remembered_hold_for_refined_problems(seed, lam):
    """A frontier's solves share cut plans by price (CutPlans) across the
    problem and its refinements: a refinement changes the proxy's stage
    rows, never the cut plan at a price."""
    problem = _problem(seed)
    refined = problem.refined(problem.can_recompute.astype(bool))
    assert refined is not problem
    cuts = CutPlans()
    remembered = cuts(problem, lam)
    assert cuts(refined, lam) is remembered
    for mine, fresh in zip(remembered, cut_plan(refined, lam)):
        np.testing.assert_array_equal(mine, fresh)
        assert not mine.flags.writeable


def _every_stage_row(problem, budget) -> LinearConstraint:
    """The exact programme's memory row at every stage (its own keeps only
    Problem.binding_stages), in its units."""
    movable = np.flatnonzero(problem.can_offload)
    rows = np.hstack([problem.stage_saved * problem.size,
                      problem.stage_recomputed * problem.size + problem.replay[None, :],
                      (problem.stage_recomputed - problem.stage_saved)[:, movable]
                      * problem.size[movable]])
    unit = ilp._unit(problem)
    return LinearConstraint(rows * unit, -np.inf, (budget - problem.stage_base) * unit)


@SETTINGS
@given(seeds, offload, st.floats(0.0, 1.2))
@example(8064, True, 1.125)
@example(2112, True, 0.32830831808561395)
def test_relaxation_as_running_totals_is_the_same_programme(seed, offload, position):
    """The linear relaxation's memory rows as running totals over stage
    differences (solve/ilp.py) are the dense rows: the dense optimum, with
    each total set to its row's value, meets every constraint of the totals
    programme at the same objective, and the totals programme's answer meets
    the dense rows. The two solves' objectives agree within HiGHS's
    optimality tolerance, a billionth of the largest cost coefficient (its
    totals answer can sit above the dense optimum though that is feasible
    there: seed 8064 with offload, 4.5e-4 above 312.83 on a scale of 1e6;
    seed 2112, 2.0e-4 above 0.0135)."""
    problem = _problem(seed, offload)
    top = problem.peak(np.ones(problem.n, bool) & problem.can_save, np.zeros(problem.n, bool))
    budget = float(problem.stage_base.max() + position * (top - problem.stage_base.max()))
    c, bounds = ilp._objective_and_bounds(problem)
    memory = _every_stage_row(problem, budget)
    dense = milp(c=c, integrality=np.zeros(len(c)), bounds=bounds,
                 constraints=ilp._constraints(problem, budget))
    try:
        saved, offloaded = ilp.relaxed_saved(problem, budget)
    except Infeasible:
        saved = offloaded = None
    assert (saved is None) == (dense.x is None)
    assume(saved is not None)   # what follows compares two feasible programmes
    c_totals, bounds_totals, (structure, totals) = ilp.relaxation(problem, budget)
    # The dense optimum in the totals programme.
    mapped = np.concatenate([dense.x, memory.A @ dense.x])
    scale = max(1.0, budget)
    for rows in (structure, totals):
        values = rows.A @ mapped
        assert (values >= rows.lb - 1e-9 * scale).all() and (values <= rows.ub + 1e-9 * scale).all()
    assert (mapped <= bounds_totals.ub + 1e-9 * scale).all()
    assert (mapped >= bounds_totals.lb - 1e-9 * scale).all()
    assert c_totals @ mapped == pytest.approx(dense.fun, rel=1e-12, abs=1e-9)
    # The totals programme's answer in the dense rows.
    totalled = highs.solve(c_totals, bounds_totals, [structure, totals], integral=False)
    x = totalled.x[:len(c)]
    assert (memory.A @ x <= memory.ub + 1e-6 * scale).all()
    assert c_totals @ totalled.x == pytest.approx(dense.fun, rel=0, abs=1e-9 * np.abs(c).max())
    np.testing.assert_allclose(saved, x[:problem.n], atol=1e-9)


def _tuple_op_problem():
    """x -> f0 -> pool (several outputs, a tuple: cannot be saved, costly)
    -> getitems g0, g1 (cost nothing), which backward reads."""
    from torch.utils.checkpoint import CheckpointPolicy
    from fxckpt.types import BACKWARD, FORWARD, NodeProfile, Profile, Tag

    def node(name, inputs, phase=FORWARD, **fields):
        return NodeProfile(name=name, op="aten.op.default", phase=phase, inputs=inputs,
                           storage=name, **fields)
    nodes = [NodeProfile(name="primals_1", op="input", phase=FORWARD, inputs=(), bytes=256,
                         storage="primals_1", is_input=True, not_recomputable="graph input"),
             node("f0", ("primals_1",), bytes=256, cost=1e-4),
             node("pool", ("f0",), bytes=0, cost=1e-3, is_tensor=False),
             node("g0", ("pool",), bytes=1024),
             node("g1", ("pool",), bytes=512),
             node("out", ("g0",), bytes=64, cost=1e-5),
             NodeProfile(name="tangents_1", op="input", phase=BACKWARD, inputs=(), bytes=64,
                         storage="tangents_1", is_input=True, not_recomputable="graph input"),
             node("b0", ("g0", "g1", "tangents_1"), BACKWARD, bytes=1024, cost=1e-4),
             node("b1", ("b0",), BACKWARD, bytes=256, cost=1e-4)]
    profile = Profile(nodes={n.name: n for n in nodes},
                      needed_by_backward=frozenset({"g0", "g1"}),
                      forward_outputs=("out",), backward_outputs=("b1",))
    tags = {n.name: Tag(None, "default", "default") for n in nodes if n.phase == FORWARD}
    tags["primals_1"] = Tag(CheckpointPolicy.MUST_SAVE, "graph input", "op")
    return build_problem(profile, tags)


def test_fill_ends_the_recompute_of_an_op_whose_outputs_cost_nothing():
    """Saving one value at a time never ends the recompute of an op with
    several outputs (max_pool2d_with_indices, native_layer_norm): the op
    itself cannot be saved and its getitems cost nothing. The fill saves
    the getitems together."""
    from fxckpt.solve.fast import fill
    problem = _tuple_op_problem()
    index = {name: i for i, name in enumerate(problem.names)}
    assert not problem.can_save[index["pool"]]
    recompute_all = np.zeros(problem.n, dtype=bool)
    recompute_all[index["primals_1"]] = True
    start = (recompute_all, computed_in_backward(problem, recompute_all))
    assert start[1][index["pool"]]
    # Enough memory to save the getitems instead.
    budget = max(problem.peak(*start),
                 problem.peak(_named(problem, "g0", "g1"), np.zeros(problem.n, bool)))
    saved, recomputed, offloaded = fill(problem, budget, *start, np.zeros(problem.n, bool))
    assert problem.peak(saved, recomputed, offloaded) <= budget
    assert problem.plan_cost(recomputed, offloaded) == 0.0
    assert not recomputed[index["pool"]]


def _named(problem, *names):
    return np.array([name in names for name in problem.names])


@SETTINGS
@given(seeds, offload, st.floats(min_value=0.0, max_value=0.02))
def test_repaired_plans_are_runnable_and_within_budget(seed, offload, over):
    """A plan just over the budget, repaired by recomputing values live at
    the proxy's peak: runnable and within the budget, or None."""
    from fxckpt.solve.fast import repaired
    problem = _problem(seed, offload)
    saved, recomputed = _masks(problem, BASELINES["save_all"](problem))
    plan = (saved, recomputed, problem.tagged_offload(saved))
    budget = problem.peak(*plan) / (1 + over) - 1
    fixed = repaired(problem, budget, plan)
    if fixed is not None:
        assert problem.is_feasible(*fixed) == ""
        assert problem.peak(*fixed) <= budget


@SETTINGS
@given(seeds, offload, st.floats(min_value=0.0, max_value=1.0))
def test_fill_keeps_plans_runnable_within_budget_and_never_costlier(seed, offload, position):
    """The fill, several moves a round (``_batched``), from the plan that
    recomputes everything it can: runnable, within the budget, and costing
    no more than the plan it started from."""
    from fxckpt.solve.fast import objective_of, fill
    problem = _problem(seed, offload)
    saved, recomputed = _masks(problem, BASELINES["recompute_all"](problem))
    start = (saved, recomputed, problem.tagged_offload(saved))
    low = problem.peak(*start)
    high = problem.peak(*_masks(problem, BASELINES["save_all"](problem)), problem.tagged_offload(
        _masks(problem, BASELINES["save_all"](problem))[0]))
    budget = low + position * max(high - low, 0.0)
    plan = fill(problem, budget, *start)
    assert problem.is_feasible(*plan) == ""
    assert problem.peak(*plan) <= max(budget, low)
    price = objective_of(problem)
    assert price(*plan) <= price(*start) + 1e-15


@SETTINGS
@given(seeds, offload, st.floats(min_value=0.0, max_value=1.0))
@example(47, False, 0.3)
def test_fast_plan_is_never_costlier_than_its_cut_plan_filled(seed, offload, position):
    """Whatever the cheapest candidate before the fill, the fast solver
    fills the cut plan too and keeps the cheaper result: its plan costs no
    more than the Lagrangian cut plan within the budget, filled. (Without
    the exact programme's short search, which on graphs this small would
    find the best plan whatever the fill did: graphs of over
    ``_POLISH_MAX_VALUES`` values plan without it.)"""
    from fxckpt.solve import fast
    problem = _problem(seed, offload)
    budgets = _budgets(problem)
    budget = budgets[0] + position * (budgets[-1] - budgets[0])
    try:
        cut = fast._with_offload(problem, budget,
                                 *fast._cut_plan(problem, budget, CutPlans()))
    except Infeasible:
        cut = None
    assume(cut is not None and problem.peak(*cut) <= budget)
    price = fast.objective_of(problem)
    filled = fast.fill(problem, budget, *cut)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "_POLISH_MAX_VALUES", 0)
        plan = solve_fast(problem, budget)
    assert price(*plan) <= price(*filled) + 1e-15


@SETTINGS
@given(seeds, offload, st.floats(min_value=0.0, max_value=1.0))
@example(19, False, 0.1)
@example(21, False, 0.5)
def test_fast_plan_is_never_costlier_than_a_near_miss_repaired(seed, offload, position):
    """A rounded plan just over the budget and cheaper than every candidate
    that fits is repaired and joins them: the fast solver's plan costs no
    more than the cheapest such near miss, repaired (``_REPAIR_MISSES``
    of them are)."""
    from fxckpt.solve import fast
    problem = _problem(seed, offload)
    budgets = _budgets(problem)
    budget = budgets[0] + position * (budgets[-1] - budgets[0])
    price = fast.objective_of(problem)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "_POLISH_MAX_VALUES", 0)
        try:
            plan = solve_fast(problem, budget)
        except Infeasible:
            plan = None
        assume(plan is not None)
        rounded = fast._rounded_plans(problem, budget, ilp.Relaxations())
    try:
        cut = fast._with_offload(problem, budget, *fast._cut_plan(problem, budget, CutPlans()))
        fits = [c for c in rounded + [cut] if problem.peak(*c) <= budget]
    except Infeasible:
        fits = [c for c in rounded if problem.peak(*c) <= budget]
    assume(fits)
    misses = sorted((c for c in rounded if problem.peak(*c) > budget
                     and price(*c) < min(price(*f) for f in fits)), key=lambda c: price(*c))
    fixed = fast.repaired(problem, budget, misses[0]) if misses else None
    if fixed is not None:
        assert price(*plan) <= price(*fixed) + 1e-15



@SETTINGS
@given(seeds, offload, st.lists(st.floats(min_value=0.0, max_value=1.1), min_size=2, max_size=6),
       st.integers(min_value=0, max_value=5))
def test_relaxations_in_series_reach_each_relaxations_optimum(seed, offload, positions,
                                                               refine_at):
    """A series of relaxations, each going on from the last's basis (budgets
    up and down, and a refinement of the problem part way: then a new
    programme of the same shape starting from that basis), reaches at every
    budget what solving anew reaches: infeasible exactly when that is, else
    a point of the same objective that meets every row. The answer itself
    may differ (another optimal vertex)."""
    problem = _problem(seed, offload)
    refined = problem.refined(np.random.default_rng(seed).random(problem.n) < 0.3)
    top = problem.peak(problem.can_save.astype(bool), np.zeros(problem.n, bool))
    low = float(problem.stage_base.max())
    series = ilp.Relaxations()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ilp, "_WARM_REFINED_VALUES", 0)
        for k, position in enumerate(positions):
            current = refined if k >= refine_at else problem
            budget = low + position * (top - low)
            c, bounds, rows = ilp.relaxation(current, budget)
            anew = highs.solve(c, bounds, rows, integral=False)
            try:
                saved, offloaded = series(current, budget)
            except Infeasible:
                assert anew.x is None
                continue
            assert anew.x is not None
            point = series.point
            np.testing.assert_array_equal(saved, point[:current.n])
            scale = max(1.0, float(np.abs(c).max()))
            assert c @ point == pytest.approx(c @ anew.x, rel=1e-7, abs=1e-7 * scale)
            for constraint in rows:
                values = constraint.A @ point
                assert (values >= np.asarray(constraint.lb) - 1e-7).all()
                assert (values <= np.asarray(constraint.ub) + 1e-7).all()
            assert (point >= bounds.lb - 1e-7).all() and (point <= bounds.ub + 1e-7).all()

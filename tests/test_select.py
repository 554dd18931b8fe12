"""solve/select.py: one pure function chooses a plan from a frontier for a
request. Property tests on random frontiers (a larger request never costs
more, the floor is met when asked, fractions run from the floor to the
runtime-optimal peak), and the planner's requests against the budgets
they stand for on a zoo model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxckpt
from fxckpt.bench.ways import Step
from fxckpt.models import make_model
from fxckpt.solve.candidates import Candidate
from fxckpt.solve.select import (Fits, Floor, Fraction, NoPlanFits, RuntimeOptimal,
                                 bytes_asked, select)


def _candidate(peak: int, cost: float, name: str) -> Candidate:
    return Candidate(SimpleNamespace(name=name), None, SimpleNamespace(peak_bytes=peak), cost)


@st.composite
def frontiers(draw):
    """A frontier (peaks rising, costs falling) and its runtime-optimal plan,
    the cheapest, at the top."""
    steps = draw(st.lists(st.tuples(st.integers(1, 1000), st.floats(0.01, 10.0)),
                          min_size=1, max_size=12))
    peak, cost = draw(st.integers(1, 10_000)), sum(c for _, c in steps) + 1.0
    plans = []
    for i, (rise, fall) in enumerate(steps):
        plans.append(_candidate(peak, cost, f"p{i}"))
        peak, cost = peak + rise, cost - fall
    top = _candidate(peak, max(cost, 0.0), "top")
    return plans + [top], top


# Draws are cheap; the machine running them may not be.
_QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_QUICK
@given(frontiers(), st.integers(0, 30_000), st.integers(0, 30_000))
def test_a_larger_request_never_costs_more_or_peaks_lower(found, a, b):
    frontier, top = found
    small, large = sorted((a, b))
    try:
        low = select(frontier, Fits(small), runtime_optimal=top)
    except NoPlanFits as refused:
        assert small < frontier[0].peak and refused.floor_bytes == frontier[0].peak
        return
    high = select(frontier, Fits(large), runtime_optimal=top)
    assert low.peak <= small and high.peak <= large
    assert high.cost <= low.cost and high.peak >= low.peak


@_QUICK
@given(frontiers())
def test_the_floor_is_met_when_asked_and_below_it_nothing_fits(found):
    frontier, top = found
    floor = select(frontier, Floor(), runtime_optimal=top)
    assert floor is select(frontier, Fits(frontier[0].peak), runtime_optimal=top)
    assert floor.peak == frontier[0].peak
    with pytest.raises(NoPlanFits) as refused:
        select(frontier, Fits(frontier[0].peak - 1), runtime_optimal=top)
    assert refused.value.floor_bytes == frontier[0].peak
    assert select(frontier, Fraction(0.0), runtime_optimal=top) is floor


@_QUICK
@given(frontiers(), st.floats(0.0, 1.0))
def test_a_fraction_reads_from_the_floor_to_the_runtime_optimal_peak(found, fraction):
    frontier, top = found
    asked = bytes_asked(Fraction(fraction), frontier[0].peak, top.peak)
    assert frontier[0].peak <= asked <= top.peak
    assert select(frontier, Fraction(fraction), runtime_optimal=top) is \
        select(frontier, Fits(asked), runtime_optimal=top)
    assert select(frontier, Fraction(1.0), runtime_optimal=top).cost == top.cost
    assert select(frontier, RuntimeOptimal(), runtime_optimal=top) is top
    assert bytes_asked(RuntimeOptimal(), frontier[0].peak, top.peak) is None


def test_a_step_inside_is_weighed_only_where_the_request_falls_in_it():
    lower, upper = _candidate(100, 5.0, "lower"), _candidate(200, 1.0, "upper")
    filled = _candidate(150, 3.0, "filled")
    seen = []

    def inside(low, up, below):
        seen.append((low.decision.name, up.decision.name, below))
        return [filled]

    assert select([lower, upper], Fits(160), runtime_optimal=upper, inside=inside) is filled
    assert seen == [("lower", "upper", None)]
    assert select([lower, upper], Fits(140), runtime_optimal=upper, inside=inside) is lower
    assert select([lower, upper], Fits(250), runtime_optimal=upper, inside=inside) is upper
    assert len(seen) == 2


def test_the_planners_floor_request_is_the_floor_a_budget_error_names(reset_dynamo):
    """Planned for Floor(), a graph gets the plan whose peak a BudgetError at
    one byte names, and planned for RuntimeOptimal() the plan without a
    budget, under the options' byte budget (zoo gpt, compiler="eager")."""
    from fxckpt.options import Options
    from fxckpt.planning.capture import capture_once, compile_planned
    from fxckpt.planning.pipeline import Planner

    torch.manual_seed(0)
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    target = Step(model, loss_fn)
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(target, *inputs, budget=1, compiler="eager")
    options = Options.create(budget=1 << 30, compiler="eager")
    made = {}
    for name, request in (("floor", Floor()), ("top", RuntimeOptimal()), ("none", None)):
        planner = Planner(replace_budget(options, name), request=request)
        capture_once(target, inputs, lambda gm, ins: compile_planned(gm, ins, planner))
        made[name] = planner.plans[-1]
    assert made["floor"].peak_bytes == refused.value.floor_bytes
    assert made["top"].fingerprint == made["none"].fingerprint
    assert made["floor"].peak_bytes < made["top"].peak_bytes


def replace_budget(options, name):
    """The options without a budget for the plan made without a request."""
    from dataclasses import replace

    return replace(options, budget=None) if name == "none" else options

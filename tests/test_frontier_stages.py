"""The frontier's declared stages (solve/frontier/stages.py): each only
adds plans, every plan it adds is evaluated exactly, and the list is data
a caller can shorten."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxckpt.solve.candidates import plan_key
from fxckpt.solve.frontier import STAGES, Added, Stage, without
from fxckpt.solve.problem import build_problem

try:
    from tests.random_graphs import cost_at, proxy_evaluate, proxy_frontier, random_profile
except ImportError:  # pragma: no cover
    from random_graphs import cost_at, proxy_evaluate, proxy_frontier, random_profile


def test_the_stages_in_order():
    assert [stage.name for stage in STAGES] == [
        "seeds", "sweep", "top filled", "under the lowest", "under the lowest, exact",
        "under the lowest, first proxy", "gaps", "cut plans", "cut walk",
        "recompute again", "steep steps filled", "steep steps walked down"]
    # The cut walk's plans reach recomputing again, not the fills and
    # descents, which would start from them.
    assert {s.name: s.shown_to for s in STAGES if s.shown_to is not None} == {
        "cut walk": ("recompute again",)}


def test_an_unknown_stage_is_named_with_the_stages_there_are():
    with pytest.raises(ValueError, match="no frontier stage named \\['sweeps'\\].*'sweep'"):
        without("sweeps")


def _recorded(stages, log):
    """``stages`` with what each adds recorded in ``log`` (name, plans)."""
    def wrap(stage):
        def run(search, found):
            added = stage.run(search, found)
            log.append((stage.name, list(added.plans), list(found.plans)))
            return added
        return Stage(stage.name, run, stage.shown_to)
    return tuple(wrap(stage) for stage in stages)


@settings(max_examples=10, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(["ilp", "fast", "auto"]),
       st.booleans())
def test_each_stage_only_adds_exactly_evaluated_plans(seed, solver, offload):
    """Every plan a stage adds peaks where the exact model (here the proxy,
    evaluated) puts it; the plans a stage is shown are the ones before it
    made, none dropped or changed; and each prefix of the stages gives a
    frontier no stage after it makes costlier at any budget."""
    problem = build_problem(*random_profile(seed, offload=offload),
                            bandwidth=2.5e5 if offload else None)
    evaluate = proxy_evaluate(problem)
    log: list = []
    frontier = proxy_frontier(problem, solver, stages=_recorded(STAGES, log))
    assert [name for name, _, _ in log] == [stage.name for stage in STAGES]
    made = []
    for name, plans, shown in log:
        for c in plans:
            assert c.peak == evaluate(c.decision)[1].peak_bytes, name
        # Shown: the runtime-optimal plan first, then what came before.
        assert [plan_key(c.decision) for c in shown[1:]] == [
            plan_key(c.decision) for by, c in made
            if by != "cut walk" or name == "recompute again"], name
        made += [(name, c) for c in plans]
    everything = [shown for _, _, shown in log[:1]][0][:1] + [c for _, c in made]
    assert {plan_key(c.decision) for c in frontier} <= {plan_key(c.decision)
                                                         for c in everything}
    for k in range(len(STAGES)):
        fewer = proxy_frontier(problem, solver, stages=STAGES[:k])
        for budget in sorted({c.peak for c in fewer + frontier}):
            less = cost_at(fewer, budget)
            if less is not None:
                assert cost_at(frontier, budget) <= less + 1e-15, STAGES[k].name


def test_a_stage_adding_something_else_is_named():
    problem = build_problem(*random_profile(0))
    broken = Stage("broken", lambda search, found: Added([found.plans[0].decision]))
    with pytest.raises(TypeError, match="frontier stage 'broken' added Decision"):
        proxy_frontier(problem, "fast", stages=(STAGES[0], broken))

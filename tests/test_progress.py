"""Planning time by phase, on every plan and in its rendering; progress lines
on the ``fxckpt`` logger at INFO."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxckpt
from fxckpt.planning.phases import PHASES, PhaseClock, Progress
from fxckpt.report.plan import merge_plans

pytestmark = pytest.mark.usefixtures("reset_dynamo")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def _planned(budget=0.3, batch=32):
    torch.manual_seed(0)
    backend = fxckpt.backend(compiler="eager", budget=budget)
    torch.compile(Net(), backend=backend)(torch.randn(batch, 16)).sum().backward()
    (plan,) = backend.plans
    return plan


def test_plan_records_its_planning_time_by_phase():
    plan = _planned()
    phases = dict(plan.phase_seconds)
    assert tuple(phases) == PHASES
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["solve"] > 0 and phases["rewrite"] > 0 and phases["profile"] > 0
    assert sum(phases.values()) <= plan.plan_seconds + 1e-6
    assert "planning" in str(plan) and "solve " in str(plan)
    assert "planning" in plan._repr_html_()
    merged = merge_plans([plan, plan])
    assert dict(merged.phase_seconds)["solve"] == pytest.approx(2 * phases["solve"])


def test_a_budgeted_plan_records_the_time_its_frontier_took():
    # The frontier is built before a budget selects from it: its time is
    # the plan's solve time (it read 0 when the selection was timed alone).
    # A batch no other test plans: the frontier is built here, not recalled.
    plan = _planned(batch=24)
    assert plan.budget_bytes is not None
    # Most of a budgeted plan's time is its frontier (solves, and the
    # candidates' simulation).
    assert 0.2 * plan.plan_seconds < plan.solve_seconds <= plan.plan_seconds


def test_nested_phases_are_charged_to_the_innermost():
    clock = PhaseClock()
    with clock.phase("solve"):
        with clock.phase("rewrite"):
            sum(range(200_000))
    seconds = dict(clock.recorded())
    assert seconds["rewrite"] > 0
    assert sum(seconds.values()) <= clock.elapsed()


def test_planning_logs_progress_at_info(caplog):
    with caplog.at_level(logging.INFO, logger="fxckpt"):
        plan = _planned()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("fxckpt")]
    started = [line for line in lines if line.startswith("fxckpt: planning graph")]
    finished = [line for line in lines if f"graph {plan.graph_id} planned in" in line]
    assert len(started) == 1 and "nodes" in started[0] and "budget" in started[0]
    assert len(finished) == 1 and "candidate plans" in finished[0] and "solve" in finished[0]
    assert not logging.getLogger("fxckpt").handlers


def test_nothing_is_logged_below_warning_by_default(caplog):
    with caplog.at_level(logging.WARNING):
        _planned()
    assert not [r for r in caplog.records if r.name.startswith("fxckpt")]


def test_candidates_done_are_reported_while_planning(caplog):
    progress = Progress(7, PhaseClock(), interval=0.0)
    evaluate = progress.counted(lambda decision: decision)
    with caplog.at_level(logging.INFO, logger="fxckpt"):
        assert [evaluate(d) for d in "abc"] == ["a", "b", "c"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1].startswith("fxckpt: graph 7: 3 candidate plans done")
    assert progress.candidates == 3


@pytest.mark.parametrize("enabled", [True, False])
def test_planning_pauses_the_garbage_collector_and_restores_it(enabled):
    import gc

    from fxckpt.bench.solvers import capture_joint
    from fxckpt.bench.ways import Step
    from fxckpt.options import Options
    from fxckpt.planning.pipeline import Planner

    torch.manual_seed(0)
    joint, joint_inputs, kwargs = capture_joint(Step(Net(), lambda out: out.sum()),
                                                (torch.randn(32, 16),))
    states: list[bool] = []
    planner = Planner(Options.create(compiler="eager", budget=0.3),
                      on_plan=lambda plan: states.append(gc.isenabled()))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        planner(joint, joint_inputs, **kwargs)
        after = gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert states == [False]
    assert after is enabled

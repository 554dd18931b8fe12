"""Renderings of a Plan (HTML, memory plot, DOT) and fxckpt.pareto's sweep."""

from __future__ import annotations

import html
import importlib

import pytest
import torch
from matplotlib.figure import Figure

import fxckpt
from fxckpt.bench.ways import Step
from fxckpt.models import make_model
from fxckpt.report.render import ACTION_COLOURS

# fxckpt.pareto is the function; the module it lives in:
pareto_module = importlib.import_module("fxckpt.entry.pareto")


def _gpt():
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    return Step(model, loss_fn), inputs


# compiler="eager": under Inductor the backend checks each plan against the
# code Inductor generates and may plan lower or refuse, while pareto's rows
# are the memory model's frontier (not fed back yet).
@pytest.fixture(scope="module")
def sweep():
    # An earlier test's compile of the same GPT code at other sizes would make
    # Dynamo capture this one with symbolic sizes (saved SymInts have no row).
    torch._dynamo.reset()
    step, inputs = _gpt()
    return pareto_module.pareto(step, *inputs, compiler="eager")


@pytest.fixture(scope="module")
def plan(sweep):
    """A plan that saves some values and recomputes others, under a budget."""
    chosen = [row.plan for row in sweep.rows if row.fits and row.plan.recomputed
              and row.budget_bytes is not None]
    assert chosen
    return chosen[0]


def test_html_table_has_the_rows_of_the_text(plan):
    page = plan._repr_html_()
    assert page.startswith("<div>") and "<table>" in page
    for name in plan.saved + plan.recomputed + plan.deferred:
        assert f"<td style='text-align:left'>{html.escape(name)}</td>" in page
    assert html.escape(f"{len(plan.saved)} values") in page
    assert page.count("<tr") == len(plan.entries) + 1 + len(plan.notes) + \
        len(plan.overrides) + 6 + bool(plan.phase_seconds)


def test_plot_memory_draws_the_timeline_up_to_the_peak_and_the_budget(plan):
    fig = plan.plot_memory()
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    live = lines["live bytes"]
    assert max(live.get_ydata()) == plan.peak_bytes
    assert len(live.get_ydata()) == len(plan.timeline.points) + 1
    budget = [line for label, line in lines.items() if label.startswith("budget")]
    assert budget and set(budget[0].get_ydata()) == {plan.budget_bytes}
    peak = [line for label, line in lines.items() if label.startswith("peak")]
    assert list(peak[0].get_ydata()) == [plan.peak_bytes]


def test_to_dot_colours_saved_and_recomputed_nodes(plan):
    dot = plan.to_dot()
    assert dot.startswith('digraph "fxckpt_plan_') and dot.rstrip().endswith("}")
    saved = [n for n in plan.saved if not n.startswith("rng_state")][0]
    recomputed = plan.recomputed[0]
    assert (f'"forward:{saved}" [label="{saved}", '
            f'fillcolor="{ACTION_COLOURS["saved"]}"') in dot
    assert (f'"forward:{recomputed}" [label="{recomputed}", '
            f'fillcolor="{ACTION_COLOURS["recomputed"]}"') in dot
    # Its clone in backward is coloured too.
    assert (f'"backward:{recomputed}_recomputed" [label="{recomputed}_recomputed", '
            f'fillcolor="{ACTION_COLOURS["recomputed"]}"') in dot
    planned = plan.to_dot(planned_only=True)
    assert planned.count("[label=") < dot.count("[label=")


def test_to_dot_without_graphviz_returns_the_source(plan, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "graphviz", None)   # import graphviz fails
    assert plan.to_dot(str(tmp_path / "plan")) == plan.to_dot()
    assert not list(tmp_path.iterdir())


def test_pareto_rows_are_the_plans_the_backend_picks(sweep):
    optimal = sweep.runtime_optimal
    floor = sweep.floor_bytes
    assert sweep.rows[0].budget_bytes is None and sweep.rows[0].plan.peak_bytes == \
        optimal.peak_bytes
    peaks = [p.peak_bytes for p in sweep.frontier]
    costs = [p.recompute_cost for p in sweep.frontier]
    assert peaks == sorted(peaks) and costs == sorted(costs, reverse=True)
    assert peaks[0] == floor
    step, inputs = _gpt()
    for row in sweep.rows[1:3]:
        plan = fxckpt.explain(step, *inputs, budget=row.budget_bytes, compiler="eager")
        assert (plan.peak_bytes, plan.recompute_cost, set(plan.saved)) == \
            (row.predicted_peak_bytes, row.recompute_cost, set(row.plan.saved))
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(step, *inputs, budget=1, compiler="eager")
    assert refused.value.floor_bytes == floor


def test_pareto_sweeps_many_budgets_from_one_capture(monkeypatch):
    captures = []
    real = pareto_module.compile_planned

    def counting(*args):
        captures.append(1)
        return real(*args)

    monkeypatch.setattr(pareto_module, "compile_planned", counting)
    model, inputs, loss_fn = make_model("cnn", size="tiny")
    budgets = [0.05 * k for k in range(1, 21)]
    sweep = fxckpt.pareto(Step(model, loss_fn), *inputs, budgets=budgets)
    assert len(captures) == 1
    floor, top = sweep.floor_bytes, sweep.runtime_optimal.peak_bytes
    assert [row.budget_bytes for row in sweep.rows] == [
        int(floor + b * (top - floor)) for b in budgets]
    for row in sweep.rows:
        assert row.fits == (row.budget_bytes >= sweep.floor_bytes)
        if row.fits:
            assert row.predicted_peak_bytes <= row.budget_bytes
            assert row.plan.budget_bytes == row.budget_bytes
    fitting = [row.recompute_cost for row in sweep.rows if row.fits]
    assert fitting == sorted(fitting, reverse=True)
    assert isinstance(sweep.plot(), Figure)
    assert "frontier plans" in str(sweep) and "<table>" in sweep._repr_html_()


def test_pareto_refuses_a_solver_without_budgets():
    model, inputs, loss_fn = make_model("mlp", size="tiny")
    with pytest.raises(ValueError, match="budgeted solvers"):
        fxckpt.pareto(Step(model, loss_fn), *inputs, solver="save_all")

"""The top of the frontier (solve/local_search/fill.py ``top_filled``): the
runtime-optimal plan recomputes what is cheap to recompute, which is not
what costs least at its peak. On tiny HF GPT-2 a plan peaking lower
recomputes far less, and only the exact programme's sweep found such
plans: the fast solver's frontier cost 1.095x the exact one's at the
runtime-optimal plan's peak. The runtime-optimal plan filled at its own
proxy peak gives that top to either solver.

Fills are aimed with the proxy as seen from the plan they start from
(``as_seen_from``: refined by what it recomputes, measured where it
peaks; Problem.with_stages adds stages without moving the others): on
tiny HF GPT-2 it reads the fast frontier's plans within 0.4% of the exact
model on average, where the frontier's proxy is 1.2% off."""

from __future__ import annotations

import numpy as np
import pytest

from fxckpt.solve.candidates import masks, plan_cost
from fxckpt.solve.frontier import STAGES, pareto_frontier, without
from fxckpt.solve.local_search.fill import as_seen_from

try:
    from tests.planned_graph import tiny_hf_graph
except ImportError:  # pragma: no cover
    from planned_graph import tiny_hf_graph



@pytest.fixture(scope="module")
def gpt2():
    return tiny_hf_graph("hf_gpt2")


def _at_optimal_peak(graph, solver, stages=STAGES):
    """The recompute cost of the cheapest frontier plan that peaks no
    higher than the runtime-optimal plan, over that plan's."""
    optimal, _, timeline = graph.optimal
    frontier = pareto_frontier(graph.problem, graph.estimate, solver, graph.optimal,
                               stages=stages)
    fitting = [c.cost for c in frontier if c.peak <= timeline.peak_bytes]
    return min(fitting) / plan_cost(graph.problem, optimal)


def test_the_runtime_optimal_plan_filled_tops_the_fast_frontier(gpt2):
    filled = _at_optimal_peak(gpt2, "fast")
    # Without it: the runtime-optimal plan itself, which is on the list already.
    unfilled = _at_optimal_peak(gpt2, "fast", without("top filled"))
    exact = _at_optimal_peak(gpt2, "ilp", without("top filled"))
    # Measured: 0.566 with the fill; 0.766 without, where the exact
    # programme's frontier reached 0.699.
    assert filled < 0.65, filled
    assert unfilled > 0.72, unfilled
    assert filled <= exact, (filled, exact)


def _plans(graph):
    """The fast frontier's plans a fill can start from (not recomputing again)."""
    frontier = pareto_frontier(graph.problem, graph.estimate, "fast", graph.optimal)
    return [c for c in frontier if not c.decision.copy_steps]


def test_added_stages_leave_the_others_and_read_where_plans_peak(gpt2):
    problem = gpt2.problem
    plans = _plans(gpt2)
    points = sorted({c.timeline.peak_at for c in plans} - set(problem.stage_names))
    assert points, "every plan peaks at a stage the proxy has: nothing to add"
    widened = problem.with_stages(points)
    assert len(widened.stage_names) == len(problem.stage_names) + len(points)
    assert widened.with_stages(points) is widened
    for c in plans:
        plan = masks(problem, c.decision)
        old, new = problem.stage_live(*plan), widened.stage_live(*plan)
        np.testing.assert_array_equal(new[:len(old)], old)
        # A plan peaking at an added stage reads no more there than it holds.
        if c.timeline.peak_at in points:
            at = widened.stage_names.index(c.timeline.peak_at)
            assert 0 < new[at] <= c.peak * 1.05


def test_the_proxy_seen_from_a_plan_reads_its_peak_closer(gpt2):
    problem = gpt2.problem
    plain, seen = [], []
    for c in _plans(gpt2):
        plain.append(abs(problem.peak(*masks(problem, c.decision)) - c.peak) / c.peak)
        view = as_seen_from(problem, c)
        seen.append(abs(view.peak(*masks(view, c.decision)) - c.peak) / c.peak)
    # Measured: 0.0038 against 0.0118 (18 plans).
    assert np.mean(seen) < 0.5 * np.mean(plain), (np.mean(seen), np.mean(plain))

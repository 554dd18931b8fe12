"""The top of the frontier (solve/frontier.py ``_top_filled``): the
runtime-optimal plan recomputes what is cheap to recompute, which is not
what costs least at its peak. On tiny HF GPT-2 a plan peaking lower
recomputes far less, and only the exact programme's sweep found such
plans: the fast solver's frontier cost 1.095x the exact one's at the
runtime-optimal plan's peak. The runtime-optimal plan filled at its own
proxy peak gives that top to either solver."""

from __future__ import annotations

import importlib

import pytest

from fxckpt.bench.solvers import capture_joint
from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner, problem_for
from fxckpt.solve.runtime_optimal import runtime_optimal

frontier_module = importlib.import_module("fxckpt.solve.frontier")


class _Graph(Planner):
    """Profiles and tags the joint graph; keeps the Problem, the schedule
    model's estimate and the runtime-optimal plan with its timeline."""

    def _partition(self, joint, num_fwd_outputs, static_lifetime_input_indices):
        *_, profile, tags, evaluate = self._begin(joint, num_fwd_outputs,
                                                  static_lifetime_input_indices)
        self.problem = problem_for(profile, tags, self.options)
        self.estimate = evaluate.estimate
        optimal = runtime_optimal(self.problem)
        self.optimal = (optimal, *self.estimate(optimal))


@pytest.fixture(scope="module")
def gpt2():
    model, inputs, loss_fn = make_bench_model("hf_gpt2", size="tiny")
    joint, joint_inputs, kwargs = capture_joint(Step(model, loss_fn), inputs)
    graph = _Graph(Options.create(compiler="eager", solver="fast", budget=0.5))
    graph(joint, joint_inputs, **kwargs)
    return graph


def _at_optimal_peak(graph, solver):
    """The recompute cost of the cheapest frontier plan that peaks no
    higher than the runtime-optimal plan, over that plan's."""
    optimal, _, timeline = graph.optimal
    frontier = frontier_module.pareto_frontier(graph.problem, graph.estimate, solver,
                                               graph.optimal)
    fitting = [c.cost for c in frontier if c.peak <= timeline.peak_bytes]
    return min(fitting) / frontier_module._cost(graph.problem, optimal)


def test_the_runtime_optimal_plan_filled_tops_the_fast_frontier(gpt2):
    filled = _at_optimal_peak(gpt2, "fast")
    with pytest.MonkeyPatch.context() as patch:
        # Without it: the runtime-optimal plan itself, which is on the list already.
        patch.setattr(frontier_module, "_top_filled",
                      lambda problem, candidate, optimal: candidate(optimal))
        unfilled = _at_optimal_peak(gpt2, "fast")
        exact = _at_optimal_peak(gpt2, "ilp")
    # Measured: 0.566 with the fill; 0.766 without, where the exact
    # programme's frontier reached 0.699.
    assert filled < 0.65, filled
    assert unfilled > 0.72, unfilled
    assert filled <= exact, (filled, exact)

"""A Hugging Face model from a tiny config (no weights), captured and
planned as far as its numeric Problem: for tests of the solvers on graphs
they were not tuned on."""

from __future__ import annotations

from fxckpt.bench.solvers import capture_joint
from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner, problem_for
from fxckpt.solve.runtime_optimal import runtime_optimal


class PlannedGraph(Planner):
    """Profiles and tags the joint graph; keeps the Problem, the schedule
    model's estimate and the runtime-optimal plan with its timeline."""

    def _partition(self, joint, num_fwd_outputs, static_lifetime_input_indices):
        *_, profile, tags, evaluate = self._begin(joint, num_fwd_outputs,
                                                  static_lifetime_input_indices)
        self.problem = problem_for(profile, tags, self.options)
        self.estimate = evaluate.estimate
        optimal = runtime_optimal(self.problem)
        self.optimal = (optimal, *self.estimate(optimal))


def tiny_hf_graph(name: str) -> PlannedGraph:
    """``name`` (a zoo name: "hf_gpt2", "hf_llama") planned, with the fast
    solver and a budget, up to its Problem."""
    model, inputs, loss_fn = make_bench_model(name, size="tiny")
    joint, joint_inputs, kwargs = capture_joint(Step(model, loss_fn), inputs)
    graph = PlannedGraph(Options.create(compiler="eager", solver="fast", budget=0.5))
    graph(joint, joint_inputs, **kwargs)
    return graph

"""The stages strung together: joint graph -> profile -> tags -> decision ->
rewrite -> verify -> forward and backward graphs, plus the Plan that explains
them. ``Planner`` is what AOTAutograd calls as its partition function."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from .memory import simulate
from .options import Options
from .passes.profile import profile_joint_graph
from .passes.rewrite import rewrite
from .passes.tag import tag_forward_values
from .passes.verify import verify_decision, verify_rewrite
from .solve import problem_for, solve
from .solve.budgeted import pareto_frontier
from .solve.mincut import runtime_optimal
from .solve.common import run_in_forward
from .types import Decision, Plan, PlanEntry, Profile, Tag

_graph_ids = itertools.count()


class Planner:
    """A partition function for AOTAutograd that plans, rewrites and records.

    ``plans`` collects one Plan per graph partitioned; ``on_plan`` (optional)
    is called with each.
    """

    def __init__(self, options: Options, *, on_plan: Callable[[Plan], Any] | None = None,
                 node_policy=None, num_lifted_params: int = 0) -> None:
        self.options = options
        # AOTAutograd puts a module's parameters and buffers first among the
        # primals; outside Dynamo it does not report them as static, so the
        # caller says how many there are.
        self.num_lifted_params = num_lifted_params
        self.node_policy = node_policy
        self.plans: list[Plan] = []
        self.on_plan = on_plan

    def __call__(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int,
                 static_lifetime_input_indices=None, **_ignored):
        start = time.perf_counter()
        profile, tags, evaluate = self._analyse(joint, num_fwd_outputs,
                                                static_lifetime_input_indices)
        decision, rewritten, timeline = solve(profile, tags, evaluate, self.options)
        plan = self._finish(profile, tags, decision, rewritten, timeline, start=start)
        self.plans.append(plan)
        if self.on_plan is not None:
            self.on_plan(plan)
        return rewritten.forward, rewritten.backward

    def _analyse(self, joint: fx.GraphModule, num_fwd_outputs: int, static_indices):
        """Profile and tag the joint graph; return them with the function
        that rewrites it by a Decision and simulates the result."""
        static = set(static_indices or ()) | set(range(self.num_lifted_params))
        profile = profile_joint_graph(joint, num_fwd_outputs=num_fwd_outputs,
                                      static_input_indices=static)
        tags = tag_forward_values(joint, profile, policy=self.node_policy)

        def evaluate(decision: Decision):
            rewritten = rewrite(joint, profile, decision, num_fwd_outputs=num_fwd_outputs)
            return rewritten, simulate(rewritten.forward.graph, rewritten.backward.graph,
                                       fused=self.options.compiler == "inductor")

        return profile, tags, evaluate

    def _finish(self, profile, tags, decision, rewritten, timeline, *, start: float,
                graph_id: int | None = None) -> Plan:
        verify_decision(profile, tags, decision)
        verify_rewrite(profile, rewritten)
        return make_plan(profile, tags, decision, rewritten, timeline,
                         budget_bytes=decision.budget_bytes,
                         graph_id=next(_graph_ids) if graph_id is None else graph_id,
                         seconds=time.perf_counter() - start)


@dataclass(frozen=True)
class Frontier:
    """Every plan a budget can select for one graph (see fxckpt.pareto).

    ``plans`` are the frontier of solve/budgeted.py, lowest peak first, each
    recomputing strictly less than the one before; ``runtime_optimal`` is the
    plan without a budget."""

    runtime_optimal: Plan
    plans: tuple[Plan, ...]
    seconds: float            # profile, tag, and the whole frontier, wall time

    def select(self, budget_bytes: int) -> Plan | None:
        """The plan the backend picks at ``budget_bytes``, as
        solve_budgeted does: the cheapest frontier plan that fits (None if
        none does). Along the frontier, cheaper means a higher peak, so that
        is the last plan that fits."""
        fitting = [plan for plan in self.plans if plan.peak_bytes <= budget_bytes]
        return fitting[-1] if fitting else None


class FrontierPlanner(Planner):
    """A partition function that plans the whole budget frontier of each
    graph, once, and partitions by the runtime-optimal plan. ``frontiers``
    gets one Frontier per graph."""

    def __init__(self, options: Options, **kwargs) -> None:
        super().__init__(options, **kwargs)
        self.frontiers: list[Frontier] = []

    def __call__(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int,
                 static_lifetime_input_indices=None, **_ignored):
        start = time.perf_counter()
        profile, tags, evaluate = self._analyse(joint, num_fwd_outputs,
                                                static_lifetime_input_indices)
        problem = problem_for(profile, tags, self.options)
        optimal = runtime_optimal(problem)
        rewritten, timeline = evaluate(optimal)
        graph_id = next(_graph_ids)
        optimal_plan = self._finish(profile, tags, optimal, rewritten, timeline,
                                    start=start, graph_id=graph_id)
        candidates = pareto_frontier(problem, evaluate, self.options.solver,
                                     (optimal, rewritten, timeline))
        plans = tuple(self._finish(profile, tags, c.decision, c.rewritten, c.timeline,
                                   start=start, graph_id=graph_id) for c in candidates)
        self.frontiers.append(Frontier(optimal_plan, plans, time.perf_counter() - start))
        self.plans.append(optimal_plan)
        return rewritten.forward, rewritten.backward


def make_plan(profile: Profile, tags: dict[str, Tag], decision: Decision, rewritten,
              timeline, *, budget_bytes: int | None, graph_id: int,
              seconds: float) -> Plan:
    fw_vals = {n.name: n.meta.get("val") for n in rewritten.forward.graph.nodes}
    state_bytes = sum(_nbytes(fw_vals.get(name)) for name in rewritten.rng_states)
    saved = tuple(sorted(decision.saved, key=list(profile.nodes).index))
    # Of the forward values backward computes, those forward also ran are
    # recomputed; the rest (say a cos only sin's gradient reads) run once,
    # in backward, and cost nothing extra.
    in_forward = run_in_forward(profile, decision.saved)
    recomputed = tuple(n for n in profile.nodes if n in decision.recomputed and n in in_forward)
    deferred = tuple(n for n in profile.nodes
                     if n in decision.recomputed and n not in in_forward)
    entries = [_entry(profile, tags, name, "saved") for name in saved
               if profile.nodes[name].is_tensor and name not in decision.offloaded]
    entries += [_offloaded_entry(profile, tags, name, decision.offload_bandwidth)
                for name in saved if name in decision.offloaded]
    entries += [_entry(profile, tags, name, "recomputed") for name in recomputed]
    entries += [_entry(profile, tags, name, "deferred") for name in deferred]
    entries += [PlanEntry(name, "saved", "rng state", _nbytes(fw_vals.get(name)), 0.0, 0,
                          "-", "generator state a recomputed random op replays", "")
                for name in rewritten.rng_states]
    notes = []
    if rewritten.rng_states:
        notes.append(f"{len(rewritten.rng_states)} random op(s) recomputed with their "
                     "RNG state replayed")
    return Plan(
        saved=saved + tuple(rewritten.rng_states),
        recomputed=recomputed,
        deferred=deferred,
        saved_bytes=profile.storage_bytes(decision.saved - decision.offloaded) + state_bytes,
        offloaded=tuple(n for n in saved if n in decision.offloaded),
        offloaded_bytes=profile.storage_bytes(decision.offloaded),
        offload_seconds=_transfer_seconds(profile.storage_bytes(decision.offloaded),
                                          decision.offload_bandwidth),
        offload_bandwidth=decision.offload_bandwidth,
        peak_bytes=timeline.peak_bytes,
        peak_at=timeline.peak_at,
        recompute_flops=sum(profile.nodes[n].flops for n in recomputed),
        recompute_cost=sum(profile.nodes[n].cost for n in recomputed),
        solver=decision.solver,
        solve_seconds=decision.solve_seconds,
        budget_bytes=budget_bytes,
        entries=tuple(entries),
        overrides=decision.overrides,
        gap=decision.gap,
        graph_id=graph_id,
        notes=tuple(notes),
        timeline=timeline,
        plan_seconds=seconds,
    )


def _entry(profile: Profile, tags: dict[str, Tag], name: str, action: str) -> PlanEntry:
    node = profile.nodes[name]
    tag = tags[name]
    owner = profile.nodes[node.storage]
    bytes_held = 0 if owner.is_static else owner.bytes
    return PlanEntry(name=name, action=action, op=node.op, bytes=bytes_held,
                     cost=node.cost, flops=node.flops,
                     tag=tag.policy.name if tag.policy is not None else "-",
                     reason=_reason(tag, action), source=node.source)


def _offloaded_entry(profile: Profile, tags: dict[str, Tag], name: str,
                     bandwidth: float | None) -> PlanEntry:
    """An offloaded value costs its copies to host and back."""
    entry = _entry(profile, tags, name, "offloaded")
    return replace(entry, cost=_transfer_seconds(entry.bytes, bandwidth), flops=0)


def _transfer_seconds(nbytes: int, bandwidth: float | None) -> float:
    return 2.0 * nbytes / bandwidth if bandwidth else 0.0


def _reason(tag: Tag, action: str) -> str:
    if action == "deferred":
        return "only backward reads it: computed there, once"
    followed = {
        "saved": (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE),
        "offloaded": (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD),
        "recomputed": (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE),
    }[action]
    if tag.policy in followed:
        return tag.reason
    if action == "saved":
        return "solver: holding it costs less than what recomputing it needs"
    return "solver: recomputed from saved values to hold fewer bytes"


def _nbytes(val) -> int:
    try:
        return int(val.untyped_storage().nbytes())
    except AttributeError:
        return 0

"""The stages strung together: joint graph -> profile -> tags -> decision ->
rewrite -> verify -> forward and backward graphs, plus the Plan that explains
them. ``Planner`` is what AOTAutograd calls as its partition function.

Under a budget the frontier (solve/frontier) weighs many candidate plans.
Rewriting each into FX graphs and simulating those cost most of the planning
time, so candidates are simulated by the schedule model instead
(memory/schedule.py: the joint graph read once into lists, each plan's
rewritten graphs replayed as node sequences and walked with memory/model.py's
rules, in both backward orders under compiler="eager"), each distinct plan
once. Only the plan that runs is rewritten, and its real simulation must
not peak above the model's, or the frontier is built again with every
candidate rewritten; a BudgetError's floor plan is checked the same way.
Under Inductor the model simulates as memory/model.py's fused model does. Plans
the model does not cover (offload) are always rewritten."""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.bandwidth import offload_bandwidth
from fxckpt.errors import BudgetError, PlanError
from fxckpt.planning.memo import Recall, frontier_key
from fxckpt.memory.model import breakdown, simulate
from fxckpt.options import Budget, Options, format_bytes
from fxckpt.planning.phases import PhaseClock, Progress
from fxckpt.memory import schedule
from fxckpt.passes.cse import deduplicated
from fxckpt.passes.dropout import joined_host_dropouts, split_host_dropouts
from fxckpt.passes.profile import profile_joint_graph
from fxckpt.passes.reshapes import linear_views
from fxckpt.passes.rewrite import rewrite_orders
from fxckpt.passes.tag import tag_forward_values
from fxckpt.passes.verify import verify_decision, verify_rewrite
from fxckpt.report.plan import Plan, make_plan, saved_bytes_of
from fxckpt.solve import BASELINES
from fxckpt.solve.candidates import Candidate, Evaluate, plan_cost
from fxckpt.solve.frontier import pareto_frontier, step_plans
from fxckpt.solve.select import (Fits, Fraction, NoPlanFits, Request, RuntimeOptimal,
                                 bytes_asked, select)
from fxckpt.solve.problem import build_problem
from fxckpt.solve.runtime_optimal import runtime_optimal
from fxckpt.types import Decision, Profile, Tag

_graph_ids = itertools.count()
_RECALLED = ("the budget selected from the frontier of an earlier plan of this graph "
             "with the same options in this process (fxckpt/planning/memo.py); not solved again")
log = logging.getLogger("fxckpt.planner")


def estimator(model, evaluate: Evaluate) -> Evaluate:
    """evaluate(decision) by the schedule model (memory/schedule.py), for the
    plans it covers: (Simulated, its timeline), no graphs built; the rest
    are rewritten and simulated."""
    if model is None:
        return evaluate

    def estimate(decision: Decision):
        timeline = model.peak(decision)
        if timeline is None:
            return evaluate(decision)
        states = {f"rng_state_{name}": profile_bytes
                  for name, profile_bytes in model.state_bytes(decision).items()}
        return schedule.Simulated(states), timeline
    return estimate


@contextlib.contextmanager
def collection_paused():
    """Python's cyclic garbage collector off while a graph is planned, as it
    was after. Planning allocates millions of small objects among a joint
    graph's tens of thousands (a 58-layer GPT: 10,028 nodes), and each full
    collection walks them all: on that graph's budgeted planning the
    collector took 2.4 of 9.6 s CPU. Garbage made meanwhile is collected at
    the collector's next run. (torch's distributed state_dict pauses it the
    same way.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Evaluator:
    """evaluate(decision, only=None) of one analysed joint graph: the
    decision rewritten and simulated, the (rewritten, timeline) of the
    backward order that peaks lower (``only``: the one order to rewrite,
    the schedule model's lower one, rather than each of ``orders``).
    ``estimate`` is ``estimator(model, self)``.

    An object rather than a closure carrying its estimator as an attribute:
    that estimator refers back to the closure, a reference cycle that left
    the profile and the schedule model (some 140,000 objects on a 58-layer
    GPT) to Python's cyclic collector when planning ended, rather than
    freed as it ends."""

    def __init__(self, joint: fx.GraphModule, profile: Profile, num_fwd_outputs: int,
                 orders: tuple[bool, ...], fused: bool, model) -> None:
        self.joint, self.profile, self.num_fwd_outputs = joint, profile, num_fwd_outputs
        self.orders, self.fused, self.model = orders, fused, model

    def __call__(self, decision: Decision, only=None):
        best = None
        for rewritten in rewrite_orders(self.joint, self.profile, decision,
                                        num_fwd_outputs=self.num_fwd_outputs,
                                        orders=self.orders if only is None else (only,)):
            timeline = simulate(rewritten.forward.graph, rewritten.backward.graph,
                                fused=self.fused)
            if best is None or timeline.peak_bytes < best[1].peak_bytes:
                best = (rewritten, timeline)
        return best

    @property
    def estimate(self) -> Evaluate:
        return estimator(self.model, self)


@dataclass(frozen=True)
class Planned:
    """What planning one graph made: the Plan, the solver's Decision it
    follows, and under a budget the graph's frontier as (own peak, saved
    bytes, cost) points (None without one). What the plan cache keeps."""

    plan: Plan
    decision: Decision
    frontier: tuple[tuple[int, int, float], ...] | None


class Planner:
    """A partition function for AOTAutograd that plans, rewrites and records.

    ``plans`` collects one Plan per graph partitioned; ``on_plan`` (optional)
    is called with each. ``reusable`` (set by the caller, consumed in order):
    Planned records of an earlier compile of the same graph and options,
    whose decisions are followed instead of solving again where they give
    the same plan. ``cache_note`` (optional) is added to the notes of every
    plan made.
    """

    # Plans made by this planner depend on nothing but the graph, the options
    # and num_lifted_params: the plan cache may keep them (fxckpt/planning/cache.py).
    caches_plans = True
    # Under a budget, the frontier's candidates are simulated by the schedule
    # model (memory/schedule.py) where it covers them; False rewrites and
    # simulates every one (the same plans, more slowly).
    estimates = True
    # Under a budget, a frontier built earlier in the process for the same
    # graph and options is selected from instead of solving again
    # (fxckpt/planning/memo.py); False always solves.
    memoizes = True

    def __init__(self, options: Options, *, on_plan: Callable[[Plan], Any] | None = None,
                 num_lifted_params: int = 0, request: Request | None = None) -> None:
        self.options = options
        # AOTAutograd puts a module's parameters and buffers first among the
        # primals; outside Dynamo it does not report them as static, so the
        # caller says how many there are.
        self.num_lifted_params = num_lifted_params
        self.plans: list[Plan] = []
        self.records: list[Planned] = []
        # The planned forward and backward graphs of each plan made here (not
        # of adopted ones), for the memory model to read again at other
        # (dynamic) sizes.
        self.graphs: list[tuple[fx.Graph, fx.Graph]] = []
        # Under a budget, each graph's frontier as (own peak, saved bytes,
        # cost) points, lowest peak first: what a step-wide allocation picks from.
        self.frontiers_seen: list[tuple[tuple[int, int, float], ...]] = []
        self.on_plan = on_plan
        self.reusable: list[Planned] = []
        self.cache_note: str | None = None
        # What this graph is asked for (solve/select.py): the options' budget
        # as a request unless the caller names another; None plans without one.
        self.request: Request | None = request if request is not None \
            else request_for(options.budget)
        # The request where the caller named one other than the options'.
        self.named_request = request if request != request_for(options.budget) else None
        # What one compile asks instead of ``request`` (planning/capture.py:
        # under Inductor a plan whose code peaks over its budget is planned
        # again lower), and the request of the compile kept, which the plan
        # cache records so that another process asks for that compile first.
        self.attempt: Request | None = None
        self.kept: Request | None = None
        self.start_with: Request | None = None

    @contextlib.contextmanager
    def trying(self, attempt: Request):
        """Plan the graphs compiled meanwhile for ``attempt`` rather than for
        ``request`` (their plans still name ``request``'s budget)."""
        before, self.attempt = self.attempt, attempt
        try:
            yield
        finally:
            self.attempt = before

    def __call__(self, joint: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int,
                 static_lifetime_input_indices=None, **_ignored):
        with collection_paused():
            return self._partition(joint, num_fwd_outputs, static_lifetime_input_indices)

    def _partition(self, joint: fx.GraphModule, num_fwd_outputs: int,
                   static_lifetime_input_indices):
        clock, graph_id, progress, profile, tags, evaluate = self._begin(
            joint, num_fwd_outputs, static_lifetime_input_indices)
        estimate = progress.counted(clock.timed("rewrite", evaluate.estimate))
        evaluate = progress.counted(clock.timed("rewrite", evaluate))
        known = self.reusable.pop(0) if self.reusable else None
        made = self._follow(known, profile, tags, evaluate, clock, graph_id) \
            if known is not None else None
        if made is None:
            frontiers: list[tuple] = []
            recalled: list[bool] = []
            with clock.phase("solve"):
                memo_key = frontier_key(joint, profile, tags, self.options) \
                    if self.request is not None and self.memoizes else None
                decision, rewritten, timeline = solve(profile, tags, evaluate, self.options,
                                                      request=self.request,
                                                      attempt=self.attempt,
                                                      on_frontier=frontiers.append,
                                                      estimate=estimate, memo_key=memo_key,
                                                      on_recall=recalled.append)
            plan = self._finish(profile, tags, decision, rewritten, timeline, clock=clock,
                                graph_id=graph_id, note=_RECALLED if recalled else None)
            made = Planned(plan, decision, frontiers[-1] if frontiers else None), rewritten
        planned, rewritten = made
        self._record(planned)
        forward = joined_host_dropouts(rewritten.forward)
        self.graphs.append((forward.graph, rewritten.backward.graph))
        progress.finished(planned.plan)
        return forward, rewritten.backward

    def retract(self, mark: int) -> tuple[list, list, list]:
        """Forget the plans made since ``len(self.plans)`` was ``mark`` (their
        compiled code is being thrown away and the graph planned again);
        return them, their records and graphs, for ``restore``."""
        removed = self.plans[mark:], self.records[mark:], self.graphs[mark:]
        del self.plans[mark:], self.records[mark:], self.graphs[mark:]
        return removed

    def restore(self, removed: tuple[list, list, list]) -> None:
        """Record again plans ``retract`` forgot (the compile kept is theirs)."""
        plans, records, graphs = removed
        self.plans += plans
        self.records += records
        self.graphs += graphs

    def replace_plan(self, index: int, plan: Plan) -> None:
        """Record ``plan`` for plan ``index`` (its compiled peak known)."""
        self.plans[index] = plan
        if index < len(self.records):      # a FrontierPlanner keeps no records
            self.records[index] = replace(self.records[index], plan=plan)

    def _follow(self, known: Planned, profile, tags, evaluate, clock, graph_id):
        """(Planned, rewritten) by ``known``'s decision, without solving, where
        it gives ``known``'s plan here; None where it does not (the graph is
        not the one it was made for), and the graph is solved afresh."""
        decision = known.decision
        if not (decision.saved | decision.recomputed) <= profile.nodes.keys():
            return None
        try:
            verify_decision(profile, tags, decision)
            rewritten, timeline = evaluate(decision)
            plan = self._finish(profile, tags, decision, rewritten, timeline,
                                clock=clock, graph_id=graph_id,
                                note="followed the decision of an earlier compile of "
                                     "this graph (plan cache); not solved again")
        except PlanError:
            return None
        if plan.fingerprint != known.plan.fingerprint:
            return None
        return Planned(plan, decision, known.frontier), rewritten

    def _record(self, planned: Planned) -> None:
        self.plans.append(planned.plan)
        self.records.append(planned)
        if planned.frontier is not None:
            self.frontiers_seen.append(planned.frontier)
        if self.on_plan is not None:
            self.on_plan(planned.plan)

    def adopt(self, records, *, note: str) -> None:
        """Record the plans of an earlier compile whose compiled graphs were
        served from cache, so that nothing was partitioned here: each gets a
        graph id of this process and ``note``."""
        for planned in records:
            plan = replace(planned.plan, graph_id=next(_graph_ids),
                           notes=planned.plan.notes + (note,))
            self._record(replace(planned, plan=plan))

    def _begin(self, joint: fx.GraphModule, num_fwd_outputs: int, static_indices):
        """A graph's planning begun: its clock, id and progress (told it
        started), then ``_analyse``'s profile, tags and evaluate."""
        clock, graph_id = PhaseClock(), next(_graph_ids)
        progress = Progress(graph_id, clock)
        profile, tags, evaluate = self._analyse(joint, num_fwd_outputs, static_indices, clock)
        progress.started(len(joint.graph.nodes), len(tags), self.options)
        return clock, graph_id, progress, profile, tags, evaluate

    def _analyse(self, joint: fx.GraphModule, num_fwd_outputs: int, static_indices,
                 clock: PhaseClock):
        """Profile and tag the joint graph; return them with the function
        that rewrites it by a Decision and simulates the result."""
        static = set(static_indices or ()) | set(range(self.num_lifted_params))
        with clock.phase("profile"):
            joint = prepared_joint(joint, self.options.compiler)
            profile = profile_joint_graph(joint, num_fwd_outputs=num_fwd_outputs,
                                          static_input_indices=static,
                                          rerun_custom_ops=self.options.solver == "per_block")
        with clock.phase("tag"):
            tags = tag_forward_values(joint, profile, policy=self.options.policy)

        fused = self.options.compiler == "inductor"

        # Under compiler="eager" the backward runs in the order given: a plan
        # is rewritten with and without memory-growing nodes sunk to their
        # users (passes/rewrite.py) and the order that peaks lower is kept
        # (sinking one node can hold its inputs across a higher point).
        orders = (False, True) if self.options.compiler == "eager" else (False,)
        with clock.phase("profile"):
            model = None if self.request is None or not self.estimates else \
                schedule.build(joint, profile, num_fwd_outputs=num_fwd_outputs,
                               sinks=len(orders) > 1, fused=fused)
        return profile, tags, _Evaluator(joint, profile, num_fwd_outputs, orders, fused, model)

    def _finish(self, profile, tags, decision, rewritten, timeline, *, clock: PhaseClock,
                graph_id: int, note: str | None = None) -> Plan:
        with clock.phase("verify"):
            verify_decision(profile, tags, decision)
            verify_rewrite(profile, rewritten)
        plan = make_plan(profile, tags, decision, rewritten, timeline,
                         budget_bytes=decision.budget_bytes, graph_id=graph_id,
                         seconds=clock.elapsed(), phase_seconds=clock.recorded())
        notes = tuple(n for n in (note, self.cache_note) if n)
        return replace(plan, notes=plan.notes + notes) if notes else plan


@dataclass(frozen=True)
class Frontier:
    """Every plan a budget can select for one graph (see fxckpt.pareto).

    ``plans`` are the frontier of solve/frontier with the plans filled
    inside its steps, walked down them and swapped (solve/local_search's
    ``step_plans``), lowest peak first, each recomputing no more than the
    one before (a swap can cost what the plan above it does);
    ``runtime_optimal`` is the plan without a budget."""

    runtime_optimal: Plan
    plans: tuple[Plan, ...]
    seconds: float            # profile, tag, and the whole frontier, wall time

    def select(self, request: Request | int) -> Plan | None:
        """The plan the backend picks for ``request`` (solve/select.py; an int
        is ``Fits`` that many bytes): the cheapest frontier plan that fits,
        None if none does. Along the frontier, cheaper means a higher peak,
        so that is the last plan that fits."""
        if isinstance(request, int):
            request = Fits(request)
        budget = bytes_asked(request, self.plans[0].peak_bytes,
                             self.runtime_optimal.peak_bytes)
        if budget is None:
            return self.runtime_optimal
        fitting = [plan for plan in self.plans if plan.peak_bytes <= budget]
        return fitting[-1] if fitting else None


class FrontierPlanner(Planner):
    """A partition function that plans the whole budget frontier of each
    graph, once, and partitions by the runtime-optimal plan. ``frontiers``
    gets one Frontier per graph."""

    # Its frontiers are made only when it partitions: a compile served from
    # cache would leave them empty.
    caches_plans = False

    def __init__(self, options: Options, **kwargs) -> None:
        super().__init__(options, **kwargs)
        self.frontiers: list[Frontier] = []

    def _partition(self, joint: fx.GraphModule, num_fwd_outputs: int,
                   static_lifetime_input_indices):
        clock, graph_id, progress, profile, tags, evaluate = self._begin(
            joint, num_fwd_outputs, static_lifetime_input_indices)
        evaluate = progress.counted(clock.timed("rewrite", evaluate))
        with clock.phase("solve"):
            problem = problem_for(profile, tags, self.options)
            optimal = runtime_optimal(problem, fuses=self.options.compiler == "inductor")
        rewritten, timeline = evaluate(optimal)
        optimal_plan = self._finish(profile, tags, optimal, rewritten, timeline,
                                    clock=clock, graph_id=graph_id)
        with clock.phase("solve"):
            candidates = pareto_frontier(problem, evaluate, self.options.solver,
                                         (optimal, rewritten, timeline),
                                         again_from_seeds=self.options.compiler == "eager")
            # What a budget inside each step gets besides the step's lower plan.
            candidates = sorted(candidates + [
                c for below, lower, upper in zip([None] + candidates, candidates, candidates[1:])
                for c in step_plans(problem, evaluate, lower, upper, below)],
                key=lambda c: c.peak)
        plans = tuple(self._finish(profile, tags, c.decision, c.rewritten, c.timeline,
                                   clock=clock, graph_id=graph_id) for c in candidates)
        self.frontiers.append(Frontier(optimal_plan, plans, clock.elapsed()))
        self.plans.append(optimal_plan)
        progress.finished(optimal_plan)
        return joined_host_dropouts(rewritten.forward), rewritten.backward


def prepared_joint(joint: fx.GraphModule, compiler: str) -> fx.GraphModule:
    """The joint graph as planned (``joint`` is never edited): repeats merged
    (passes/cse.py) and, but under Inductor (whose decompositions replace
    dropout itself, and whose partition fxckpt's default plan is), F.linear's
    output reshape read as the view it is (passes/reshapes.py) and each host
    dropout split into its mask and product (passes/dropout.py)."""
    if compiler == "inductor":
        return deduplicated(joint)
    merged = deduplicated(linear_views(joint))
    return split_host_dropouts(merged, owned=merged is not joint)


_OFFLOAD_POLICIES = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)


def problem_for(profile: Profile, tags: dict[str, Tag], options: Options):
    """The numeric Problem of a profiled, tagged graph. Offload is priced only
    where some value is tagged *_CPU_OFFLOAD: then the options' bandwidth, or
    the device's measured one."""
    devices = sorted({profile.nodes[name].device for name, tag in tags.items()
                      if tag.policy in _OFFLOAD_POLICIES})
    bandwidth = offload_bandwidth(devices[0], options.offload_bandwidth) if devices else None
    return build_problem(profile, tags, bandwidth=bandwidth,
                         fuses=options.compiler == "inductor")


def request_for(budget: Budget | None) -> Request | None:
    """The request a user's budget makes of every graph: bytes to fit, or a
    fraction of the way from the floor to the runtime-optimal peak; None
    without a budget."""
    if budget is None:
        return None
    if budget.bytes is not None:
        return Fits(budget.bytes)
    if budget.fraction is None:
        budget.resolve(0)        # budget='fit' not yet read off the device: its error
    return Fraction(budget.fraction)


def solve(profile: Profile, tags: dict[str, Tag], evaluate: Evaluate, options: Options, *,
          request: Request | None, attempt: Request | None = None,
          on_frontier: Callable[[tuple], Any] | None = None,
          estimate: Evaluate | None = None, memo_key: str | None = None,
          on_recall: Callable[[bool], Any] | None = None):
    """Return (decision, rewritten, timeline) for the options' solver and
    ``request`` (solve/select.py; None: no budget). ``attempt``: what this
    compile selects instead of ``request``, the decision still naming
    ``request``'s bytes. ``on_frontier``, under a request, gets the frontier
    as (own peak, saved bytes, cost) points, lowest peak first. ``estimate``:
    evaluate for the frontier's candidates, which may answer a Simulated
    plan (no graphs); the plan chosen is then rewritten and simulated for
    real, and if the two peaks differ the frontier is built again with
    ``evaluate``. ``memo_key`` (fxckpt/planning/memo.py): the frontier is
    recalled from, or kept in, the process's memo under that key;
    ``on_recall`` is called when it was recalled."""
    memo = Recall(memo_key, on_recall)
    asked = _Asked(request, attempt)
    if estimate is not None and estimate is not evaluate:
        try:
            return _solve(profile, tags, evaluate, options, asked, on_frontier, estimate,
                          memo.exact(False))
        except _EstimateOff as off:
            log.info("the schedule model's peak for %s differs from the rewritten "
                        "graph's (%d against %d bytes): planning again with every "
                        "candidate rewritten", off.what, off.estimated, off.real)
    return _solve(profile, tags, evaluate, options, asked, on_frontier, evaluate,
                  memo.exact(True))


@dataclass(frozen=True)
class _Asked:
    """What a graph is asked for (``request``) and what this compile selects
    (``attempt``, else the request)."""

    request: Request | None
    attempt: Request | None

    @property
    def selects(self) -> Request | None:
        return self.attempt if self.attempt is not None else self.request


class _EstimateOff(Exception):
    def __init__(self, what: str, estimated: int, real: int) -> None:
        super().__init__(what)
        self.what, self.estimated, self.real = what, estimated, real


def _checked(evaluate: Evaluate, decision: Decision, rewritten, timeline, what: str):
    """(rewritten, timeline) of ``decision`` from the real rewrite, where the
    candidate was only simulated; _EstimateOff if the real peak is higher
    (a lower one only leaves the plan further within what it was chosen
    for, and is taken)."""
    if not isinstance(rewritten, schedule.Simulated):
        return rewritten, timeline
    # The schedule model replays both backward orders exactly (property-
    # tested against the rewrite): only the lower one is rewritten.
    order = getattr(getattr(timeline, "graph", timeline), "sink_growing", None)
    real_rewritten, real_timeline = evaluate(decision, order)
    if real_timeline.peak_bytes > timeline.peak_bytes:
        raise _EstimateOff(what, timeline.peak_bytes, real_timeline.peak_bytes)
    return real_rewritten, real_timeline


def _solve(profile, tags, evaluate: Evaluate, options: Options, asked: _Asked, on_frontier,
           estimate, memo: Recall):
    problem = problem_for(profile, tags, options)
    if options.solver in BASELINES:
        decision = BASELINES[options.solver](problem)
        rewritten, timeline = evaluate(decision)
        return _within_budget(decision, rewritten, timeline, asked.selects)
    optimal = runtime_optimal(problem, fuses=options.compiler == "inductor")
    if asked.request is None:
        return (optimal, *evaluate(optimal))
    if options.runs_per_step > 1:
        evaluate = _held_per_run(evaluate, profile, options.runs_per_step)
        estimate = _held_per_run(estimate, profile, options.runs_per_step)
    # Rewritten for real only if chosen (``_checked`` below).
    rewritten, timeline = estimate(optimal)
    # With a budget, plans come from the trade-off frontier, of which the
    # runtime-optimal plan is one candidate: a budget it fits gets it or a
    # plan that is no more costly and peaks no higher.
    started = time.perf_counter()
    frontier = memo.frontier(lambda: pareto_frontier(
        problem, estimate, options.solver, (optimal, rewritten, timeline),
        again_from_seeds=options.compiler == "eager"))
    # The plan's solve time is the frontier's (nothing when recalled).
    frontier_seconds = time.perf_counter() - started
    if on_frontier is not None:
        on_frontier(tuple((getattr(c.timeline, "graph", c.timeline).peak_bytes,
                           saved_bytes_of(profile, c.decision, c.rewritten), c.cost)
                          for c in frontier))
    # The frontier's figures are the schedule model's (exact where it covers
    # a plan: tests/test_schedule_model.py); the plan chosen, and the floor
    # plan a BudgetError names, are rewritten for real and checked below.
    top = Candidate(optimal, rewritten, timeline, plan_cost(problem, optimal))
    try:
        chosen = select(frontier, asked.selects, runtime_optimal=top,
                        inside=lambda lower, upper, below: step_plans(
                            problem, estimate, lower, upper, below))
    except NoPlanFits as no_fit:
        floor = no_fit.floor
        checked = _checked(evaluate, floor.decision, floor.rewritten, floor.timeline,
                           "the floor plan")
        no_fit.floor = replace(floor, rewritten=checked[0], timeline=checked[1])
        raise _budget_error(no_fit) from None
    rewritten, timeline = _checked(evaluate, chosen.decision, chosen.rewritten,
                                   chosen.timeline, "the chosen plan")
    if isinstance(asked.selects, RuntimeOptimal):
        return optimal, rewritten, getattr(timeline, "graph", timeline)
    # The plan names the bytes its graph was asked for, whatever this
    # compile selected by.
    budget = bytes_asked(asked.request, frontier[0].peak, top.peak)
    decision = replace(chosen.decision, budget_bytes=budget, solve_seconds=frontier_seconds)
    return decision, rewritten, getattr(timeline, "graph", timeline)


@dataclass(frozen=True)
class _StepTimeline:
    """A graph run ``runs`` times per step, as a budget sees it: its peak
    plus the saved bytes of its other runs, still held while it runs last."""

    peak_bytes: int
    peak_at: str
    graph: Any            # the graph's own memory.MemoryTimeline


def _held_per_run(evaluate: Evaluate, profile: Profile, runs: int) -> Evaluate:
    def evaluate_step(decision: Decision, *only):
        rewritten, timeline = evaluate(decision, *only)
        extra = (runs - 1) * saved_bytes_of(profile, decision, rewritten)
        return rewritten, _StepTimeline(timeline.peak_bytes + extra, timeline.peak_at, timeline)
    return evaluate_step


def _within_budget(decision, rewritten, timeline, request: Request | None):
    """A reference strategy's plan, checked against the bytes asked (a
    fraction read against zero: the strategy has no frontier)."""
    budget = None if request is None else bytes_asked(request, 0, timeline.peak_bytes)
    if budget is None:
        return decision, rewritten, timeline
    if timeline.peak_bytes > budget:
        raise BudgetError(
            f"the {decision.solver} strategy peaks at {format_bytes(timeline.peak_bytes)}, "
            f"over the budget of {format_bytes(budget)}; use solver='auto' to plan "
            "within the budget", floor_bytes=None)
    return replace(decision, budget_bytes=budget), rewritten, timeline


def _budget_error(no_fit: NoPlanFits) -> BudgetError:
    floor, budget = no_fit.floor, no_fit.budget
    floor_peak = floor.peak
    runtime_optimal_peak = no_fit.runtime_optimal_peak
    graph_timeline = getattr(floor.timeline, "graph", floor.timeline)
    what = dominated_by(floor.rewritten, graph_timeline) if floor.rewritten is not None \
        else "values the memory model could not break down"
    return BudgetError(
        f"no plan fits a budget of {format_bytes(budget)} for this graph: the smallest "
        f"feasible budget is {format_bytes(floor_peak)} ({floor_peak} bytes; the "
        f"runtime-optimal plan peaks at {format_bytes(runtime_optimal_peak)}). At that "
        f"floor the peak is at {graph_timeline.peak_at}, made of {what}. Raise the "
        f"budget to at least {floor_peak} bytes, or shrink the batch.",
        floor_bytes=floor_peak, dominated_by=what)


def dominated_by(rewritten, timeline) -> str:
    """Say what the memory live at the peak is made of."""
    parts, largest, largest_bytes = breakdown(
        rewritten.forward.graph, rewritten.backward.graph, timeline.peak_at,
        fused=getattr(timeline, "fused", False))
    total = sum(parts.values()) or 1
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{name} {format_bytes(b)} ({b / total:.0%})" for name, b in ranked[:3]
                      if b > 0) or "nothing measurable"
    return f"{kinds}; the largest single value is {largest} ({format_bytes(largest_bytes)})"

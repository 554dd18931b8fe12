"""The torch.compile backend.

Three owners, one each: ``GraphCompiler`` (fxckpt/planning/graph_compiler.py)
plans and compiles one graph for given options; fxckpt/budget/step.py decides
on numbers (a graph's share of the budget, when the first step is planned
again, what a measured excess keeps aside); ``StepPeakReader``
(fxckpt/memory/measured.py) watches a step's measured peak on CUDA.
``Backend`` is Dynamo's callable: it keeps the step's ledger and its
``StepState``, which the run and backward callbacks move, and asks the three.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.fx as fx

from fxckpt.compat.autograd import queue_at_backward_end
from fxckpt.compat.dynamo import copy_of_dynamo_graph
from fxckpt.planning.capture import compile_planned
from fxckpt.planning.graph_compiler import GraphCompiler
from fxckpt.errors import BudgetError, FxckptError, surface_through_dynamo
from fxckpt.budget.fit import fitted_budget
from fxckpt.budget.step import (StepState, first_step_replans, graph_share, kept_aside_after,
                                step_floor_error)
from fxckpt.memory.measured import (StepPeakReader, made_after_the_graphs, over_budget_warning,
                                    uncounted_outside_warning)
from fxckpt.budget.ledger import (GraphRunner, LedgerEntry, StepFloor, StepLedger, StepRegions,
                                  allocate_step, compile_key, step_items, step_peak, weak)
from fxckpt.memory.values import storage_key
from fxckpt.budget.sizes import SizeCheck, SizesSeen
from fxckpt.solve.select import Fits, Floor
from fxckpt.options import DEFAULT_COMPILER, Options, checked_mode, format_bytes
from fxckpt.planning.pipeline import Planner
from fxckpt.report.plan import Plan


class Backend:
    """A dynamo backend that checkpoints every graph it is given, within one
    budget for the whole training step (fxckpt/budget/ledger.py).

    ``plans`` holds one Plan per graph compiled with a backward, in order
    (re-plans replace theirs in ``ledger``, and are appended here too).

    ``regions`` (optional, ``ledger.StepRegions``) are the eager fallback
    regions of the step (``fxckpt.compile``): a byte budget is shared with
    what they hold, and once the first step has run they are planned with
    the graphs (``replan``). ``on_graph`` (optional) is called with each
    graph Dynamo hands over and its ``ledger.LedgerEntry``, whose ``plan``
    is the graph's current plan. ``compile_fn`` (optional) hands a graph and
    its Planner to AOTAutograd and a compiler; by default
    ``capture.compile_planned``. ``refuse_at_compile`` (``fxckpt.explain``,
    which runs no step) refuses a first graph that cannot fit the budget at
    its compile, naming its own floor, instead of running the step at floors
    to name the step's (explain then captures again without it where the
    model has several graphs, and ``forward_only_step_ended`` names the
    step's floor).
    """

    def __init__(self, options: Options, *,
                 compile_fn: Callable[[fx.GraphModule, list[Any], Planner], Any] = compile_planned,
                 regions: StepRegions | None = None,
                 on_graph: Callable[[fx.GraphModule, LedgerEntry], Any] | None = None,
                 refuse_at_compile: bool = False) -> None:
        self.options = options
        self.refuse_at_compile = refuse_at_compile
        self.regions = regions
        self.on_graph = on_graph
        self.graphs = GraphCompiler(compile_fn, self._keep_plan)
        self.plans: list[Plan] = []
        self.graphs_without_backward = 0
        self.ledger = StepLedger()
        self.state = StepState()
        self.replans = 0              # graphs re-planned once the step's runs were seen
        self._sources: dict[int, tuple[fx.GraphModule, list[Any], dict]] = {}
        self._sizes = SizesSeen()
        # Steps' measured peaks on a CUDA device under a byte budget, and the
        # corrections made for them (memory/measured.py).
        self.watch = StepPeakReader(_CORRECTIONS)
        # Bytes kept aside for what the memory model does not see, from
        # measured steps over the budget.
        self.unmodelled_bytes = 0

    @property
    def step_peaks(self) -> list[int]:
        """Steps' measured peaks on a CUDA device under a byte budget, in
        the order read."""
        return self.watch.step_peaks

    @property
    def first_step_peak_bytes(self) -> int | None:
        """The first of ``step_peaks``, or None where none was read (no byte
        budget, not CUDA, or the process had peaked higher before)."""
        return self.watch.first_step_peak_bytes

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], *,
                 mode: str | None = None, options: dict | None = None):
        if options is not None:
            raise TypeError(
                f"torch.compile(..., options={options!r}) with backend=fxckpt.backend(...): "
                "fxckpt's options go to fxckpt.backend(budget=..., ...), or use "
                "backend='fxckpt' with options={...}")
        mode = self.options.mode if mode is None else checked_mode(mode, self.options.compiler)
        if mode != self.options.mode:
            if self.ledger.run_order() or self.plans:
                raise ValueError(
                    f"this fxckpt backend compiled graphs with mode={self.options.mode!r}, "
                    f"and a torch.compile with mode={mode!r} now uses it: one backend "
                    "plans one step under one mode; make one fxckpt.backend(...) per mode")
            self.options = replace(self.options, mode=mode)
        # Compiling inside the watched step (a graph break) can allocate on
        # the device (Inductor's benchmarks): the peak is not the step's.
        self.watch.compiling()
        budget = self.options.budget
        if budget is not None and budget.fit and budget.bytes is None:
            # budget="fit" becomes bytes once, at the first graph (fxckpt/budget/fit.py).
            try:
                self.options = replace(self.options, budget=fitted_budget(budget, example_inputs))
            except FxckptError as error:
                raise surface_through_dynamo(error) from None
        frame, compile = compile_key(gm)
        source = (copy_of_dynamo_graph(gm), list(example_inputs)) if self._byte_budget() \
            else None
        runner = GraphRunner(None, self.ledger, self._on_new_step, self._on_backward,
                             self._on_run)
        sizes = self._sizes.plan_at(frame, gm)
        try:
            asked, planner, own_floor = self._plan_and_compile(gm, example_inputs, runner,
                                                                 frame, compile, sizes)
        except FxckptError as error:
            raise surface_through_dynamo(error) from None
        if not planner.plans:
            # No input or parameter requires grad (or grad mode is off): AOTAutograd
            # built an inference graph, there is nothing to save for backward.
            self.graphs_without_backward += 1
        entry = LedgerEntry(frame, compile,
                            self._noted(planner.plans[-1]) if planner.plans else None,
                            weak(runner), grad_bytes=gradient_bytes(example_inputs),
                            frontier=planner.frontiers_seen[-1]
                            if planner.frontiers_seen else ())
        if own_floor is not None and entry.plan is not None:
            entry.floor_point = _floor_point(entry.plan, entry.frontier)
        runner.entry = entry
        self.ledger.add(entry)
        if entry.plan is not None and asked is not None and SizeCheck.needed(gm):
            check = SizeCheck(gm, planner.graphs[-1], budget=asked,
                              planned_peak=entry.plan.peak_bytes,
                              fused=self.options.compiler == "inductor")
            runner.size_check = lambda args: self._check_sizes(check, args)
        if source is not None and entry.plan is not None:
            self._sources[id(entry)] = (*source, sizes)
        if self.on_graph is not None:
            self.on_graph(gm, entry)
        # Without a byte budget nothing needs the runs counted: the graph
        # runs as compiled (the runner stays in the ledger, unreferenced).
        return runner if self._byte_budget() is not None else runner.compiled

    def _plan_and_compile(self, gm, example_inputs, runner, frame, compile, sizes):
        """Plan and compile for the graph's share of a byte budget. Where
        that share is too small -- the graphs before it hold too much, or the
        graph alone cannot fit -- the graph is planned at its own floor for
        this first step: the step's floor is only known once every graph of
        it has run. At the end of that step's first backward the step is
        planned again, together, or refused with BudgetError naming the
        step's floor (``_on_new_step``), so that one ask names a budget that
        works even when the model splits into several graphs."""
        planning = False
        try:
            share = self._share(frame, compile)
            planning = True
            planner, compiled = self.graphs.compile(
                gm, example_inputs, self.options, sizes,
                request=Fits(share) if share is not None else None)
            runner.set_compiled(compiled)
            return share, planner, None
        except BudgetError as refused:
            # The graph's own floor where its planning refused (not where the
            # graphs before it left nothing to plan for).
            own_floor = refused.floor_bytes if planning else None
            alone = not (self.ledger.held_before(frame, compile) or self.regions is not None)
            if self._byte_budget() is None or (alone and (self.state.first_step_checked
                                                          or self.refuse_at_compile)):
                raise
            short = ("this graph alone does not fit the budget" if alone else
                     "this graph does not fit what the graphs and fallback regions "
                     "before it leave of the step's budget")
            warnings.warn(
                f"fxckpt: {short} ({refused}); it runs at its own floor for this step, "
                "which may exceed the budget, so that the whole step's floor is known: "
                "once the step's backward has run, the step is planned again, together, "
                "or refused with a BudgetError naming the smallest budget that fits it",
                stacklevel=3)
            self.state.graph_did_not_fit(refused.dominated_by)
        if own_floor is None and self.options.compiler == "inductor":
            # Under Inductor the lowest compiled peak can lie far below the
            # memory model's floor plan's; under compiler="eager" they are one plan.
            floor_plan = self.graphs.floor_plan(gm, example_inputs, self.options, sizes)
            own_floor = floor_plan.peak_bytes if floor_plan is not None else None
        # At its own floor: the plan its planning named as the lowest (under
        # Inductor the lowest compiled peak, which the memory model's floor
        # plan can compile far above), else the memory model's floor.
        planner, compiled = self.graphs.compile(
            gm, example_inputs, self.options, sizes,
            request=Fits(own_floor) if own_floor else Floor())
        runner.set_compiled(compiled)
        return own_floor or None, planner, own_floor

    def _on_run(self, inputs) -> None:
        """A graph is about to run for training. Under a byte budget the
        first graph of a step starts the watch of its peak (on CUDA)."""
        if self._byte_budget() is not None and len(self.ledger.counting) == 1:
            self.watch.step_begins(inputs)

    def _watch_ended(self) -> None:
        """The backward of a watched step ended: its measured peak. Over the
        byte budget, the step is checked now (where no fallback regions
        wait for ``fxckpt.compile``'s step boundary) and re-planned with
        what the model missed kept aside."""
        budget = self._byte_budget()
        if budget is None:
            return
        if self.watch.read(budget, format_bytes) and self.regions is None:
            self._first_backward_ended()

    def _on_backward(self, first: bool, grad) -> None:
        """A graph's backward began (``first``: the step's first backward,
        ``grad`` what reached the graph's output). Where a graph of the
        first step ran at its floor over the budget (and no fallback regions, which
        ``fxckpt.compile`` checks at its own step boundary, are in the step),
        the step is checked as soon as this backward ends, so a budget below
        the step's floor is refused from the first ``backward()``. A watched
        step's measured peak is read as the backward ends."""
        if first and self.watch.unwatched and not self.state.outside_said:
            self._said_outside(grad)
        if self.watch.to_queue():
            queue_at_backward_end(self._watch_ended)
        state = self.state
        if not state.over_budget or state.first_step_checked or self.regions is not None \
                or state.end_of_backward_queued:
            return
        state.end_of_backward_queued = True
        queue_at_backward_end(self._first_backward_ended)

    def _said_outside(self, grad) -> None:
        """Where no step's peak can be read (the CPU) under a byte budget: a
        step whose first backward begins with a gradient made after the
        compiled graphs runs autograd code the budget does not count. Said
        once."""
        budget = self._byte_budget()
        if budget is None or not made_after_the_graphs(grad):
            return
        self.state.outside_said = True
        warnings.warn(uncounted_outside_warning(budget, format_bytes), stacklevel=3)

    def forward_only_step_ended(self) -> None:
        """A step's forward ran and no backward will (``fxckpt.explain``'s
        capture): where a graph of it ran at its floor, check the step as
        the end of its backward would."""
        if not self.state.over_budget:
            return
        self.ledger.backward_began()
        self._first_backward_ended()

    def _first_backward_ended(self) -> None:
        self.state.end_of_backward_queued = False
        # The autograd engine runs this with grad mode off; a re-plan compiles
        # training graphs.
        with torch.enable_grad():
            if self.ledger.close_step():
                self._on_new_step()

    def _keep_plan(self, plan: Plan) -> None:
        self.plans.append(self._noted(plan))

    def _noted(self, plan: Plan) -> Plan:
        """A plan made under budget="fit" says what the budget was read as."""
        budget = self.options.budget
        if budget is None or not budget.fit:
            return plan
        return replace(plan, notes=plan.notes + (f"budget='fit': {budget}",))

    def _byte_budget(self) -> int | None:
        budget = self.options.budget
        return budget.bytes if budget is not None else None

    def _share(self, frame: int, compile: int) -> int | None:
        """The bytes one graph is asked to fit: a byte budget less what the
        rest of the step holds while it runs (the ledger's graphs and the
        eager fallback regions); None without a byte budget (a fraction is
        read per graph: 0 its floor, 1 its runtime-optimal peak)."""
        budget = self._byte_budget()
        if budget is None:
            return None
        return graph_share(budget, self.ledger.held_before(frame, compile),
                           self.regions.held_bytes() if self.regions is not None else 0,
                           self.unmodelled_bytes)

    def step_ended(self) -> bool:
        """The caller's step ended (``fxckpt.compile`` knows where its calls
        begin): close it in the ledger and, after the first, check it. False
        when the ledger saw no full step (no backward began since its graphs
        ran), so nothing was checked."""
        if not self.ledger.close_step() and self.ledger.live():
            return False
        self._on_new_step()
        return True

    def _on_new_step(self) -> None:
        """A step ended. A step measured over the byte budget is corrected
        for (``_correct_for_measured``); else the first step is checked
        against the budget once (``_check_first_step``)."""
        budget = self._byte_budget()
        measured = self.watch.take_pending()
        if budget is None:
            return
        if measured is not None:
            self.state.first_step_checked = True
            self._correct_for_measured(*measured)
        elif not self.state.first_step_checked:
            self.state.first_step_checked = True
            self._check_first_step()

    def _predicted_step(self) -> tuple[int, int]:
        """The last step as its current plans and the fallback regions'
        choices hold it: the memory model's peak, and the bytes the regions
        reserve."""
        regions = self.regions.choices() if self.regions is not None else []
        reserved = sum((r.floor if r.at_floor else r.policy)[1] for r in regions)
        items, sequence = step_items(*self._step_graphs(current=True), regions,
                                     [r.at_floor for r in regions])
        return step_peak([0] * len(items), items, 0, sequence), reserved

    def _correct_for_measured(self, peak: int, device) -> None:
        """A step measured at ``peak``, over the budget: keep aside what the
        memory model did not read, say so, and re-plan the step."""
        budget = self._byte_budget()
        model, _ = self._predicted_step()
        self.state.over_budget = False
        self.unmodelled_bytes = kept_aside_after(peak, model, budget, self.unmodelled_bytes)
        self.watch.corrections += 1
        warnings.warn(over_budget_warning(peak, budget, model, self.unmodelled_bytes, device,
                                          format_bytes), stacklevel=3)
        self.replan()

    def _check_first_step(self) -> None:
        """The first step: if its graphs, run as often as they were, and the
        fallback regions hold more than the budget allows (or a graph ran at
        its floor over it), re-plan them once, together."""
        budget = self._byte_budget()
        model, reserved = self._predicted_step()
        predicted = model + self.unmodelled_bytes
        over_budget, self.state.over_budget = self.state.over_budget, False
        if not first_step_replans(predicted, budget, over_budget):
            return
        runs = {e.runs for e in self.ledger.run_order()}
        if not over_budget:   # else said when the graph ran at its floor
            warnings.warn(
                f"fxckpt: the first training step was predicted to peak at "
                f"{format_bytes(predicted)}, over the budget of {format_bytes(budget)}"
                + (f" ({format_bytes(reserved)} of it held by eager fallback regions)"
                   if reserved else "")
                + f": its graphs ran {', '.join(map(str, sorted(runs))) or 'no'} time(s) each, "
                "which their plans could not know; re-planning the step once for the steps "
                "after it (see each plan's notes and compiled.fxckpt_report)", stacklevel=3)
        self.replan()

    def _check_sizes(self, check: SizeCheck, args) -> None:
        """A dynamic-shape graph about to run at sizes where its plan would
        exceed its share of the budget: refuse before it runs."""
        over = check.over_budget(args)
        if over is not None:
            raise check.refusal(*over)

    def replan(self) -> None:
        """Plan the step's graphs and fallback regions again, together: one
        frontier plan per graph, in the order they ran, counting a graph that
        runs r times as holding r copies of what it saves, and each region
        at the user's policy or at its floor (``ledger.allocate_step``);
        BudgetError naming the step's floor where no choice fits."""
        budget = self._byte_budget()
        regions = self.regions.choices() if self.regions is not None else []
        order = self.ledger.run_order()
        for entry in order:
            if entry.runs > 1 and entry.frontier:
                gm, example_inputs, _ = self._sources[id(entry)]
                entry.frontier = self.graphs.frontier_for_runs(gm, example_inputs,
                                                               self.options, entry.runs)
            self._learn_floor_point(entry)
        graphs, runs_in_order = self._step_graphs()
        try:
            at_floor, choice = allocate_step(graphs, runs_in_order, budget, regions,
                                             reserved=self.unmodelled_bytes)
        except StepFloor as refused:
            raise step_floor_error(
                budget, [e.runs for e in order], refused.floor, regions=len(regions),
                regions_held=sum(r.floor[1] for r in regions),
                kept_aside=self.unmodelled_bytes,
                floors_made_of=self.state.floors_made_of) from None
        if self.regions is not None:
            self.regions.choose(at_floor)
        items, sequence = step_items(graphs, runs_in_order, regions, at_floor)
        peak = step_peak(choice + [0] * len(regions), items, self.unmodelled_bytes, sequence)
        for entry, (runs, points, _), j in zip(order, graphs, choice):
            own_peak, saved, _ = points[j]
            if entry.frontier and (own_peak, saved) != (entry.plan.peak_bytes,
                                                         entry.plan.saved_bytes):
                self._recompile(entry, own_peak + (runs - 1) * saved, runs, note=(
                    f"re-planned after the first step: runs {runs} time(s) per step, "
                    f"planned with the step's {len(graphs)} graph(s) and {len(regions)} "
                    f"fallback region(s) for a step peak of {format_bytes(peak)}"))

    def _learn_floor_point(self, entry: LedgerEntry) -> None:
        """Under Inductor, give an entry that fitted its share the compiled
        floor point a refused one has (``floor_point``): the frontier's
        lowest point is the memory model's, which its compiled code can peak
        over, so a step planned from it can ask a graph for less than any
        of its compiles reaches, and the step's floor named from compiled
        points would then be refused (tests/test_inductor_floor.py)."""
        if self.options.compiler != "inductor" or entry.floor_point is not None \
                or not entry.frontier or id(entry) not in self._sources:
            return
        gm, example_inputs, sizes = self._sources[id(entry)]
        plan = self.graphs.floor_plan(gm, example_inputs, self.options, sizes)
        if plan is not None:
            entry.floor_point = _floor_point(plan, entry.frontier)

    def _step_graphs(self, *, current: bool = False) -> tuple[list, list[int]]:
        """The last step's graphs as ``ledger.step_items`` reads them: (runs,
        frontier points -- or only the current plan's --, gradient bytes) in
        the order they first ran, and the step's runs as indexes into them."""
        graphs = self.ledger.run_order()
        index = {id(e): i for i, e in enumerate(graphs)}
        return ([(e.runs, _compiled_points(e) if e.frontier and not current
                  else ((e.plan.peak_bytes, e.plan.saved_bytes, 0.0),), e.grad_bytes)
                 for e in graphs],
                [index[id(e)] for e in self.ledger.order if id(e) in index])

    def _recompile(self, entry: LedgerEntry, step_peak: int, runs: int, *, note: str) -> None:
        """Compile the entry's graph again with the frontier plan whose peak
        plus its other runs' saved bytes is ``step_peak``."""
        gm, example_inputs, _ = self._sources[id(entry)]
        plan, compiled = self.graphs.recompile(gm, example_inputs, self.options, step_peak, runs)
        plan = self._noted(plan)
        entry.plan = replace(plan, notes=plan.notes + (note,))
        entry.runner().set_compiled(compiled)
        self.replans += 1

    def __repr__(self) -> str:
        o = self.options
        return (f"fxckpt.backend(budget={o.budget}, policy={o.policy!r}, "
                f"compiler={o.compiler!r}, solver={o.solver!r}"
                + (f", offload_bandwidth={o.offload_bandwidth:g}" if o.offload_bandwidth else "")
                + (f", mode={o.mode!r}" if o.mode != "default" else "") + ")")


# Corrections of a step's plans for bytes measured beyond the memory model's.
_CORRECTIONS = 3


def _floor_point(plan: Plan, frontier: tuple) -> tuple[int, int, float]:
    """A floor plan as a frontier point (peak, saved bytes, cost): the
    dearest of the frontier's costs, as the floor recomputes the most."""
    return (plan.peak_bytes, plan.saved_bytes, max((cost for _, _, cost in frontier), default=0.0))


def _compiled_points(entry: LedgerEntry) -> tuple:
    """The entry's frontier points: from the plan its planning named as its
    lowest (``floor_point``, where a budget it could not fit asked) up; or,
    where its plan is the frontier's floor plan and its compiled code's peak
    is known (Inductor), none below that compiled peak. The frontier's peaks are the memory model's; a
    compiled plan can peak higher, and a budget below the floor plan's
    compiled peak is one the graph's compile refuses (planning/capture.py)."""
    plan, points = entry.plan, entry.frontier
    if entry.floor_point is not None:
        floor = entry.floor_point
        return (floor,) + tuple(p for p in points if p[0] > floor[0] and p[2] < floor[2])
    if plan is None or plan.model_peak_bytes is None or plan.model_peak_bytes != points[0][0] \
            or plan.peak_bytes <= points[0][0]:
        return points
    return tuple((max(peak, plan.peak_bytes), saved, cost) for peak, saved, cost in points)


def backend(*, budget=None, policy=None, compiler: str = DEFAULT_COMPILER,
            solver: str = "auto", offload_bandwidth=None, mode: str | None = None) -> Backend:
    """A torch.compile backend that plans activation checkpointing.

    Args:
        budget: bytes (int) or a string such as "512MiB", for the whole
            training step (fxckpt/budget/ledger.py); or a fraction in [0, 1]
            (a float, or a string such as "0.5" or "50%") read as torch's
            activation_memory_budget: 0 the floor, 1 the runtime-optimal
            plan's peak; or "fit" on a CUDA device: the device's free memory
            when the first graph compiles (what PyTorch's allocator has
            cached but not allocated counts as free) less 10%
            (fxckpt/budget/fit.py), then a byte budget. "fit" raises
            ValueError here on a machine without CUDA, FxckptError at the
            first compile when the graph is not on a CUDA device. None: the
            runtime-optimal plan.
        policy: which values to save, recompute or offload whatever the
            budget (fxckpt.policies: a policy name, a function of the node,
            or a policy object).
        compiler: "inductor" or "eager" (the planned graphs run as aten ops).
        solver: one of fxckpt.options.SOLVERS ("auto" picks the exact
            programme where it is quick, else the fast solver; "per_block",
            "sqrt_n", "save_all", "recompute_all", "mincut": fixed
            strategies, checked against a byte budget).
        offload_bandwidth: bytes per second (or a string such as "12GB/s")
            between device and pinned host memory, the price of CPU offload
            under a budget; None measures it on the device once per process.
        mode: torch.compile's, for fxckpt's Inductor compiles (it may also
            come from ``torch.compile(..., mode=...)``); the modes that
            capture CUDA graphs are refused, since no budget could be kept
            under them.

    Returns:
        A ``Backend`` to pass as ``torch.compile(model, backend=...)``; its
        ``plans`` hold one Plan per graph compiled with a backward.

    Raises:
        BudgetError: at the first step (or the first graph that cannot fit)
            when no plans fit a byte budget; its ``floor_bytes`` is the
            smallest budget that does.

    Example:
        >>> be = fxckpt.backend(budget="512MiB")
        >>> compiled = torch.compile(model, backend=be)
        >>> loss_fn(compiled(x)).backward()
        >>> print(be.plans[0])
    """
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth, mode=mode)
    return Backend(options)


def fxckpt_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None,
                   mode: str | None = None, **unknown):
    """Entry point for ``torch.compile(model, backend="fxckpt", options={...})``.

    Dynamo calls it once per graph with the ``options`` mapping of that
    ``torch.compile`` call, or its ``mode`` (torch.compile takes one or the
    other; ``options={"mode": ...}`` sets both); the graphs of one call share
    one Backend, and so one budget for the step."""
    if unknown:
        raise TypeError(f"the fxckpt backend was called with {sorted(unknown)}, which it "
                        "does not take: torch.compile passes it mode= or options= only")
    return _backend_for(options, mode)(gm, example_inputs)


# One Backend per torch.compile call with options, keyed by the options
# mapping that call passes with every graph (kept, so its id stays its own).
_by_options: dict[tuple[int, str | None], tuple[dict | None, Backend]] = {}


def _backend_for(options: dict | None, mode: str | None = None) -> Backend:
    """The Backend of one torch.compile call: one per options mapping (and
    mode, where torch.compile passes that instead)."""
    key = (id(options), mode)
    kept = _by_options.get(key)
    if kept is None or kept[0] is not options:
        defaults = {"mode": mode} if mode is not None else {}
        kept = (options, Backend(Options.from_mapping(options, **defaults)))
        _by_options[key] = kept
    return kept[1]


def gradient_bytes(example_inputs: list[Any]) -> int:
    """Bytes of the gradients a graph's backward leaves in its parameters'
    ``.grad``: one per parameter that requires grad, each storage once."""
    sizes = {storage_key(x): x.numel() * x.element_size() for x in example_inputs
             if isinstance(x, torch.nn.Parameter) and x.requires_grad}
    return sum(sizes.values())

"""The step ledger: what the graphs of one training step hold for backward,
which a byte budget is shared across.

A budget is a promise about the step, not about one graph. So:

- Graphs that replace each other never add up. Dynamo names each compile
  ``frame_id/frame_compile_id``: a recompile of a frame (a smaller last
  batch, ``model.eval()`` and back, frozen parameters) gets a new compile
  id of the same frame, and only one of them runs per call. Graphs of one
  compile (DDP's buckets) run together and do add up.
- A graph Dynamo drops (``torch.compiler.reset()``, a cache eviction) leaves
  the ledger: entries hold their graph's runner weakly.
- A graph that runs r times per step (one block graph serving every block,
  FSDP2 per block, ``block.compile()``) holds r copies of what it saves.
  Runners count their forward runs; a step ends when a forward runs after a
  backward began. After the first full step the ledger knows each graph's
  run count and run order; where the step's predicted peak is over the
  budget it re-plans every graph once, in run order, for what it may hold
  given the runs (``Backend.replan``), and says so in the plans' notes.

Graph k is given the budget less what the graphs that ran before it hold
(before the first step: the graphs compiled before it, as forwards compile
in the order they first run), and eager fallback regions count like graphs
that ran before.

After the first step the step is read as its runs in order (``step_items``):
each run peaks at what the runs before it hold, plus its own peak, plus the
parameter gradients the runs after it left (backward runs in reverse, and a
gradient lives to the end of the step). Eager fallback regions
(``fxckpt.compile``) are runs too, placed where they ran among the graphs,
with two choices each -- the user's policy or the region's floor --
(``RegionChoice``, ``allocate_step``).
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from fxckpt.compat.dynamo import is_boxed, mark_boxed
from fxckpt.compat.ops import is_fake
from fxckpt.report.plan import Plan


@dataclass(eq=False)
class LedgerEntry:
    """One compiled graph: its Dynamo compile, its plan, its runner."""

    frame: int                      # Dynamo's frame_id (negative outside Dynamo)
    compile: int                    # Dynamo's frame_compile_id
    plan: Plan | None               # None: no backward, nothing held
    runner: Callable[[], Any]       # a weak reference to the GraphRunner
    runs: int = 1                   # forward runs per step, from the last full step
    grad_bytes: int = 0             # the parameter gradients its backward leaves
    # The graph's frontier as (own peak, saved bytes, cost), lowest peak
    # first, when it was planned under a budget: what ``allocate`` picks from.
    frontier: tuple[tuple[int, int, float], ...] = ()
    # Where its planning refused a budget and it was planned at the lowest
    # peak it named: that plan, as (peak, saved bytes, cost). Under Inductor
    # its compiled peak, which the frontier's memory-model peaks can read
    # below or far above (a convolution the model reads channels-last).
    floor_point: tuple[int, int, float] | None = None

    @property
    def alive(self) -> bool:
        return self.runner() is not None

    def held_bytes(self) -> int:
        return self.plan.saved_bytes * self.runs if self.plan is not None else 0


@dataclass
class StepLedger:
    entries: list[LedgerEntry] = field(default_factory=list)
    order: list[LedgerEntry] = field(default_factory=list)   # last full step's runs
    counting: list[LedgerEntry] = field(default_factory=list)   # this step's runs so far
    in_backward: bool = False
    steps: int = 0                  # full steps seen

    def add(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)

    def live(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.alive]

    def held_before(self, frame: int, compile: int) -> int:
        """What the other graphs hold while a graph of compile
        ``frame/compile`` runs: those that ran before that frame in the last
        step, or, before a step was seen, every live graph of another frame
        (a frame's own earlier compiles are replaced, not added) and the
        earlier graphs of the same compile."""
        if self.order and any(e.frame == frame for e in self.order):
            first = next(i for i, e in enumerate(self.order) if e.frame == frame)
            return _held(e for e in self.order[:first] if e.alive)
        return _held(e for e in self.live()
                     if e.frame != frame or e.compile == compile)

    # --- counting runs ----------------------------------------------------

    def ran(self, entry: LedgerEntry) -> bool:
        """Record a forward run; True when it starts a new step (the step
        before it is then in ``order``)."""
        started = self.close_step()
        self.counting.append(entry)
        return started

    def close_step(self) -> bool:
        """End the step under way if its backward has begun (its runs move
        to ``order``); True if one ended. A caller that knows where steps
        begin (``fxckpt.compile``) calls it before the next step's first run."""
        if not self.in_backward:
            return False
        self.order, self.counting = self.counting, []
        self.in_backward = False
        self.steps += 1
        for e in self.live():
            e.runs = max(1, sum(1 for r in self.order if r is e))
        return True

    def backward_began(self, *_: Any) -> None:
        self.in_backward = True

    def run_order(self) -> list[LedgerEntry]:
        """The graphs of the last full step, each once, in the order they first ran."""
        return list(dict.fromkeys(e for e in self.order if e.alive and e.plan is not None))


@dataclass(frozen=True)
class RegionChoice:
    """One eager fallback region as a step's budget sees it: where it runs
    among the graphs, the parameter gradients its backward leaves, and for
    each policy it can run with, (its own peak, the bytes it holds for
    backward) -- its own peak being what it holds, what its recomputation
    re-creates in backward, and its gradients."""

    after_runs: int                 # graph runs of the step before its first call
    grad_bytes: int
    policy: tuple[int, int]         # with the user's policy
    floor: tuple[int, int]          # at its floor
    at_floor: bool = False          # as it runs now


class StepRegions(Protocol):
    """The eager fallback regions of a step (``fxckpt.compile``), as the
    backend plans them with its graphs."""

    def held_bytes(self) -> int:
        """What the regions hold for backward as they run now (so far, during
        their first step)."""

    def choices(self) -> list[RegionChoice]:
        """The regions measured, in the order they first ran."""

    def choose(self, at_floor: list[bool]) -> None:
        """Run these regions (by ``choices``' order) at their floor from the
        next step on, the others with the user's policy."""


def step_items(graphs: list[tuple[int, tuple, int]], runs_in_order: list[int],
               regions: list[RegionChoice], at_floor: list[bool]
               ) -> tuple[list[tuple[int, tuple]], list[tuple[int, int]]]:
    """The step as ``allocate`` reads it: (runs, points) per item -- the
    graphs, then the regions, one point each, at their floor or not -- and
    the step's runs in order, as (item, bytes of the gradients the runs
    after it leave). ``graphs`` are (runs, frontier points, gradient bytes),
    ``runs_in_order`` the last step's graph runs as indexes into them; a
    region runs once, after the first ``after_runs`` graph runs.

    A gradient stays alive from the backward that makes it to the end of
    the step, and backward runs in reverse order, so each run's peak is
    raised by the gradients of the runs after it. Each run of a graph is
    counted as leaving its own gradients (as the blocks of a model do, each
    with its parameters; a graph run again on the same parameters
    accumulates into one, and is overcounted)."""
    items = [(runs, points) for runs, points, _ in graphs]
    items += [(1, ((*(r.floor if low else r.policy), 0.0),)) for r, low in zip(regions, at_floor)]
    grads = [g for _, _, g in graphs] + [r.grad_bytes for r in regions]
    order = list(runs_in_order)
    # From the last region back, so that earlier positions stay where they were.
    for k in sorted(range(len(regions)), key=lambda k: (regions[k].after_runs, k), reverse=True):
        order.insert(min(regions[k].after_runs, len(runs_in_order)), len(graphs) + k)
    sequence, later = [], 0
    for item in reversed(order):
        sequence.append((item, later))
        later += grads[item]
    sequence.reverse()
    return items, sequence


class StepFloor(Exception):
    """No choice of plans fits: ``floor`` is the smallest step budget one does."""

    def __init__(self, floor: int) -> None:
        super().__init__(floor)
        self.floor = floor


def step_peak(choice, graphs, reserved: int, sequence=None) -> int:
    """The step's peak when graph i takes frontier point choice[i]: over the
    step's runs in order, the largest of what the runs before hold, plus the
    run's own peak, plus the gradients later runs left. ``sequence`` is
    (graph, gradient bytes) per run (``step_items``); by default each
    graph's runs back to back, in order, without gradients -- a graph that
    runs r times peaks at its last run, over its other runs' saved bytes."""
    if sequence is None:
        sequence = [(i, 0) for i, (runs, _) in enumerate(graphs) for _ in range(runs)]
    held, peak = reserved, reserved
    for i, later in sequence:
        own, saved, _ = graphs[i][1][choice[i]]
        peak = max(peak, held + own + later)
        held += saved
    return peak


def allocate(graphs: list[tuple[int, tuple]], budget: int, reserved: int = 0,
             sequence=None) -> list[int]:
    """One frontier point per graph so that the step's peak fits ``budget``
    at the least recompute (cost x runs). Every graph at its floor -- the
    lowest peak each can reach -- is the step's floor; if that does not fit,
    StepFloor names it (a budget can then ask for it and be met). Up to
    ``_EXHAUSTIVE`` combinations every one is tried; above, starting from the
    floors, the move to a cheaper point that saves the most cost is taken
    while one fits. ``graphs`` are (runs, points) in run order, points lowest
    peak first, each cheaper than the one before; ``sequence`` as in
    ``step_peak``."""
    def peak(c) -> int:
        return step_peak(c, graphs, reserved, sequence)

    choice = [0] * len(graphs)
    floor = peak(choice)
    if floor > budget:
        raise StepFloor(floor)
    if math.prod(len(points) for _, points in graphs) <= _EXHAUSTIVE:
        return list(min((c for c in itertools.product(*(range(len(p)) for _, p in graphs))
                         if peak(c) <= budget),
                        key=lambda c: _cost(c, graphs)))
    while True:
        best, best_gain = None, 0.0
        for i, (runs, points) in enumerate(graphs):
            for j in range(choice[i] + 1, len(points)):
                gain = runs * (points[choice[i]][2] - points[j][2])
                trial = choice[:i] + [j] + choice[i + 1:]
                if gain > best_gain and peak(trial) <= budget:
                    best, best_gain = (i, j), gain
        if best is None:
            return choice
        choice[best[0]] = best[1]


_EXHAUSTIVE = 20_000


def allocate_step(graphs: list[tuple[int, tuple, int]], runs_in_order: list[int], budget: int,
                  regions: list[RegionChoice], reserved: int = 0
                  ) -> tuple[list[bool], list[int]]:
    """``allocate`` for a step (``step_items``) that also runs eager
    fallback regions. Regions keep the user's policy while some choice of
    graph plans fits; otherwise they move to their floor one at a time, the
    one that holds the most above it first, until one does. (What a region
    recomputes runs op by op, uncompiled: the dearer place to recompute, and
    its policy is the one the user chose for it.) Returns (which regions run
    at their floor, one frontier point per graph); StepFloor names the
    step's floor, every region and graph at its own. ``reserved`` bytes are
    held throughout the step (as in ``step_peak``)."""
    movable = sorted((i for i, r in enumerate(regions) if r.policy != r.floor),
                     key=lambda i: regions[i].floor[1] - regions[i].policy[1])
    refused = None
    for moved in range(len(movable) + 1):
        at_floor = [i in movable[:moved] for i in range(len(regions))]
        items, sequence = step_items(graphs, runs_in_order, regions, at_floor)
        try:
            choice = allocate(items, budget, reserved, sequence=sequence)
        except StepFloor as error:
            refused = error
            continue
        return at_floor, choice[:len(graphs)]
    raise refused


def _cost(choice, graphs) -> float:
    return sum(runs * points[j][2] for (runs, points), j in zip(graphs, choice))


def _held(entries) -> int:
    """Saved bytes x runs, graphs of one frame counted once (the largest of
    its compiles: they replace each other), compiles summed within."""
    by_frame: dict[int, dict[int, int]] = {}
    for e in entries:
        compiles = by_frame.setdefault(e.frame, {})
        compiles[e.compile] = compiles.get(e.compile, 0) + e.held_bytes()
    return sum(max(compiles.values()) for compiles in by_frame.values())


class GraphRunner:
    """What the backend returns to Dynamo for one graph: it runs the compiled
    graph, counts its forward runs for the ledger, marks where backward
    begins, and can swap in a re-planned compile between steps."""

    def __init__(self, compiled, ledger: StepLedger, on_new_step: Callable[[], None],
                 on_backward: Callable[[bool, Any], None] | None = None,
                 on_run: Callable[[Any], None] | None = None) -> None:
        self.ledger = ledger
        self.on_new_step = on_new_step
        # Called as the graph's backward begins, with whether it is the
        # step's first backward and the gradient reaching the graph's output.
        self.on_backward = on_backward
        self.on_run = on_run             # called with the inputs before each training run
        self.entry: LedgerEntry | None = None
        self.size_check: Callable[[Any], None] | None = None   # dynamic sizes (fxckpt/budget/sizes.py)
        self.set_compiled(compiled)

    def set_compiled(self, compiled) -> None:
        self.compiled = compiled
        mark_boxed(self, is_boxed(compiled))

    def __call__(self, *args):
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if self.entry is None or not torch.is_grad_enabled() or \
                any(is_fake(a) for a in flat):
            # Inference, or DDPOptimizer's fake call while compiling: nothing held.
            return self.compiled(*args)
        if self.size_check is not None:
            self.size_check(flat)
        if self.ledger.ran(self.entry):
            self.on_new_step()
        if self.on_run is not None:
            self.on_run(flat)
        out = self.compiled(*args)
        self._mark_backward(out)
        return out

    def _mark_backward(self, out) -> None:
        for value in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(value, torch.Tensor) and value.requires_grad \
                    and value.grad_fn is not None:
                value.register_hook(self._backward_began)
                return

    def _backward_began(self, grad: Any = None) -> None:
        first = not self.ledger.in_backward
        self.ledger.backward_began()
        if self.on_backward is not None:
            self.on_backward(first, grad)


def compile_key(gm) -> tuple[int, int]:
    """Dynamo's frame_id and frame_compile_id of the compile that made ``gm``;
    a frame of its own (a negative id) for a graph that comes from elsewhere."""
    compile_id = getattr(gm, "meta", {}).get("dynamo_compile_id")
    if compile_id is None:
        return -id(gm), 0
    return compile_id.frame_id, compile_id.frame_compile_id


def weak(runner: GraphRunner) -> Callable[[], Any]:
    return weakref.ref(runner)

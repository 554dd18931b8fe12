"""The step ledger: what the graphs of one training step hold for backward,
which a byte budget is shared across.

A budget is a promise about the step, not about one graph. So:

- Graphs that replace each other never add up. Dynamo names each compile
  ``frame_id/frame_compile_id``: a recompile of a frame (a smaller last
  batch, ``model.eval()`` and back, frozen parameters) gets a new compile
  id of the same frame, and only one of them runs per call. Graphs of one
  compile (DDP's buckets) run together and do add up.
- A graph Dynamo drops (``torch._dynamo.reset()``, a cache eviction) leaves
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
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fxckpt.plan import Plan


@dataclass(eq=False)
class LedgerEntry:
    """One compiled graph: its Dynamo compile, its plan, its runner."""

    frame: int                      # Dynamo's frame_id (negative outside Dynamo)
    compile: int                    # Dynamo's frame_compile_id
    plan: Plan | None               # None: no backward, nothing held
    runner: Callable[[], Any]       # a weak reference to the GraphRunner
    runs: int = 1                   # forward runs per step, from the last full step
    # The graph's frontier as (own peak, saved bytes, cost), lowest peak
    # first, when it was planned under a budget: what ``allocate`` picks from.
    frontier: tuple[tuple[int, int, float], ...] = ()

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
        started = False
        if self.in_backward:
            self.order, self.counting = self.counting, []
            self.in_backward, started = False, True
            self.steps += 1
            for e in self.live():
                e.runs = max(1, sum(1 for r in self.order if r is e))
        self.counting.append(entry)
        return started

    def backward_began(self, *_: Any) -> None:
        self.in_backward = True

    def step_peak(self) -> int:
        """The last full step's peak as the plans predict it: a run's own
        peak plus what the runs before it saved."""
        peak = held = 0
        for entry in self.order:
            if entry.plan is not None:
                peak = max(peak, held + entry.plan.peak_bytes)
                held += entry.plan.saved_bytes
        return peak

    def run_order(self) -> list[LedgerEntry]:
        """The graphs of the last full step, each once, in the order they first ran."""
        return list(dict.fromkeys(e for e in self.order if e.alive and e.plan is not None))


class StepFloor(Exception):
    """No choice of plans fits: ``floor`` is the smallest step budget one does."""

    def __init__(self, floor: int) -> None:
        super().__init__(floor)
        self.floor = floor


def step_peak(choice, graphs, reserved: int) -> int:
    """The step's peak when graph i (runs r_i, in run order) takes frontier
    point choice[i]: the largest, over the graphs, of what the graphs before
    it hold (r x saved each), plus its own peak, plus its other runs' saved."""
    held, peak = reserved, reserved
    for (runs, points), j in zip(graphs, choice):
        own, saved, _ = points[j]
        peak = max(peak, held + own + (runs - 1) * saved)
        held += runs * saved
    return peak


def allocate(graphs: list[tuple[int, tuple]], budget: int, reserved: int = 0) -> list[int]:
    """One frontier point per graph so that the step's peak fits ``budget``
    at the least recompute (cost x runs). Every graph at its floor -- the
    lowest peak each can reach -- is the step's floor; if that does not fit,
    StepFloor names it (a budget can then ask for it and be met). Up to
    ``_EXHAUSTIVE`` combinations every one is tried; above, starting from the
    floors, the move to a cheaper point that saves the most cost is taken
    while one fits. ``graphs`` are (runs, points) in run order, points lowest
    peak first, each cheaper than the one before."""
    choice = [0] * len(graphs)
    floor = step_peak(choice, graphs, reserved)
    if floor > budget:
        raise StepFloor(floor)
    if math.prod(len(points) for _, points in graphs) <= _EXHAUSTIVE:
        return list(min((c for c in itertools.product(*(range(len(p)) for _, p in graphs))
                         if step_peak(c, graphs, reserved) <= budget),
                        key=lambda c: _cost(c, graphs)))
    while True:
        best, best_gain = None, 0.0
        for i, (runs, points) in enumerate(graphs):
            for j in range(choice[i] + 1, len(points)):
                gain = runs * (points[choice[i]][2] - points[j][2])
                trial = choice[:i] + [j] + choice[i + 1:]
                if gain > best_gain and step_peak(trial, graphs, reserved) <= budget:
                    best, best_gain = (i, j), gain
        if best is None:
            return choice
        choice[best[0]] = best[1]


_EXHAUSTIVE = 20_000


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

    def __init__(self, compiled, ledger: StepLedger, on_new_step: Callable[[], None]) -> None:
        self.ledger = ledger
        self.on_new_step = on_new_step
        self.entry: LedgerEntry | None = None
        self.size_check: Callable[[Any], None] | None = None   # dynamic sizes (fxckpt/sizes.py)
        self.set_compiled(compiled)

    def set_compiled(self, compiled) -> None:
        self.compiled = compiled
        self._boxed_call = getattr(compiled, "_boxed_call", False)

    def __call__(self, *args):
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        if self.entry is None or not torch.is_grad_enabled() or \
                any(isinstance(a, torch._subclasses.FakeTensor) for a in flat):
            # Inference, or DDPOptimizer's fake call while compiling: nothing held.
            return self.compiled(*args)
        if self.size_check is not None:
            self.size_check(flat)
        if self.ledger.ran(self.entry):
            self.on_new_step()
        out = self.compiled(*args)
        self._mark_backward(out)
        return out

    def _mark_backward(self, out) -> None:
        for value in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(value, torch.Tensor) and value.requires_grad \
                    and value.grad_fn is not None:
                value.register_hook(self.ledger.backward_began)
                return


def compile_key(gm) -> tuple[int, int]:
    """Dynamo's frame_id and frame_compile_id of the compile that made ``gm``;
    a frame of its own (a negative id) for a graph that comes from elsewhere."""
    compile_id = getattr(gm, "meta", {}).get("dynamo_compile_id")
    if compile_id is None:
        return -id(gm), 0
    return compile_id.frame_id, compile_id.frame_compile_id


def weak(runner: GraphRunner) -> Callable[[], Any]:
    return weakref.ref(runner)

"""fxckpt under data parallelism: plans every rank can compare, and what a step
holds when Dynamo runs one compiled graph several times.

What the backend is given on each rank (torch 2.13):

- FSDP2, ``fully_shard`` per block and ``torch.compile`` on the model: FSDP's
  hooks are ``torch.compiler.disable``d, so its all-gathers and reduce-scatters
  run eagerly, outside every graph, and each block call breaks the graph. The
  break sits inside the model's ``for block in blocks`` loop, so Dynamo runs
  the model's own forward (embeddings, head) eagerly and compiles the block's
  forward as a frame of its own. Parameters are graph inputs, so that one graph
  serves every block: the backend plans it once and a step runs it once per
  block, holding its saved bytes that many times.
- DDP: the model's forward is one frame. DDPOptimizer splits its graph at
  gradient-bucket boundaries and hands the pieces to the backend one by one, in
  forward order; each runs once per step. The all-reduces stay in DDP's reducer,
  outside the graphs.

So neither puts a collective in a graph fxckpt plans. Where user code does
(functional collectives), the collective's value is saved, never recomputed
(``fxckpt/ops.py``), and a policy that demands its recomputation is an error.

``check_plans_agree`` compares plan fingerprints across ranks; ``GraphRuns``
counts how often each compiled graph runs in a step, so what the step holds can
be set against the budget.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.distributed as dist

from fxckpt.compat.dynamo import is_boxed, mark_boxed
from fxckpt.compat.ops import is_fake
from fxckpt.errors import BudgetError, FxckptError
from fxckpt.options import format_bytes
from fxckpt.report.plan import Plan


def plans_fingerprint(plans: Sequence[Plan]) -> str:
    """One digest for a sequence of plans (a step's graphs, in compile order)."""
    digest = hashlib.sha256()
    for plan in plans:
        digest.update(plan.fingerprint.encode())
    return digest.hexdigest()


def check_plans_agree(plans: Sequence[Plan], *, group=None) -> str:
    """Gather every rank's plan fingerprints and return the common digest, or
    raise FxckptError naming the ranks and the first graph that differ.

    Every rank of ``group`` must call it (it is a collective). Ranks that plan
    differently run different recomputations: harmless for DDP and FSDP2,
    whose collectives are outside the graphs, a hang where a graph holds one.
    Without an initialised process group there is nothing to compare with."""
    if not (dist.is_available() and dist.is_initialized()):
        return plans_fingerprint(plans)
    mine = [_summary(plan) for plan in plans]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    for rank, theirs in enumerate(gathered[1:], start=1):
        if [s["fingerprint"] for s in theirs] != [s["fingerprint"] for s in gathered[0]]:
            raise FxckptError(_disagreement(gathered[0], theirs, rank))
    return plans_fingerprint(plans)


def _summary(plan: Plan) -> dict:
    return {"fingerprint": plan.fingerprint, "saved": list(plan.saved),
            "recomputed": list(plan.recomputed), "saved_bytes": plan.saved_bytes}


def _disagreement(first: list[dict], other: list[dict], rank: int) -> str:
    head = f"fxckpt plans differ between rank 0 and rank {rank}: "
    if len(first) != len(other):
        where = (f"rank 0 compiled {len(first)} graph(s), rank {rank} "
                 f"{len(other)}")
    else:
        index = next(i for i, (a, b) in enumerate(zip(first, other))
                     if a["fingerprint"] != b["fingerprint"])
        a, b = first[index], other[index]
        only_0 = sorted(set(a["saved"]) - set(b["saved"]))
        only_r = sorted(set(b["saved"]) - set(a["saved"]))
        where = (f"graph {index} saves {format_bytes(a['saved_bytes'])} on rank 0 and "
                 f"{format_bytes(b['saved_bytes'])} on rank {rank}; saved only on "
                 f"rank 0: {only_0[:8]}, only on rank {rank}: {only_r[:8]}")
    return (head + where + ". Every rank must compile the same graphs with the same "
            "options (budget, policy, solver) and input shapes; a solver stopped by "
            "its time limit can also answer differently per rank (use solver='mincut').")


def predicted_peak(runs: Sequence[Plan]) -> int:
    """The peak of a step whose graphs run in this (forward) order, by their
    plans: the largest, over the runs, of a run's own peak plus what the runs
    before it saved, which stay held until their backward, after its own."""
    peak = held = 0
    for plan in runs:
        peak = max(peak, held + plan.peak_bytes)
        held += plan.saved_bytes
    return peak


class GraphRuns:
    """A dynamo backend around an fxckpt Backend that records which compiled
    graphs run in a step, in order (since the last ``new_step()``, called as a
    step begins).

    The Backend's own ledger (fxckpt/budget/ledger.py) budgets the step: under FSDP2
    one block graph runs once per block, the step holds its saved bytes that
    many times, and the backend re-plans it after the first step. This
    records the same runs from outside, per step, for tests and examples:
    ``peak_bytes()`` is the step's peak as the current plans predict it
    (``predicted_peak`` over the runs) and ``check_budget()`` raises where that
    exceeds the budget.

    ``around``, if given, makes a context manager entered around every run of a
    compiled graph (to measure what the graphs save, say). The fake-tensor call
    DDPOptimizer makes while compiling is neither recorded nor wrapped.
    """

    def __init__(self, backend, *, around: Callable[[], ContextManager] | None = None):
        self.backend = backend
        self.around = around
        self._graphs: list[tuple[Any, Plan | None]] = []   # (what the backend returned, plan)
        self.order: list[int] = []           # graph indices, as they ran this step

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        before = len(self.backend.plans)
        compiled = self.backend(gm, example_inputs)
        new = self.backend.plans[before:]
        self._graphs.append((compiled, new[0] if new else None))
        return self._recorded(compiled, len(self._graphs) - 1)

    @property
    def plans(self) -> list[Plan | None]:
        """Each compiled graph's plan as it stands (None: no backward); a
        re-plan of the backend's after the first step replaces it."""
        return [getattr(getattr(compiled, "entry", None), "plan", plan)
                for compiled, plan in self._graphs]

    def _recorded(self, compiled, index: int):
        boxed = is_boxed(compiled)

        def run(*args):
            flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
            if any(is_fake(a) for a in flat):
                return compiled(*args)
            self.order.append(index)
            with (self.around() if self.around else contextlib.nullcontext()):
                return compiled(*args)

        mark_boxed(run, boxed)
        return run

    def new_step(self) -> None:
        self.order = []

    @property
    def runs(self) -> list[int]:
        """How many times each compiled graph ran this step."""
        return [self.order.count(index) for index in range(len(self.plans))]

    def held_bytes(self) -> int:
        """What the step's forward left saved for backward, by the plans."""
        return sum(plan.saved_bytes for plan in self._planned_runs())

    def peak_bytes(self) -> int:
        return predicted_peak(self._planned_runs())

    def _planned_runs(self) -> list[Plan]:
        plans = self.plans
        return [plans[i] for i in self.order if plans[i] is not None]

    def check_budget(self, budget_bytes: int | None = None) -> int:
        """The step's predicted peak; BudgetError where it exceeds
        ``budget_bytes`` (by default the backend's byte budget)."""
        peak = self.peak_bytes()
        if budget_bytes is None:
            budget = self.backend.options.budget
            budget_bytes = budget.bytes if budget is not None else None
        if budget_bytes is None or peak <= budget_bytes:
            return peak
        repeated = [(i, runs, self.plans[i]) for i, runs in enumerate(self.runs)
                    if runs > 1 and self.plans[i] is not None]
        detail = "; ".join(f"graph {i} ran {runs} times, saving "
                           f"{format_bytes(plan.saved_bytes)} each time"
                           for i, runs, plan in repeated)
        raise BudgetError(
            f"this step peaks at {format_bytes(peak)} by the plans, over the budget of "
            f"{format_bytes(budget_bytes)}" + (f": {detail}" if detail else "")
            + ". The backend re-plans graphs that run several times per step once "
            "the first step has shown how often they run (fxckpt/budget/ledger.py); a check "
            "during that first step can still see the plans made before it.",
            floor_bytes=None)

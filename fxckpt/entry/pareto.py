"""fxckpt.pareto: what each memory budget costs, from one capture.

The budget only selects among a fixed set of plans: solve/frontier builds
the graph's peak / recompute-cost frontier, and a few plans filled inside
each of its steps, without looking at the budget, then takes the cheapest
of them that fits. So a sweep captures the
joint graph once, plans the frontier once (pipeline.FrontierPlanner), and
reads every budget off it: twenty budgets cost one compile, not twenty, and
each row is the plan ``fxckpt.backend(budget=...)`` would choose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterable


from fxckpt.planning.capture import capture_once, compile_planned
from fxckpt.errors import FxckptError
from fxckpt.options import DEFAULT_COMPILER, Options, format_bytes, parse_budget
from fxckpt.planning.pipeline import Frontier, FrontierPlanner, request_for
from fxckpt.solve.select import bytes_asked
from fxckpt.report.plan import Plan


@dataclass(frozen=True)
class ParetoRow:
    """One budget and the plan it gets; ``plan`` is None (and the numbers
    are None) when the budget is below the floor."""

    budget_bytes: int | None          # None: no budget (the runtime-optimal plan)
    predicted_peak_bytes: int | None
    recompute_cost: float | None      # estimated seconds of extra work
    recompute_flops: int | None
    saved_bytes: int | None
    solver: str
    plan: Plan | None = field(default=None, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return self.plan is not None


@dataclass(frozen=True)
class ParetoSweep:
    """Rows of a budget sweep over one graph, and its frontier.

    ``frontier`` holds every plan a budget can select, lowest peak first;
    ``floor_bytes`` is the smallest budget any plan meets; ``seconds`` is
    capture and planning, wall time. ``peaks_from`` says where the peaks
    come from: the memory model's, for every compiler. With
    compiler="eager" they are what the step allocates and ``floor_bytes``
    is the floor ``BudgetError`` names; under Inductor the code Inductor
    generates for a plan can peak higher, a byte budget is checked against
    that code, and ``BudgetError`` (``fxckpt.explain(..., budget=1)``)
    names a compiled floor, which may be above ``floor_bytes``."""

    rows: tuple[ParetoRow, ...]
    frontier: tuple[Plan, ...] = field(repr=False)
    runtime_optimal: Plan = field(repr=False)
    floor_bytes: int
    seconds: float
    peaks_from: str = "memory model"

    def plot(self, ax=None, *, label: str = "fxckpt frontier"):
        """Predicted peak against recompute cost: the frontier as a step
        line, the swept budgets as markers. Returns the matplotlib Figure."""
        from fxckpt.report.render import plot_pareto

        return plot_pareto(self, ax=ax, label=label)

    def __str__(self) -> str:
        from fxckpt.report.render import sweep_text

        return sweep_text(self)

    def _repr_html_(self) -> str:
        from fxckpt.report.render import sweep_html

        return sweep_html(self)


def pareto(model, *example_inputs, budgets: Iterable | None = None, policy=None,
           solver: str = "auto", compiler: str = DEFAULT_COMPILER) -> ParetoSweep:
    """Sweep memory budgets for ``model`` on ``example_inputs``.

    Nothing is trained: like ``fxckpt.explain``, a copy of the model runs
    one forward, with the caller's RNG left untouched.

    Args:
        model: an ``nn.Module`` or a function.
        *example_inputs: the inputs of one training step's forward.
        budgets: any budget forms (bytes, "512MiB", a fraction of the way
            from the floor to the runtime-optimal peak, as ``fxckpt.backend``
            reads it); None sweeps the frontier itself, one row
            per plan a budget can select, plus the row without a budget.
        policy: as ``fxckpt.backend``'s.
        solver: "auto", "ilp" or "fast".
        compiler: defaults to ``fxckpt.backend()``'s, so each row is the
            plan that backend runs.

    Returns:
        A ``ParetoSweep``: rows in the order of ``budgets`` (a budget below
        the floor gives a row without a plan), the frontier's plans, the
        runtime-optimal plan and the floor; ``print`` it for a table.

    Example:
        >>> print(fxckpt.pareto(model, x, budgets=[0.0, 0.5, 1.0]))
    """
    if solver not in ("auto", "ilp", "fast"):
        raise ValueError(f"pareto sweeps the budgeted solvers ('auto', 'ilp', 'fast'); "
                         f"solver={solver!r} plans without a budget")
    start = time.perf_counter()
    frontier = capture_frontier(model, *example_inputs, policy=policy, solver=solver,
                                compiler=compiler)
    optimal = frontier.runtime_optimal
    if budgets is None:
        resolved: list[int | None] = [None] + [plan.peak_bytes for plan in frontier.plans]
    else:
        resolved = [_resolve(b, frontier) for b in budgets]
    rows = tuple(_row(frontier, budget) for budget in resolved)
    return ParetoSweep(rows=rows, frontier=frontier.plans, runtime_optimal=optimal,
                       floor_bytes=frontier.plans[0].peak_bytes,
                       seconds=time.perf_counter() - start, peaks_from=_PEAKS_FROM.get(compiler, "memory model"))


_PEAKS_FROM = {
    "eager": "memory model",
    "inductor": "memory model, not Inductor's compiled code: a budget is checked "
                "against the compiled code, which can peak higher (fxckpt.explain "
                "with budget=1 names the compiled floor)",
}


def capture_frontier(model, *example_inputs, policy=None, solver: str = "auto",
                     compiler: str = DEFAULT_COMPILER) -> Frontier:
    """Capture ``model``'s one joint graph and plan its whole frontier."""
    options = Options.create(policy=policy, compiler=compiler, solver=solver)
    planner = FrontierPlanner(options)
    capture_once(model, example_inputs,
                 lambda gm, inputs: compile_planned(gm, inputs, planner))
    if len(planner.frontiers) != 1:
        raise FxckptError(
            f"fxckpt.pareto sweeps one graph, and this model gave "
            f"{len(planner.frontiers)} graphs with a backward (graph breaks, or "
            "nothing requiring grad); sweep a graph-break-free part of the model, "
            "or call fxckpt.explain(model, *inputs, budget=...) per budget")
    return planner.frontiers[0]


def _resolve(budget, frontier: Frontier) -> int | None:
    """The bytes a budget asks of the graph, as the backend reads it (a
    fraction of the way from the floor to the runtime-optimal peak)."""
    request = request_for(parse_budget(budget))
    return None if request is None else bytes_asked(
        request, frontier.plans[0].peak_bytes, frontier.runtime_optimal.peak_bytes)


def _row(frontier: Frontier, budget: int | None) -> ParetoRow:
    if budget is None:
        plan = frontier.runtime_optimal
    else:
        plan = frontier.select(budget)
        if plan is None:
            return ParetoRow(budget, None, None, None, None,
                             f"none: below the floor of "
                             f"{format_bytes(frontier.plans[0].peak_bytes)}")
        plan = replace(plan, budget_bytes=budget)
    return ParetoRow(budget, plan.peak_bytes, plan.recompute_cost, plan.recompute_flops,
                     plan.saved_bytes, plan.solver, plan)

"""What the frontier's stages share, and the loop that runs them.

A stage is a function ``(search, found) -> Added``: ``search`` holds the
graph's proxy, the exact evaluation and the effort; ``found`` the plans
the stages before it made that it is shown. Its contract: it only adds
plans (it never removes or edits one), and every plan it adds comes from
``search.candidate``, so its peak is the exact memory model's. A stage
may also hand the stages after it a refined proxy, the sweep's step
ratio or the cut plans' price series (``Added``'s other fields).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from fxckpt.solve.candidates import Candidate, non_dominated
from fxckpt.solve.effort import Effort
from fxckpt.solve.fast import CutPlans, solve_fast
from fxckpt.solve.ilp import Relaxations, solve_ilp
from fxckpt.solve.problem import Problem, to_decision
from fxckpt.types import Decision


@dataclass(frozen=True)
class Search:
    """One graph's search: ``base`` is the proxy as first built, ``proxy``
    the one the sweep refined (recompute chains its plans use);
    ``candidate`` evaluates a decision exactly (each distinct plan once)."""

    base: Problem
    proxy: Problem
    candidate: Callable[[Decision], Candidate]
    solver: str                       # "auto", "fast" or "ilp"
    effort: Effort
    again_from_seeds: bool
    cuts: CutPlans = field(default_factory=CutPlans)
    relaxations: Relaxations = field(default_factory=Relaxations)
    ratio: float = 0.96               # the sweep's step between targets
    cut_series: tuple = ()            # distinct cut plans, cheapest first

    def solved(self, target: float, proxy: Problem | None = None,
               how: str | None = None) -> Candidate:
        """The plan strategy ``how`` (default: the search's) finds at proxy
        peak ``target`` on ``proxy`` (default: the refined one), evaluated;
        raises ilp.Infeasible where there is none."""
        how = how or ("ilp" if self.solver == "ilp" else "fast")
        started = time.perf_counter()
        saved, recomputed, offloaded, gap = STRATEGIES[how](
            proxy or self.proxy, target, self.cuts, self.relaxations)
        return self.candidate(to_decision(
            self.proxy, saved, recomputed, offloaded, solver=how,
            seconds=time.perf_counter() - started, gap=gap, budget_bytes=None))


def _ilp(problem, target, cuts, relaxations):
    return solve_ilp(problem, target)


def _fast(problem, target, cuts, relaxations):
    return (*solve_fast(problem, target, cuts, relaxations), None)


STRATEGIES = {"ilp": _ilp, "fast": _fast}


@dataclass(frozen=True)
class Added:
    """A stage's answer: its plans, and what it hands the stages after it
    (None: unchanged)."""

    plans: list[Candidate]
    proxy: Problem | None = None
    ratio: float | None = None
    cut_series: tuple | None = None


@dataclass(frozen=True)
class Found:
    """The plans a stage is shown, in the order they were made, and the
    plans shown to it that stages before ``name`` made (``before``)."""

    plans: list[Candidate]
    made_by: tuple[str, ...]          # the stage that made each plan

    def before(self, name: str) -> list[Candidate]:
        return [c for c, by in zip(self.plans, self.made_by) if by != name]


@dataclass(frozen=True)
class Stage:
    """A frontier stage: ``run(search, found) -> Added``. ``shown_to``: the
    later stages that see its plans (None: every one); plans shown to only
    some join the frontier after the last stage."""

    name: str
    run: Callable[[Search, Found], Added]
    shown_to: tuple[str, ...] | None = None


def run_stages(stages, search: Search, start: list[Candidate]) -> list[Candidate]:
    """The frontier of ``start`` and of every plan ``stages`` add, in order,
    lowest peak first."""
    made: list[tuple[str, Candidate]] = [("start", c) for c in start]
    shown_to = {stage.name: stage.shown_to for stage in stages}

    def shown(by: str, stage: str | None) -> bool:
        return by == "start" or shown_to[by] is None or (stage is not None
                                                         and stage in shown_to[by])
    for stage in stages:
        seen = [(by, c) for by, c in made if shown(by, stage.name)]
        added = stage.run(search, Found([c for _, c in seen], tuple(by for by, _ in seen)))
        for c in added.plans:
            if not isinstance(c, Candidate):
                raise TypeError(f"frontier stage {stage.name!r} added "
                                f"{type(c).__name__}, not a Candidate")
        made += [(stage.name, c) for c in added.plans]
        search = replace(search, **{k: v for k, v in (("proxy", added.proxy),
                                                       ("ratio", added.ratio),
                                                       ("cut_series", added.cut_series))
                                    if v is not None})
    return non_dominated([c for by, c in made if shown(by, None)]
                         + [c for by, c in made if not shown(by, None)])

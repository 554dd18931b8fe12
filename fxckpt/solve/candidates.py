"""Candidate plans as the frontier weighs them: a decision, what evaluating
it gave (the exact memory model's timeline), and its time cost; and the
small helpers every stage of the frontier shares (a plan's masks, its key,
the non-dominated subset of a list of candidates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from fxckpt.solve.problem import Problem
from fxckpt.types import Decision


class Timeline(Protocol):
    """What the frontier reads of an evaluated plan: its exact peak (and,
    where the evaluation knows it, ``held_at_backward``: see
    memory/schedule.py's ModelTimeline)."""

    peak_bytes: int
    peak_at: str


# evaluate(decision) -> (whatever the caller keeps of the plan, its Timeline)
Evaluate = Callable[[Decision], "tuple[Any, Timeline]"]


@dataclass(frozen=True)
class Candidate:
    decision: Decision
    rewritten: Any          # the first part of what evaluate returned
    timeline: Timeline
    cost: float

    @property
    def peak(self) -> int:
        return self.timeline.peak_bytes


def evaluated(problem: Problem, evaluate: Evaluate, decision: Decision) -> Candidate:
    """``decision`` evaluated, as a Candidate."""
    return Candidate(decision, *evaluate(decision), plan_cost(problem, decision))


def plan_key(decision: Decision) -> tuple:
    """What tells two plans apart."""
    return decision.saved, decision.recomputed, decision.offloaded, decision.copy_steps


def non_dominated(found: list[Candidate]) -> list[Candidate]:
    """The candidates no other beats on both exact peak and cost, lowest
    peak first."""
    frontier: list[Candidate] = []
    for c in sorted(found, key=lambda c: (c.peak, c.cost)):
        if not frontier or c.cost < frontier[-1].cost:
            frontier.append(c)
    return frontier


def plan_cost(problem: Problem, decision: Decision) -> float:
    """Seconds the plan adds: recompute and offload transfers."""
    return problem.plan_cost(mask(problem, decision.recomputed),
                             mask(problem, decision.offloaded),
                             copies=_copies(problem, decision))


def _copies(problem: Problem, decision: Decision) -> np.ndarray:
    """How many times backward computes each value (1 where it does not)."""
    steps = dict(decision.copy_steps)
    return np.array([1 + len(steps.get(name, ())) for name in problem.names])


def mask(problem: Problem, names) -> np.ndarray:
    """The values of ``problem`` named in ``names``, as a mask."""
    return np.array([name in names for name in problem.names], dtype=bool)


def masks(problem: Problem, decision: Decision) -> tuple[np.ndarray, ...]:
    """(saved, recomputed, offloaded) masks of a decision."""
    return tuple(mask(problem, names)
                 for names in (decision.saved, decision.recomputed, decision.offloaded))

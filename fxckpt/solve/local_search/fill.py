"""Plans filled: a plan with recomputed values saved back (fast.fill: most
time saved per byte first) up to a proxy peak, where the frontier's own
plans leave a budget paying too much recompute.

* ``top_filled``: the runtime-optimal plan filled at its own peak, the top
  of the frontier;
* ``steps_filled``: inside the frontier's steep steps, the dearer plan of
  each filled halfway up;
* ``step_fills``: inside the step a budget falls in, the plan below filled
  to fixed fractions of the way up (fixed, not aimed at the budget, so a
  larger budget never costs more).

Fills are aimed with the frontier's proxy and, on graphs up to a size,
with the proxy as seen from the plan they start from too (``views``:
refined by what it recomputes, measured where it peaks). Plans
recomputing again are not filled: their copies are not masks the proxy
weighs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fxckpt.solve.candidates import (Candidate, Evaluate, evaluated, mask, masks,
                                     non_dominated, plan_key)
from fxckpt.solve.fast import fill
from fxckpt.solve.effort import Effort
from fxckpt.solve.problem import Problem, to_decision
from fxckpt.types import Decision

# candidate(decision) -> Candidate: the frontier's evaluation, each distinct
# plan evaluated once.
Evaluated = Callable[[Decision], Candidate]


def top_filled(problem: Problem, candidate: Evaluated, optimal: Candidate,
               effort: Effort) -> list[Candidate]:
    """The runtime-optimal plan filled at its own proxy peak (in each of
    ``views``). That plan recomputes what is cheap to recompute, not what
    costs least at its peak, so a plan peaking lower can recompute less,
    and the sweep, aiming below it, misses such plans; filled, the
    runtime-optimal plan gives the top of the frontier to either solver
    (tests/test_frontier_top.py)."""
    filled = []
    for seen in views(problem, effort, optimal):
        start = masks(seen, optimal.decision)
        filled.append(candidate(_filled(seen, seen.peak(*start), start)))
    return filled


def steps_filled(problem: Problem, candidate: Evaluated, found: list[Candidate],
                 effort: Effort) -> list[Candidate]:
    """Plans inside the frontier's steep steps, one each: the dearer plan of
    the step filled up to the proxy's peak halfway between the two. The
    sweep's targets are a few percent apart in peak, and the plans they
    find can drop a fifth in recompute from one to the next: a budget
    between pays the dearer. A fill costs a fraction of a solve; the steps
    chosen are those a budget loses most on, the widest in peak times the
    steepest in cost (log ratios), at most ``effort.steps_filled``."""
    steps = [(_single(found, lower, upper), upper)
             for lower, upper in steep_steps(found, effort.step_ratio)]
    steps = [(lower, upper) for lower, upper in steps if lower is not None]
    added: list[Candidate] = []
    for lower, upper in steps[:effort.steps_filled]:
        for seen, start, low, high in _spans(problem, effort, lower, upper, lower):
            added.append(candidate(_filled(seen, (low + high) / 2, start)))
    return added


def _single(found: list[Candidate], lower: Candidate, upper: Candidate) -> Candidate | None:
    """The plan a fill into the step from ``lower`` to ``upper`` starts
    from: ``lower``, or where it recomputes again (its copies are not masks
    a fill weighs), the cheapest plan of ``found`` recomputing once that
    peaks below ``upper`` (None if none does). Without it a step above a
    plan recomputing again goes unfilled, and a budget inside it pays the
    dearer plan's recompute (tests/test_frontier_steps.py)."""
    if not lower.decision.copy_steps:
        return lower
    single = [c for c in found if not c.decision.copy_steps and c.peak < upper.peak
              and c.cost > upper.cost]
    return min(single, key=lambda c: (c.cost, c.peak)) if single else None


def steep_steps(found: list[Candidate], ratio: float) -> list[tuple[Candidate, Candidate]]:
    """(lower, upper) neighbours on the frontier of ``found`` where the
    lower plan costs more than ``ratio`` times the upper one, those
    a budget between loses most on first: the widest in peak times the
    steepest in cost (log ratios)."""
    frontier = non_dominated(found)
    steps = []
    for lower, upper in zip(frontier, frontier[1:]):
        if lower.cost > upper.cost * ratio:
            loss = np.log(upper.peak / max(lower.peak, 1)) * \
                np.log((lower.cost + 1e-12) / (upper.cost + 1e-12))
            steps.append((-loss, len(steps), lower, upper))
    return [(lower, upper) for _, _, lower, upper in sorted(steps)]


def step_fills(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate, below: Candidate | None, effort: Effort) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take besides
    ``lower``: ``lower`` filled to the proxy's peaks at ``_aim_levels`` of
    the way to ``upper``'s, in each of ``views``, each evaluated; and
    ``below`` (the frontier plan under ``lower``) filled to the same peaks,
    where ``effort.fill_from_below``. Kept are those peaking strictly
    between the two and costing strictly between them, not beaten by
    another: lowest peak first, each cheaper than the one preceding it. Together
    with the frontier they are again a frontier, and a budget takes its
    last plan that fits, so a larger budget still never costs more nor
    peaks lower; and a budget equal to a frontier plan's peak still gets
    that plan."""
    if lower.decision.copy_steps:
        return []
    made: dict[tuple, Candidate | None] = {plan_key(lower.decision): None,
                                           plan_key(upper.decision): None}
    starts = [lower]
    if below is not None and not below.decision.copy_steps and effort.fill_from_below:
        starts.append(below)
    for first in starts:
        for seen, start, low, high in _spans(problem, effort, lower, upper, first):
            for level in _aim_levels(effort.aim_levels):
                decision = _filled(seen, low + (high - low) * level, start)
                if plan_key(decision) not in made:
                    made[plan_key(decision)] = evaluated(problem, evaluate, decision)
    inside = [c for c in made.values() if c is not None and lower.peak < c.peak < upper.peak
              and upper.cost < c.cost < lower.cost]
    return non_dominated(inside)


def views(problem: Problem, effort: Effort, plan: Candidate,
          *others: Candidate) -> list[Problem]:
    """The proxies a fill starting from ``plan`` is aimed with: the
    frontier's, and where ``effort.seen_views`` the proxy as seen from the
    plan too (``as_seen_from``). The two lead the greedy fill
    to different plans, and each finds some the other misses: on tiny HF
    GPT-2 the two together cost 0.977x what the frontier's proxy alone does
    (geometric mean over budgets; `fxckpt bench --suite solvers`)."""
    if not effort.seen_views:
        return [problem]
    return [as_seen_from(problem, plan, *others), problem]


def as_seen_from(problem: Problem, plan: Candidate, *others: Candidate) -> Problem:
    """The proxy as a fill starting from ``plan`` reads it: refined by the
    values ``plan`` recomputes, and measured where ``plan`` and ``others``
    peak in the exact model. A fill saves recomputed values back; one that
    backward reads only to recompute another is held up to that recompute,
    which the proxy counts only where chains run through the reader
    (Problem.refined). Unrefined, and without a stage where the plans peak,
    the proxy can read a plan and one saving such values back as peaking
    alike where the exact model tells them apart; refined and measured
    there, it reads both near their exact peaks (tests/test_frontier_top.py)."""
    return problem.refined(mask(problem, plan.decision.recomputed)).with_stages(
        [c.timeline.peak_at for c in (plan, *others)])


def _spans(problem: Problem, effort: Effort, lower: Candidate, upper: Candidate,
           first: Candidate):
    """(view, ``first``'s masks in it, ``lower``'s proxy peak, ``upper``'s)
    for each of ``views`` from ``first`` where ``upper`` peaks higher than
    ``lower``: the room a fill of ``first`` (``lower`` or a plan below it)
    into the step from ``lower`` to ``upper`` has."""
    for seen in views(problem, effort, first, upper):
        start = masks(seen, first.decision)
        low = seen.peak(*masks(seen, lower.decision))
        high = seen.peak(*masks(seen, upper.decision))
        if high > low:
            yield seen, start, low, high


def _filled(problem: Problem, target: float, start: tuple[np.ndarray, ...]) -> Decision:
    """The plan of masks ``start`` filled (fast.fill) up to proxy peak ``target``."""
    saved, recomputed, offloaded = fill(problem, target, *start)
    return to_decision(problem, saved, recomputed, offloaded, solver="fill", seconds=0.0,
                       gap=None, budget_bytes=None)


def _aim_levels(count: int) -> list[float]:
    """Fractions of a step's way up that ``step_fills`` fills to: ``count``
    of them, evenly spaced."""
    return [(k + 1) / (count + 1) for k in range(count)]

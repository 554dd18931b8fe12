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
from fxckpt.solve.problem import Problem, to_decision
from fxckpt.types import Decision

# Steps of the frontier filled (``steps_filled``): where a plan costs more
# than _STEP_RATIO times the next one up, a budget between the two pays the
# dearer plan's recompute. At most _STEP_FILLS steps, fewer on large graphs
# as each filled plan is simulated (12 up to 533 forward values, 8 at 800,
# one from 3,200, none beyond 6,400).
_STEP_RATIO = 1.05
_STEP_FILLS = 12
_STEP_WORK = 6_400
# A budget inside a step of the frontier, between the plan that fits and
# the cheaper one above that does not, is offered the plan below filled to
# these fractions of the way up (in the proxy's peak; ``step_fills``). The
# levels are fixed, not aimed at the budget, so a larger budget never costs
# more. On the compile suite's 8-layer GPT, over 41 budgets from the floor
# to the runtime-optimal peak, the plans cost 0.97x those of the frontier
# alone (geometric mean; at best 0.83x), with the ILP and the fast solver
# alike; 4 or 6 levels did no better than these 3. Each level is a fill
# and a simulation in proportion to the graph: fewer on large graphs (3 up
# to 2,133 forward values, 1 from 3,200 to 6,400, where on the 58-layer GPT
# (5,599 values) one level took 0.12 s, three 0.35 s).
_AIM_LEVELS = 3
_AIM_WORK = 6_400
# Fills are aimed with the frontier's proxy, and up to this many forward
# values with the proxy seen from the plan they start from too (``views``):
# each fill is a simulation, and on the 58-layer GPT one took 0.12 s.
_SEEN_VIEW_VALUES = 3_200
# A budget's step is filled from the frontier plan under its lower plan too
# (``step_fills``), up to this many forward values: a budget on the
# compile suite's 8-layer GPT (739 values) planned in 1.13 s with
# those fills and the swaps (solve/swaps.py), 1.01 s without, its compile
# 1.19x torch.compile's, within the 1.2x the compile suite allows
# (`fxckpt bench --suite compile`).
_BELOW_VALUES = 600

# candidate(decision) -> Candidate: the frontier's evaluation, each distinct
# plan evaluated once.
Evaluated = Callable[[Decision], Candidate]


def top_filled(problem: Problem, candidate: Evaluated, optimal: Candidate) -> list[Candidate]:
    """The runtime-optimal plan filled at its own proxy peak (in each of
    ``views``). That plan recomputes what is cheap to recompute, not what
    costs least at its peak: on tiny HF GPT-2 it peaks at 265,736 B
    recomputing 1.31 us where a plan at 256,648 B recomputes 0.92 us. The
    sweep aims below it and only the exact programme found such plans;
    filled, the runtime-optimal plan gives the top of the frontier to
    either solver."""
    filled = []
    for seen in views(problem, optimal):
        start = masks(seen, optimal.decision)
        filled.append(candidate(_filled(seen, seen.peak(*start), start)))
    return filled


def steps_filled(problem: Problem, candidate: Evaluated,
                 found: list[Candidate]) -> list[Candidate]:
    """Plans inside the frontier's steep steps, one each: the dearer plan of
    the step filled up to the proxy's peak halfway between the two. The
    sweep's targets are a few percent apart in peak, and the plans they
    find can drop a fifth in recompute from one to the next: a budget
    between pays the dearer. A fill costs a fraction of a solve; the steps
    chosen are those a budget loses most on, the widest in peak times the
    steepest in cost (log ratios), at most ``_STEP_FILLS`` (fewer on large
    graphs)."""
    steps = [(_single(found, lower, upper), upper) for lower, upper in steep_steps(found)]
    steps = [(lower, upper) for lower, upper in steps if lower is not None]
    count = min(_STEP_FILLS, _STEP_WORK // max(problem.n, 1))
    added: list[Candidate] = []
    for lower, upper in steps[:count]:
        for seen, start, low, high in _spans(problem, lower, upper, lower):
            added.append(candidate(_filled(seen, (low + high) / 2, start)))
    return added


def _single(found: list[Candidate], lower: Candidate, upper: Candidate) -> Candidate | None:
    """The plan a fill into the step from ``lower`` to ``upper`` starts
    from: ``lower``, or where it recomputes again (its copies are not masks
    a fill weighs), the cheapest plan of ``found`` recomputing once that
    peaks below ``upper`` (None if none does). On tiny HF GPT-NeoX (hidden
    32) a plan recomputing again at 106,120 B and 3.227 us came to lie
    under the cut plan at 109,960 B and 3.718 us, and the step above it, to
    111,752 B at 0.934 us, went unfilled: a budget at 111,060 B paid 3.227
    us where filled from the cut plan it pays 1.062 us."""
    if not lower.decision.again:
        return lower
    single = [c for c in found if not c.decision.again and c.peak < upper.peak
              and c.cost > upper.cost]
    return min(single, key=lambda c: (c.cost, c.peak)) if single else None


def steep_steps(found: list[Candidate]) -> list[tuple[Candidate, Candidate]]:
    """(lower, upper) neighbours on the frontier of ``found`` where the
    lower plan costs more than ``_STEP_RATIO`` times the upper one, those
    a budget between loses most on first: the widest in peak times the
    steepest in cost (log ratios)."""
    frontier = non_dominated(found)
    steps = []
    for lower, upper in zip(frontier, frontier[1:]):
        if lower.cost > upper.cost * _STEP_RATIO:
            loss = np.log(upper.peak / max(lower.peak, 1)) * \
                np.log((lower.cost + 1e-12) / (upper.cost + 1e-12))
            steps.append((-loss, len(steps), lower, upper))
    return [(lower, upper) for _, _, lower, upper in sorted(steps)]


def step_fills(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate, below: Candidate | None = None) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take besides
    ``lower``: ``lower`` filled to the proxy's peaks at ``_aim_levels`` of
    the way to ``upper``'s, in each of ``views``, each evaluated; and
    ``below`` (the frontier plan under ``lower``) filled to the same peaks,
    up to ``_BELOW_VALUES`` forward values. Kept are those peaking strictly
    between the two and costing strictly between them, not beaten by
    another: lowest peak first, each cheaper than the one before. Together
    with the frontier they are again a frontier, and a budget takes its
    last plan that fits, so a larger budget still never costs more nor
    peaks lower; and a budget equal to a frontier plan's peak still gets
    that plan."""
    if lower.decision.again:
        return []
    made: dict[tuple, Candidate | None] = {plan_key(lower.decision): None,
                                           plan_key(upper.decision): None}
    starts = [lower]
    if below is not None and not below.decision.again and problem.n <= _BELOW_VALUES:
        starts.append(below)
    for first in starts:
        for seen, start, low, high in _spans(problem, lower, upper, first):
            for level in _aim_levels(seen):
                decision = _filled(seen, low + (high - low) * level, start)
                if plan_key(decision) not in made:
                    made[plan_key(decision)] = evaluated(problem, evaluate, decision)
    inside = [c for c in made.values() if c is not None and lower.peak < c.peak < upper.peak
              and upper.cost < c.cost < lower.cost]
    return non_dominated(inside)


def views(problem: Problem, plan: Candidate, *others: Candidate) -> list[Problem]:
    """The proxies a fill starting from ``plan`` is aimed with: the
    frontier's, and up to ``_SEEN_VIEW_VALUES`` forward values the proxy as
    seen from the plan too (``as_seen_from``). The two lead the greedy fill
    to different plans, and each finds some the other misses: over 41
    budgets on tiny HF GPT-2 the plans cost 0.977x those of the frontier's
    proxy alone (geometric mean, at best 0.56x), where the view from the
    plan alone cost 1.014x (one budget 1.95x: an optimistic fill that
    happened to fit), and on the compile suite's 8-layer GPT 0.998x against
    1.022x (one budget 2.5x)."""
    if problem.n > _SEEN_VIEW_VALUES:
        return [problem]
    return [as_seen_from(problem, plan, *others), problem]


def as_seen_from(problem: Problem, plan: Candidate, *others: Candidate) -> Problem:
    """The proxy as a fill starting from ``plan`` reads it: refined by the
    values ``plan`` recomputes, and measured where ``plan`` and ``others``
    peak in the exact model. A fill saves recomputed values back; one that
    backward reads only to recompute another is held until that recompute,
    which the proxy counts only where chains run through the reader
    (Problem.refined). Unrefined, and without a stage where the plans peak,
    the proxy read a plan on tiny HF GPT-2 and the plan saving two such
    values (16 KiB) alike at 203,396 B; the exact model read 206,088 and
    222,472 B. Refined and measured there, 206,084 and within 260 B of the
    exact peak along the fills to a plan 18 KiB up."""
    return problem.refined(mask(problem, plan.decision.recomputed)).with_stages(
        [c.timeline.peak_at for c in (plan, *others)])


def _spans(problem: Problem, lower: Candidate, upper: Candidate, first: Candidate):
    """(view, ``first``'s masks in it, ``lower``'s proxy peak, ``upper``'s)
    for each of ``views`` from ``first`` where ``upper`` peaks higher than
    ``lower``: the room a fill of ``first`` (``lower`` or a plan below it)
    into the step from ``lower`` to ``upper`` has."""
    for seen in views(problem, first, upper):
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


def _aim_levels(problem: Problem) -> list[float]:
    """Fractions of a step's way up that ``step_fills`` fills to, evenly
    spaced: ``_AIM_LEVELS`` of them, fewer on large graphs."""
    count = max(0, min(_AIM_LEVELS, _AIM_WORK // max(problem.n, 1)))
    return [(k + 1) / (count + 1) for k in range(count)]

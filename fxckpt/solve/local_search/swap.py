"""Plans swapped: inside the step of the frontier a budget falls in, the
step's cheaper plan with a saved value recomputed and a recomputed value
saved back, lower for about what it costs.

The descents (descend.py) walk a step's cheaper plan down by
recomputing, each move adding cost; the fills (fill.py) climb from
below by saving back. Neither exchanges: recomputing a value live where
the plan peaks while saving back one of the same cost that is not live
there lowers the plan for nothing. Recomputing a layer norm whose
statistics are live at the peak in place of one whose are not is such an
exchange; on the compile suite's GPT a swap saves a budget just under the
plan it starts from 4 to 5% (tests/test_swaps.py). A swap that comes out
cheaper than that plan is left out: a budget above that plan would pay
more than one below it.

A swap is one lowering move (fast.lowering_moves, or every saved output
of a costly op that cannot be saved itself, such as a layer norm's output
and statistics) then one fill move (fast.saving_moves), priced on the
proxy as seen from the plan (fill.as_seen_from). Kept are those it reads
below the plan, by no more than the step is wide, for at most ``Effort.swap_near``
of the step's cost difference more. Each is read again, ahead of its exact
evaluation, following the recompute chains it runs itself
(Problem.refined): the proxy as seen from the plan alone can read a swap
below the plan that the exact model puts above it. Evaluated cheapest
first, a round stops at the first plan neither neighbour beats; a second
round swaps the lowest plan the first made inside the step.

Swaps are step plans (local_search.step_plans), not frontier stages: a budget
swaps only its own step, at most ``Effort.swap_rounds`` x ``swap_evaluations`` evaluations, and
the frontier, its floor included, is what it is without them, so planning
pays for swaps only in the step a budget needs. With them (and the plan
below filled into the step, fill.step_fills) the fast solver stays within
5% of the exact programme at every budget from the floor to the
runtime-optimal peak on the compile suite's 4-layer GPT, tiny HF GPT-2 and
tiny HF Llama (`fxckpt bench --suite solvers`). No plan made
overrides more user preferences than the step's dearer plan does.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from fxckpt.solve.candidates import Candidate, Evaluate, evaluated, masks, non_dominated
from fxckpt.solve.effort import Effort
from fxckpt.solve.fast import lowering_moves, objective_of, runnable, saving_moves
from fxckpt.solve.local_search.fill import Evaluated, as_seen_from
from fxckpt.solve.problem import Problem, to_decision

def step_swaps(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate, effort: Effort) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take from
    swapping ``upper`` (``_swapped``), besides the fills and descents: those
    peaking strictly between the two, costing less than ``lower`` and no
    less than the plan they are swapped from (a swap can cost what
    ``upper`` does, lower), not beaten by another."""
    if upper.decision.copy_steps or not effort.swaps:
        return []
    candidate = partial(evaluated, problem, evaluate)
    made: list[Candidate] = []
    start = upper
    for _ in range(effort.swap_rounds):
        inside = [c for c in _swapped(problem, candidate, lower, start, effort)
                  if lower.peak < c.peak < start.peak and start.cost <= c.cost < lower.cost]
        if not inside:
            break
        made += inside
        # The next round swaps the lowest of them again.
        start = min(inside, key=lambda c: (c.peak, c.cost))
    return non_dominated(made)


def _swapped(problem: Problem, candidate: Evaluated, lower: Candidate,
             upper: Candidate, effort: Effort) -> list[Candidate]:
    """``upper`` swapped (``swaps``): those the proxy as seen from it reads
    below it (by no more than the step is wide) for at most ``effort.swap_near`` of
    the step's cost difference more, overriding no more user preferences
    than ``lower``, cheapest first (then lowest); of the first ``effort.swap_checks``,
    those the proxy refined by the swap's own recompute still reads so are
    evaluated, stopping at the first plan neither neighbour beats or once
    ``effort.swap_evaluations`` are spent."""
    if effort.swap_evaluations <= 0:
        return []
    allowed = len(problem.overrides(*masks(problem, lower.decision)))
    seen = as_seen_from(problem, upper)
    plan = masks(seen, upper.decision)
    price = objective_of(seen)
    peak, cost = seen.peak(*plan), price(*plan)
    ceiling = cost + effort.swap_near * (price(*masks(seen, lower.decision)) - cost)
    # The proxy is trusted to lower the plan by as much as the step is wide.
    floor = peak - (upper.peak - lower.peak)
    kept: dict[tuple, tuple] = {}
    for trial in swaps(seen, plan, effort.swap_width):
        trial_peak, trial_cost = seen.peak(*trial), price(*trial)
        if floor <= trial_peak < peak and trial_cost < ceiling \
                and len(seen.overrides(*trial)) <= allowed:
            kept.setdefault((trial_cost, trial_peak), trial)
    made: list[Candidate] = []
    for key in sorted(kept)[:effort.swap_checks]:
        trial = kept[key]
        # Read again following the recompute chains the swap itself runs
        # (Problem.refined): that can change the swap's peak read above.
        if not floor <= seen.refined(trial[1]).peak(*trial) < peak:
            continue
        made.append(candidate(to_decision(problem, *trial, solver="swap", seconds=0.0,
                                          gap=None, budget_bytes=None)))
        if len(made) >= effort.swap_evaluations or _gains(made[-1], lower, upper):
            break
    return made


def _gains(made: Candidate, lower: Candidate, upper: Candidate) -> bool:
    """Whether neither ``lower`` nor ``upper`` beats ``made`` on both peak
    and cost."""
    return not any(c.peak <= made.peak and c.cost <= made.cost for c in (lower, upper))


def swaps(problem: Problem, plan, width: int) -> list[tuple]:
    """The plans (saved, recomputed, offloaded) one lowering move then one
    fill move from ``plan``: a saved value live at the proxy's peak
    recomputed (fast.lowering_moves, the ``width`` freeing most bytes per
    recompute cost) or every saved output of an op that cannot be saved
    (``_groups_recomputed``), then a recomputed value saved back or the
    like (fast.saving_moves). Distinct, ``plan`` itself left out."""
    made: dict[tuple, tuple] = {_key(plan): plan}
    peak = problem.peak(*plan)
    for lowered in [*lowering_moves(problem, plan, width), *_groups_recomputed(problem, plan)]:
        if problem.peak(*lowered) >= peak:
            continue
        for trial in saving_moves(problem, lowered):
            made.setdefault(_key(trial), trial)
    return list(made.values())[1:]


def _groups_recomputed(problem: Problem, plan):
    """``plan`` with every saved output of a costly op that cannot be saved
    (a tuple: native_layer_norm's output, mean and rstd) recomputed, one op
    at a time: recomputing one output alone recomputes the op and still
    holds the others."""
    saved, recomputed, offloaded = plan
    indptr, indices = problem.reader_lists
    for j in np.flatnonzero(~problem.can_save & problem.can_recompute & ~recomputed
                            & (problem.cost > 0)):
        readers = indices[indptr[j]:indptr[j + 1]]
        readers = readers[saved[readers]]
        if not len(readers) or not problem.can_recompute[readers].all():
            continue
        trial = saved.copy()
        trial[readers] = False
        closed = runnable(problem, trial)
        if closed is not None:
            yield (*closed, (offloaded | problem.must_offload) & closed[0])


def _key(plan) -> tuple:
    return tuple(np.asarray(m, dtype=bool).tobytes() for m in plan)

"""Plans swapped: inside the step of the frontier a budget falls in, the
step's cheaper plan with a saved value recomputed and a recomputed value
saved back, lower for about what it costs.

The descents (solve/descents.py) walk a step's cheaper plan down by
recomputing, each move adding cost; the fills (solve/fills.py) climb from
below by saving back. Neither exchanges: recomputing a value live where
the plan peaks while saving back one of the same cost that is not live
there lowers the plan for nothing. On the compile suite's 4-layer GPT the
fast frontier's plan at 1,150,216 B, 5.284 us, recomputed three layer
norms whose statistics (256 B each) are live at its peak, where the exact
programme recomputed three others for the same cost, 512 B lower: a
budget 39 B under the plan paid the next plan down, 5.622 us (+6.4%).
Swapping one layer norm for another gives the exact programme's plan,
1,149,704 B at 5.284 us. Under the plan at 1,006,864 B, 10.327 us, the
next plan down cost 13.709 us, and a budget 533 B under it paid 13.338 us
(a fill; the exact programme 12.107 us); a swap gives 1,006,096 B at
10.355 us.

A swap is one lowering move (fast.lowering_moves, or every saved output
of a costly op that cannot be saved itself, such as a layer norm's output
and statistics) then one fill move (fast.saving_moves), priced on the
proxy as seen from the plan (fills.as_seen_from). Kept are those it reads
below the plan, by no more than the step is wide, for at most ``_NEAR``
of the step's cost difference more. Before one is evaluated exactly the
proxy reads it again following the recompute chains it runs itself
(Problem.refined): measured where the plan peaks, the proxy read swaps
on tiny HF GPT-2 2,432 B below the plan, the exact model 1,408 B above
it, and refined 1,664 B above (on the 4-layer GPT, refined readings
matched the exact model's change at 16 of 17 swaps). Evaluated cheapest
first, a round stops at the first plan neither neighbour beats; a second
round swaps the lowest plan the first made inside the step.

Swaps are step plans (frontier.step_plans), not frontier stages: a budget
swaps only its own step, at most ``_ROUNDS`` x ``_EVALS`` evaluations, and
the frontier, its floor included, is what it is without them. A first
version swapped every steep step of the frontier (up to 8 evaluations,
0.14-0.50 s on graphs of 300-800 values). As step plans, fast vs exact
programme over 21 budgets from the floor to the runtime-optimal peak
(both with swaps): the compile suite's 4-layer GPT 21 of 21 within 5% (19
without swaps), tiny HF GPT-2 21, tiny HF Llama 21 (with the plan below
filled into the step too, fills.step_fills). No plan made overrides more
user preferences than the step's dearer plan does.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from fxckpt.solve.candidates import Candidate, Evaluate, evaluated, masks, non_dominated
from fxckpt.solve.fast import lowering_moves, objective_of, runnable, saving_moves
from fxckpt.solve.fills import Evaluated, as_seen_from
from fxckpt.solve.problem import Problem, to_decision

# A swap is weighed on the proxy over the graph, moves times values: none
# beyond _MAX_VALUES forward values (the compile suite's 4-layer GPT
# swaps; its 8-layer one, where compile time has no margin, does not: see
# fills._BELOW_VALUES).
# Evaluations are the cost: at most _EVALS a round, _ROUNDS rounds, of at
# most _CHECKS swaps read again refined. Each step weighs the _WIDTH saved
# values live at the peak that free most bytes per recompute cost (8 found
# the same plans as 16 on the 4-layer GPT, tiny HF GPT-2 and Llama and the
# 8-layer GPT, the proxy's part 0.22 s against 0.35 s on the 4-layer GPT
# when every steep step was swapped).
_MAX_VALUES = 600
_EVALS = 3
_ROUNDS = 2
_WIDTH = 8
_CHECKS = 16
# A swap may cost up to this fraction of the step's cost difference more
# than the plan it starts from.
_NEAR = 0.1


def step_swaps(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take from
    swapping ``upper`` (``_swapped``), besides the fills and descents: those
    peaking strictly between the two, costing less than ``lower`` and no
    less than the plan they were swapped from (a swap can cost what
    ``upper`` does, lower), not beaten by another."""
    if upper.decision.again or problem.n > _MAX_VALUES:
        return []
    candidate = partial(evaluated, problem, evaluate)
    made: list[Candidate] = []
    start = upper
    for _ in range(_ROUNDS):
        inside = [c for c in _swapped(problem, candidate, lower, start, _EVALS)
                  if lower.peak < c.peak < start.peak and start.cost <= c.cost < lower.cost]
        if not inside:
            break
        made += inside
        # The next round swaps the lowest of them again.
        start = min(inside, key=lambda c: (c.peak, c.cost))
    return non_dominated(made)


def _swapped(problem: Problem, candidate: Evaluated, lower: Candidate,
             upper: Candidate, evaluations: int) -> list[Candidate]:
    """``upper`` swapped (``swaps``): those the proxy as seen from it reads
    below it (by no more than the step is wide) for at most ``_NEAR`` of
    the step's cost difference more, overriding no more user preferences
    than ``lower``, cheapest first (then lowest); of the first ``_CHECKS``,
    those the proxy refined by the swap's own recompute still reads so are
    evaluated, until one is a plan neither neighbour beats or
    ``evaluations`` are spent."""
    if evaluations <= 0:
        return []
    allowed = len(problem.overrides(*masks(problem, lower.decision)))
    seen = as_seen_from(problem, upper)
    plan = masks(seen, upper.decision)
    price = objective_of(seen)
    peak, cost = seen.peak(*plan), price(*plan)
    ceiling = cost + _NEAR * (price(*masks(seen, lower.decision)) - cost)
    # The proxy is trusted to lower the plan by as much as the step is wide.
    floor = peak - (upper.peak - lower.peak)
    kept: dict[tuple, tuple] = {}
    for trial in swaps(seen, plan):
        trial_peak, trial_cost = seen.peak(*trial), price(*trial)
        if floor <= trial_peak < peak and trial_cost < ceiling \
                and len(seen.overrides(*trial)) <= allowed:
            kept.setdefault((trial_cost, trial_peak), trial)
    made: list[Candidate] = []
    for key in sorted(kept)[:_CHECKS]:
        trial = kept[key]
        # Read again following the recompute chains the swap itself runs
        # (Problem.refined): where the swap's peak read above moved.
        if not floor <= seen.refined(trial[1]).peak(*trial) < peak:
            continue
        made.append(candidate(to_decision(problem, *trial, solver="swap", seconds=0.0,
                                          gap=None, budget_bytes=None)))
        if len(made) >= evaluations or _gains(made[-1], lower, upper):
            break
    return made


def _gains(made: Candidate, lower: Candidate, upper: Candidate) -> bool:
    """Whether neither ``lower`` nor ``upper`` beats ``made`` on both peak
    and cost."""
    return not any(c.peak <= made.peak and c.cost <= made.cost for c in (lower, upper))


def swaps(problem: Problem, plan) -> list[tuple]:
    """The plans (saved, recomputed, offloaded) one lowering move then one
    fill move from ``plan``: a saved value live at the proxy's peak
    recomputed (fast.lowering_moves, the ``_WIDTH`` freeing most bytes per
    recompute cost) or every saved output of an op that cannot be saved
    (``_groups_recomputed``), then a recomputed value saved back or the
    like (fast.saving_moves). Distinct, ``plan`` itself left out."""
    made: dict[tuple, tuple] = {_key(plan): plan}
    peak = problem.peak(*plan)
    for lowered in [*lowering_moves(problem, plan, _WIDTH), *_groups_recomputed(problem, plan)]:
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

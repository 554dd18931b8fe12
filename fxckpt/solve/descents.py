"""Plans walked down: the cheaper plan of a steep step of the frontier
lowered one recomputed value at a time, towards the dearer plan's peak.

The fills (solve/fills.py) climb a step from below: the dearer plan with
recomputed values saved back. A descent goes the other way. A plan found
at a sweep target can peak a few percent above what the proxy read for
it, where the proxy has no stage at the point it peaks. The plan below it
on the frontier can then cost several times more, and a budget between
the two pays that. Measured where it peaks (fills.as_seen_from), the proxy
reads the cheaper plan close to its exact peak. There, recomputing the
saved values live at that peak lowers the plan for little cost, one move
at a time (fast.lowered), each move's plan evaluated exactly.

On the compile suite's 4-layer GPT with the fast solver, the plan at
993,800 B cost 15.6 us, and the one below it at 979,592 B cost 119.9 us
(a per-part plan recomputing again). One move gave 977,160 B at 16.6 us.
The exact programme had found 973,320 B at 15.5 us there. On tiny HF GPT-2
two moves from 201,992 B at 3.60 us gave 197,768 B at 4.07 us, below a
step to 195,720 B at 8.68 us.

A descent starts only from a step's cheaper plan, and it stops at the
first plan below the dearer plan's peak, at one that costs as much as
the dearer plan, or before one that overrides more user preferences than
the dearer plan does. It runs after the other stages, so it only adds
plans to the frontier, never changes which plans the other stages start
from. The frontier's steps are walked down before the fills, and the
steps the fills make after them, so that a fill taking a step's place
never drops what walking that step down gave. A descended plan inside a
step does change the step a budget there falls in: the plan below is
filled towards it (fills.step_fills), not towards the old upper plan, and
that fill can cost more (tiny HF GPT-2, the ILP's frontier, one budget of
41: 4.86 -> 8.68 us).

At selection a budget's own step is walked down too (``step_descents``,
solver "step descent"): its upper plan lowered a move or two, the plans
inside the step kept beside the lower plan's fills. Over 41 budgets on
tiny HF Llama the budgets then paid 0.954x (fast frontier) and 0.959x
(ILP's) of what the fills alone left them, geometric mean, one budget
0.42x; on the compile suite's 4-layer GPT and tiny HF GPT-2 they paid
the same (0.999x at one budget of GPT-2's).
"""

from __future__ import annotations

from fxckpt.solve.candidates import (Candidate, Evaluate, evaluated, masks, non_dominated,
                                     plan_key)
from fxckpt.solve.fast import lowered
from fxckpt.solve.fills import Evaluated, as_seen_from, steep_steps
from fxckpt.solve.problem import Problem, to_decision

# Steps descended: the _STEPS that a budget loses most on
# (fills.steep_steps), fewer on large graphs as every move is evaluated
# exactly (6 up to 1,066 forward values, 1 above 3,200 up to 6,400,
# none beyond); each gets up to _MOVES moves, weighing the _WIDTH values that
# free most bytes per recompute cost. On the compile suite's 4-layer GPT
# (solver="auto") 6 steps took planning from 0.70 to 0.72 s and 12 steps
# to 0.93 s; over 41 budgets on it, tiny HF GPT-2 and tiny HF Llama, 12
# steps cost 0.2-1.4% less than 6 (geometric mean, fast and exact
# alike). Weighing 64 values rather than 16 took 0.05 s more for no
# cheaper plan.
_STEPS = 6
_WORK = 6_400
_MOVES = 4
_WIDTH = 16
# Moves walking a budget's step down at selection (step_descents): over 41
# budgets on tiny HF Llama, 2 moves gave what 4 did (cost 0.954x without,
# geometric mean, one budget 0.42x), 1 move 0.995x.
_STEP_MOVES = 2


def steps_descended(problem: Problem, candidate: Evaluated, found: list[Candidate],
                    skip: frozenset = frozenset()) -> list[Candidate]:
    """Every plan made walking down the frontier's steep steps: for each,
    the cheaper plan lowered (fast.lowered) in the proxy as seen from it,
    each move evaluated by ``candidate``. Steps are ranked as the fills
    rank them (fills.steep_steps); those in ``skip`` (``step_keys``) are
    not walked."""
    steps = [(lower, upper) for lower, upper in steep_steps(found)
             if not upper.decision.again and _key(lower, upper) not in skip]
    count = min(_STEPS, _WORK // max(problem.n, 1))
    made: list[Candidate] = []
    for lower, upper in steps[:count]:
        made += _descent(problem, candidate, lower, upper)
    return made


def step_keys(found: list[Candidate]) -> frozenset:
    """The steep steps of the frontier of ``found``, each as the plan keys
    of its two plans (for ``steps_descended``'s ``skip``)."""
    return frozenset(_key(lower, upper) for lower, upper in steep_steps(found))


def _key(lower: Candidate, upper: Candidate) -> tuple:
    return plan_key(lower.decision), plan_key(upper.decision)


def _descent(problem: Problem, candidate: Evaluated, lower: Candidate,
             upper: Candidate, moves: int = _MOVES, label: str = "descent"
             ) -> list[Candidate]:
    """The plans ``upper`` lowered to, one move each, until one peaks below
    ``lower`` or costs as much as it, or overrides more user preferences
    (tags PREFER_SAVE, PREFER_RECOMPUTE, *_CPU_OFFLOAD) than ``lower``."""
    # A budget inside the step gets ``lower`` without a descent: no plan
    # made overrides more user preferences than it does.
    allowed = len(problem.overrides(*masks(problem, lower.decision)))
    seen = as_seen_from(problem, upper)
    plan = masks(seen, upper.decision)
    if len(seen.overrides(*plan)) > allowed:
        return []
    made: list[Candidate] = []
    for _ in range(moves):
        plan = lowered(seen, plan, _WIDTH)
        if plan is None or len(seen.overrides(*plan)) > allowed:
            break
        made.append(candidate(to_decision(problem, *plan, solver=label, seconds=0.0,
                                          gap=None, budget_bytes=None)))
        if made[-1].peak < lower.peak or made[-1].cost >= lower.cost:
            break
    return made


def step_descents(problem: Problem, evaluate: Evaluate, lower: Candidate,
                  upper: Candidate) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take from
    walking ``upper`` down (``_descent``), besides the fills from ``lower``
    (fills.step_fills): those peaking strictly between the two and costing
    strictly between them, not beaten by another: a budget just under
    ``upper`` can pay about what ``upper`` costs instead of ``lower``'s
    price (one budget on tiny HF Llama paid 0.42x)."""
    if upper.decision.again:
        return []
    made = _descent(problem, lambda decision: evaluated(problem, evaluate, decision),
                    lower, upper, _STEP_MOVES, "step descent")
    return non_dominated([c for c in made if lower.peak < c.peak < upper.peak
                          and upper.cost < c.cost < lower.cost])

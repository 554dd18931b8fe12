"""Plans walked down: the cheaper plan of a steep step of the frontier
lowered one recomputed value at a time, towards the dearer plan's peak.

The fills (fill.py) climb a step from below: the dearer plan with
recomputed values saved back. A descent goes the other way. A plan found
at a sweep target can peak a few percent above what the proxy read for
it, where the proxy has no stage at the point it peaks. The plan below it
on the frontier can then cost several times more, and a budget between
the two pays that. Measured where it peaks (fill.as_seen_from), the proxy
reads the cheaper plan close to its exact peak. There, recomputing the
saved values live at that peak lowers the plan for little cost, one move
at a time (fast.lowered), each move's plan evaluated exactly.

On the compile suite's 4-layer GPT with the fast solver such a step
spans several times the recompute within a few percent of peak, and a
descended plan inside it leaves a budget there under half the recompute
(tests/test_descents.py).

A descent starts only from a step's cheaper plan, and it stops at the
first plan below the dearer plan's peak, at one that costs as much as
the dearer plan, or short of one that overrides more user preferences
than the dearer plan does. It runs after the other stages, so it only
adds plans to the frontier, never changes which plans the other stages
start from. The frontier's steps are walked down ahead of the fills, and
the steps the fills make after them, so that a fill taking a step's place
never drops what walking that step down gives. A descended plan inside a
step does change the step a budget there falls in: the plan below is
filled towards it (fill.step_fills), not towards the upper plan it
replaces, and that fill can cost a budget there more.

At selection a budget's own step is walked down too (``step_descents``,
solver "step descent"): its upper plan lowered a move or two, the plans
inside the step kept beside the lower plan's fills, so that a budget just
under the upper plan can pay about what it costs (tiny HF Llama: some
budget pays under half what the fills alone leave it; tests/test_descents.py).
"""

from __future__ import annotations

from fxckpt.solve.candidates import (Candidate, Evaluate, evaluated, masks, non_dominated,
                                     plan_key)
from fxckpt.solve.effort import Effort
from fxckpt.solve.fast import lowered
from fxckpt.solve.local_search.fill import Evaluated, as_seen_from, steep_steps
from fxckpt.solve.problem import Problem, to_decision

def steps_descended(problem: Problem, candidate: Evaluated, found: list[Candidate],
                    effort: Effort, skip: frozenset = frozenset()) -> list[Candidate]:
    """Every plan made walking down the frontier's steep steps: for each,
    the cheaper plan lowered (fast.lowered) in the proxy as seen from it,
    each move evaluated by ``candidate``. Steps are ranked as the fills
    rank them (fill.steep_steps); those in ``skip`` (``step_keys``) are
    not walked."""
    steps = [(lower, upper) for lower, upper in steep_steps(found, effort.step_ratio)
             if not upper.decision.copy_steps and _key(lower, upper) not in skip]
    made: list[Candidate] = []
    for lower, upper in steps[:effort.steps_descended]:
        made += _descent(problem, candidate, lower, upper, effort.descent_moves,
                         effort.descent_width)
    return made


def step_keys(found: list[Candidate], effort: Effort) -> frozenset:
    """The steep steps of the frontier of ``found``, each as the plan keys
    of its two plans (for ``steps_descended``'s ``skip``)."""
    return frozenset(_key(lower, upper) for lower, upper in steep_steps(found, effort.step_ratio))


def _key(lower: Candidate, upper: Candidate) -> tuple:
    return plan_key(lower.decision), plan_key(upper.decision)


def _descent(problem: Problem, candidate: Evaluated, lower: Candidate,
             upper: Candidate, moves: int, width: int, label: str = "descent"
             ) -> list[Candidate]:
    """The plans ``upper`` lowered to, one move each, ending at the first
    that peaks below ``lower`` or costs as much as it, and short of one that
    overrides more user preferences (tags PREFER_SAVE, PREFER_RECOMPUTE,
    *_CPU_OFFLOAD) than ``lower``."""
    # A budget inside the step gets ``lower`` without a descent: no plan
    # made overrides more user preferences than it does.
    allowed = len(problem.overrides(*masks(problem, lower.decision)))
    seen = as_seen_from(problem, upper)
    plan = masks(seen, upper.decision)
    if len(seen.overrides(*plan)) > allowed:
        return []
    made: list[Candidate] = []
    for _ in range(moves):
        plan = lowered(seen, plan, width)
        if plan is None or len(seen.overrides(*plan)) > allowed:
            break
        made.append(candidate(to_decision(problem, *plan, solver=label, seconds=0.0,
                                          gap=None, budget_bytes=None)))
        if made[-1].peak < lower.peak or made[-1].cost >= lower.cost:
            break
    return made


def step_descents(problem: Problem, evaluate: Evaluate, lower: Candidate,
                  upper: Candidate, effort: Effort) -> list[Candidate]:
    """The plans a budget inside the step from ``lower`` to ``upper``
    (neighbours on the frontier, ``upper`` the cheaper) can take from
    walking ``upper`` down (``_descent``), besides the fills from ``lower``
    (fill.step_fills): those peaking strictly between the two and costing
    strictly between them, not beaten by another: a budget just under
    ``upper`` can pay about what ``upper`` costs instead of ``lower``'s
    price (tests/test_descents.py)."""
    if upper.decision.copy_steps:
        return []
    made = _descent(problem, lambda decision: evaluated(problem, evaluate, decision),
                    lower, upper, effort.step_descent_moves, effort.descent_width,
                    "step descent")
    return non_dominated([c for c in made if lower.peak < c.peak < upper.peak
                          and upper.cost < c.cost < lower.cost])

"""Local search over plans as masks (saved, recomputed, offloaded): three
moves that each start from an evaluated plan and return new plans, every
one evaluated exactly.

* fill (fill.py): save recomputed values back, most time saved per byte
  first, up to a proxy peak: climbs a step of the frontier from below;
* descend (descend.py): recompute saved values live at the plan's peak,
  one at a time: walks a step's cheaper plan down;
* swap (swap.py): one of each, for about the same cost and a lower peak.

The frontier (solve/frontier) uses fill and descend as stages over its
steep steps; ``step_plans`` runs all three inside the one step a budget
falls in. How many moves each makes is ``Effort``'s (solve/effort.py).
"""

from __future__ import annotations

from fxckpt.solve.candidates import Candidate, Evaluate, non_dominated
from fxckpt.solve.effort import Effort, effort_for
from fxckpt.solve.local_search.descend import step_descents
from fxckpt.solve.local_search.fill import step_fills
from fxckpt.solve.local_search.swap import step_swaps
from fxckpt.solve.problem import Problem


def step_plans(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate, below: Candidate | None = None,
               effort: Effort | None = None) -> list[Candidate]:
    """What a budget inside the step from ``lower`` to ``upper`` (neighbours
    on the frontier; ``below``, the frontier plan under ``lower``, if any)
    can take besides ``lower``: ``lower`` and ``below`` filled towards
    ``upper``, ``upper`` walked down towards ``lower`` and swapped, those no
    other beats, lowest peak first, each cheaper than the one before.
    ``effort``: by default the graph's (``effort_for``)."""
    effort = effort or effort_for(problem.n)
    return non_dominated(step_fills(problem, evaluate, lower, upper, below, effort)
                         + step_descents(problem, evaluate, lower, upper, effort)
                         + step_swaps(problem, evaluate, lower, upper, effort))

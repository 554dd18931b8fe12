"""Planning under a budget, through the graph's trade-off frontier.

The frontier is built by stages run in a declared order (stages.py:
seeds, the sweep, fills, solves under the lowest peak and in the gaps,
minimum-cut plans and their walk, recomputing again, descents). Each
stage only adds plans, and every plan is checked against the exact memory
model (the proxy the strategies optimise can be off either way). The
plans no other plan beats on both exact peak and time cost (recompute,
plus transfers where values are offloaded) form the frontier. How hard
each stage searches is one setting by graph size (solve/effort.py).

A budget then takes what ``select(frontier, Fits(budget))`` gives
(solve/select.py): the cheapest frontier plan whose exact peak fits it,
or, where the budget falls inside a step of the frontier, the cheapest of
the step's own plans that fits (solve/local_search: the plan under it
filled towards the cheaper plan above, the plan above walked down and
swapped; a fixed few per step).

Because neither the frontier nor the plans filled inside its steps depend
on the budget:
* a larger budget never costs more recompute, and never yields a lower
  peak (along a frontier, cheaper means more memory);
* the floor named by BudgetError, the frontier's lowest peak, is always met
  when asked for.
"""

from fxckpt.solve.frontier.build import pareto_frontier, solve_budgeted
from fxckpt.solve.frontier.search import Added, Found, Search, Stage
from fxckpt.solve.frontier.stages import STAGES, without
from fxckpt.solve.local_search import step_plans

__all__ = ["Added", "Found", "STAGES", "Search", "Stage", "pareto_frontier", "solve_budgeted",
           "step_plans", "without"]

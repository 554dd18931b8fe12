"""Strategies that decide what to save. Every strategy sees a Problem
(numbers, not a graph: problem.py is the one adapter) and returns a Decision.

problem (the numeric problem and its peak proxy; proxy_stages, the moments
it measures), runtime_optimal (the min cut without a budget), frontier
(planning under a budget: declared stages building the trade-off
frontier), effort (how hard the frontier searches, by graph size),
local_search (fill, descend and swap moves over masks), select (choosing a
plan from a frontier for a request), ilp (exact), fast (LP rounding,
Lagrangian cuts), baselines (save-all, recompute-all, per-block, sqrt-n),
cut (max-flow), multi_recompute (values recomputed more than once, below
the single-recompute floor), highs (HiGHS on the programmes ilp and fast
write). A budget no plan meets raises ``select.NoPlanFits`` with the
numbers; the pipeline words the error.
"""

from __future__ import annotations

from fxckpt.solve.baselines import per_block, recompute_all, save_all, sqrt_segments
from fxckpt.solve.runtime_optimal import runtime_optimal

BASELINES = {
    "save_all": save_all,
    "recompute_all": recompute_all,
    "per_block": per_block,
    "sqrt_n": sqrt_segments,
    "mincut": runtime_optimal,
}

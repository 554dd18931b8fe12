"""Minimum s-t cut over a Problem: the engine of the runtime-optimal plan and
of the fast budgeted solver.

Each value i is an edge in_i -> out_i; cutting it means saving i, at
``save_weight[i]``. An edge source -> in_i is cut when i is computed in
backward, at ``recompute_weight[i]``; it is infinite where i cannot be
recomputed. out_i -> sink is infinite where backward reads i, and data edges
out_j -> in_i are infinite. A finite cut is a runnable plan, and the minimum
cut minimises sum(save_weight over saved) + sum(recompute_weight over values
backward computes).

scipy's max-flow is exact but wants int32 capacities: weights are scaled so
that all finite ones together stay far below the value standing for infinity
(integer weights that already do are kept as they are, so their ties stay
ties).

Where several cuts are minimal, ``side="source"`` gives the one with the
fewest nodes on the source side (the values backward computes are as many
as can be), ``side="sink"`` the one with the fewest on the sink side, as
networkx's minimum_cut (and so torch's partitioner) picks.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from fxckpt.solve.problem import Problem

_INF = 2**30
_FINITE_TOTAL = 2**28


class NoFiniteCut(ValueError):
    """No plan satisfies the constraints (some value can be neither saved nor
    recomputed)."""


# Problems whose edges between values were built (one frontier asks for
# many cuts of problems sharing their parents): parents -> (rows, cols, caps).
_EDGES: dict[int, tuple] = {}
_EDGES_KEPT = 8


def _data_edges(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The infinite edges every cut of ``problem`` shares: out_i -> sink where
    backward reads i, out_j -> in_i where i reads j."""
    key = id(problem.parents)
    hit = _EDGES.get(key)
    if hit is not None and hit[0] is problem.parents and hit[1] is problem.needed:
        return hit[2]
    n = problem.n
    ins, outs = np.arange(n) * 2, np.arange(n) * 2 + 1
    needed = np.flatnonzero(problem.needed)
    uniques = [np.unique(parents) for parents in problem.parents]
    counts = np.array([len(u) for u in uniques], dtype=np.int64)
    readers = np.repeat(np.arange(n), counts)
    read = np.concatenate(uniques).astype(np.int64) if uniques else np.zeros(0, np.int64)
    edges = (np.concatenate([outs[needed], outs[read]]),
             np.concatenate([np.full(len(needed), 2 * n + 1), ins[readers]]),
             np.full(len(needed) + len(read), _INF))
    if len(_EDGES) >= _EDGES_KEPT:
        _EDGES.pop(next(iter(_EDGES)))
    _EDGES[key] = (problem.parents, problem.needed, edges)
    return edges


def min_cut(problem: Problem, save_weight: np.ndarray, recompute_weight: np.ndarray,
            *, side: str = "source") -> np.ndarray:
    """Return the mask of saved values in a minimum cut."""
    n = problem.n
    source, sink = 2 * n, 2 * n + 1
    ins, outs = np.arange(n) * 2, np.arange(n) * 2 + 1
    finite = np.concatenate([save_weight[problem.can_save],
                             recompute_weight[problem.can_recompute]])
    scale = _FINITE_TOTAL / max(float(finite.sum()), 1e-30)
    if scale >= 1 and np.all(finite == np.round(finite)):
        scale = 1.0
    save_cap = np.where(problem.can_save,
                        np.minimum(np.round(save_weight * scale), _FINITE_TOTAL), _INF)
    rec_cap = np.where(problem.can_recompute,
                       np.minimum(np.round(recompute_weight * scale), _FINITE_TOTAL), _INF)
    data_rows, data_cols, data_caps = _data_edges(problem)
    row = np.concatenate([ins, np.full(n, source), data_rows])
    col = np.concatenate([outs, ins, data_cols])
    cap = np.concatenate([save_cap, rec_cap, data_caps])
    keep = cap > 0
    graph = sp.csr_array((cap[keep].astype(np.int32), (row[keep], col[keep])),
                         shape=(2 * n + 2, 2 * n + 2))
    result = maximum_flow(graph, source, sink)
    if result.flow_value >= _INF:
        raise NoFiniteCut("no plan can provide every value backward needs")
    residual = graph - result.flow
    residual.data = np.where(residual.data > 0, 1, 0).astype(np.int8)
    residual.eliminate_zeros()
    if side == "sink":
        # Nodes that still reach the sink through residual capacity.
        reaches = np.zeros(2 * n + 2, dtype=bool)
        reaches[breadth_first_order(residual.T.tocsr(), sink, return_predecessors=False)] = True
        return ~reaches[ins] & reaches[outs]
    reachable = np.zeros(2 * n + 2, dtype=bool)
    reachable[breadth_first_order(residual, source, return_predecessors=False)] = True
    return reachable[ins] & ~reachable[outs]

"""Values recomputed twice: a plan space below single recomputation.

With one backward copy per recomputed value, a value another recompute reads
early (attention's scores, read to rebuild the input of a block's MLP) stays
alive until backward itself reads it (the attention backward), so a block's
internals are all live together, as under a checkpoint per block. Giving
such a value two copies, an early one other recomputes read and that is
freed once they ran, and a late one made just in time for backward's own
readers, is nested checkpointing inside a block; it trades recompute time
for a lower peak (Decision.recomputed_twice).

The design, and why. Checkmate's per-stage formulation (a binary matrix of
which value is computed at which backward stage) can express this, but it
multiplies the programme by the number of stages and the ILP already runs
near its size limit here; Rotor-style dynamic programmes need a chain of
identical blocks, which a joint graph with a head, an embedding and
non-repeated parts is not. Instead, the choice is made on top of a plan
whose saved set is fixed: for its recomputed values, the ones held early
are found from the same backward lifetimes the memory proxy uses (the
first backward step at which a recompute chain needs each value, against
the first at which backward reads it), and those the exact memory model
then confirms lower the peak get two copies. Numbers in, masks out: the
caller evaluates the plans exactly.
"""

from __future__ import annotations

import numpy as np

from fxckpt.solve.problem import Problem


def held_early(problem: Problem, recomputed: np.ndarray, min_span: float = 0.0
               ) -> np.ndarray:
    """Recomputed values backward reads that another recompute needs more
    than ``min_span`` (a fraction of backward's steps) before backward first
    reads them, and the recomputed inputs only recomputes read that their
    late copies need."""
    lifetimes = problem.lifetimes
    if lifetimes is None:
        return np.zeros(problem.n, dtype=bool)
    direct = lifetimes.first_bwd.astype(float)
    need = direct.copy()      # first backward step needing the value at all
    chain = np.full(problem.n, np.inf)
    for i in range(problem.n - 1, -1, -1):
        if recomputed[i]:
            for j in problem.parents[i]:
                chain[j] = min(chain[j], need[i])
                need[j] = min(need[j], need[i])
    steps = max(float(direct.max(initial=0)), 1.0)
    twice = recomputed & problem.needed & (chain < direct) \
        & (direct - chain > min_span * steps)
    # A late copy reads the late copies of its inputs that have one: inputs
    # only recomputes read get two copies too, or their one copy would be
    # held from the early reader to the late one.
    for i in range(problem.n - 1, -1, -1):
        if twice[i]:
            parents = problem.parents[i]
            twice[parents] |= recomputed[parents] & ~problem.needed[parents]
    return twice

"""Reference strategies, through the same Problem and the same cut:
save everything backward reads, recompute all that can be recomputed,
checkpoint per block (torch.utils.checkpoint around each layer), and
sqrt(n) segments."""

from __future__ import annotations

import math
import time
import numpy as np

from fxckpt.types import Decision
from fxckpt.solve.problem import Problem, computed_in_backward, to_decision


def save_all(problem: Problem) -> Decision:
    start = time.perf_counter()
    saved = problem.needed & problem.can_save
    return _decision(problem, saved, "save_all", start)


def recompute_all(problem: Problem) -> Decision:
    """Save only what cannot be recomputed; recompute everything else."""
    return _segments(problem, np.zeros(problem.n, dtype=np.int64), "recompute_all")


def per_block(problem: Problem) -> Decision:
    """Like torch.utils.checkpoint around every repeated block (layer): values
    inside a block are recomputed; what crosses a block boundary is saved."""
    return _segments(problem, problem.block, "per_block")


def sqrt_segments(problem: Problem) -> Decision:
    """Forward order cut into sqrt(n) segments, each checkpointed."""
    length = max(1, int(math.sqrt(problem.n)))
    return _segments(problem, np.arange(problem.n) // length, "sqrt_n")


def _segments(problem: Problem, segment: np.ndarray, name: str) -> Decision:
    """Save what leaves its segment (read by another segment, or outside any)
    and what cannot be recomputed; recompute the rest backward needs from
    those, as a checkpoint around each segment would."""
    start = time.perf_counter()
    boundary = ~problem.can_recompute | (segment < 0)
    for i, parents in enumerate(problem.parents):
        for j in parents:
            if segment[j] != segment[i]:
                boundary[j] = True
    saved = boundary & problem.can_save
    recomputed = computed_in_backward(problem, saved)
    # Keep only boundaries backward actually reads, directly or to recompute.
    read = problem.needed.copy()
    for i in np.flatnonzero(recomputed):
        read[problem.parents[i]] = True
    return _decision(problem, saved & read, name, start)


def _decision(problem: Problem, saved: np.ndarray, name: str, start: float) -> Decision:
    recomputed = computed_in_backward(problem, saved)
    return to_decision(problem, saved, recomputed, solver=name,
                       seconds=time.perf_counter() - start, gap=None, budget_bytes=None)

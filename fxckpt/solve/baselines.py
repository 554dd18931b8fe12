"""Reference strategies, through the same Problem and the same cut:
save everything backward reads, recompute all that can be recomputed,
checkpoint per block (torch.utils.checkpoint around each layer), and
sqrt(n) segments; a leaner per-block plan seeds the budgeted frontier."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from fxckpt.types import Decision
from fxckpt.solve.cut import min_cut
from fxckpt.solve.partitioner import partitioner_saved
from fxckpt.solve.problem import (Problem, computed_in_backward, read_in_backward,
                                  to_decision)


def save_all(problem: Problem) -> Decision:
    start = time.perf_counter()
    saved = problem.needed & problem.can_save
    return _decision(problem, saved, "save_all", start)


def recompute_all(problem: Problem) -> Decision:
    """Checkpoint the whole model once: save only what cannot be recomputed
    (the inputs), recompute everything else backward needs. Backward's
    recomputes run just in time rather than as one replay of the forward, so
    its peak is not necessarily below per_block's or even save_all's."""
    return _segments(problem, np.zeros(problem.n, dtype=np.int64), "recompute_all")


def per_block(problem: Problem) -> Decision:
    """torch.compile with torch.utils.checkpoint around every repeated block
    (layer), as torch's partitioner plans it (solve/partitioner.py): every
    value inside a block is tagged for recompute, except those a later
    block reads, which are tagged MUST_SAVE; the values outside the blocks
    are left to torch's minimum cut, with its weights and its bans."""
    start = time.perf_counter()
    inside = problem.block >= 0
    crossing = np.zeros(problem.n, dtype=bool)
    for i, parents in enumerate(problem.parents):
        if inside[i]:
            inner = parents[inside[parents]]
            crossing[inner[problem.block[inner] < problem.block[i]]] = True
    must_save = inside & crossing
    must_recompute = inside & ~crossing & problem.can_recompute
    return _decision(problem, partitioner_saved(problem, must_recompute, must_save),
                     "per_block", start)


def lean_blocks(problem: Problem) -> Decision:
    """A leaner per-block plan, a low-peak seed for the frontier: every value
    inside a block is recomputed except what one block passes to another;
    values computed from no input at all (a mask built from ``ones``) are
    left outside the blocks, and outside them a minimum cut may recompute
    any cheap op (views, pointwise, nothing random)."""
    start = time.perf_counter()
    constant = _constant(problem)
    segment = np.where(constant, -1, problem.block)
    outside = segment < 0
    crossing = np.zeros(problem.n, dtype=bool)
    for i, parents in enumerate(problem.parents):
        if not outside[i]:
            inner = parents[~outside[parents]]
            crossing[inner[segment[inner] != segment[i]]] = True
    recompute = ~outside & ~crossing & problem.can_recompute
    cheap = outside & ~constant & problem.can_recompute & problem.hint_recompute \
        & (problem.replay == 0)
    partitioned = replace(problem, can_save=problem.can_save & ~recompute,
                          can_recompute=recompute | cheap)
    # Among cuts of equal bytes, recompute no op that costs time.
    saved = min_cut(partitioned, problem.size, problem.replay + (problem.cost > 0))
    return _decision(problem, saved & read_in_backward(problem, saved), "lean_blocks", start)


def _constant(problem: Problem) -> np.ndarray:
    """Values that depend on no graph input (parents come first in order)."""
    constant = np.zeros(problem.n, dtype=bool)
    for i, parents in enumerate(problem.parents):
        constant[i] = problem.can_recompute[i] and bool(np.all(constant[parents]))
    return constant


def per_part(problem: Problem) -> Decision:
    """A checkpoint around each direct submodule of every block (attention,
    MLP), a low-peak seed for the frontier: what leaves a submodule is saved,
    what stays inside is recomputed."""
    part = problem.part if problem.part is not None else problem.block
    return _segments(problem, part, "per_part")


def sqrt_segments(problem: Problem) -> Decision:
    """Forward order cut into sqrt(n) segments, each checkpointed."""
    length = max(1, int(math.sqrt(problem.n)))
    return _segments(problem, np.arange(problem.n) // length, "sqrt_n")


def _segments(problem: Problem, segment: np.ndarray, name: str) -> Decision:
    """Save what leaves its segment (read by another segment, or outside any)
    and what cannot be recomputed; recompute the rest backward needs from
    those, as a checkpoint around each segment would."""
    start = time.perf_counter()
    boundary = ~problem.can_recompute | (segment < 0) | _boundary(problem, segment)
    saved = boundary & problem.can_save
    return _decision(problem, saved & read_in_backward(problem, saved), name, start)


def _boundary(problem: Problem, segment: np.ndarray) -> np.ndarray:
    """Values read by a value of another segment."""
    boundary = np.zeros(problem.n, dtype=bool)
    for i, parents in enumerate(problem.parents):
        boundary[parents[segment[parents] != segment[i]]] = True
    return boundary


def _decision(problem: Problem, saved: np.ndarray, name: str, start: float) -> Decision:
    recomputed = computed_in_backward(problem, saved)
    return to_decision(problem, saved, recomputed, solver=name,
                       seconds=time.perf_counter() - start, gap=None, budget_bytes=None)

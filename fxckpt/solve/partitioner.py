"""torch's min-cut partitioner over a Problem: what torch.compile saves for
backward when values are tagged as torch.utils.checkpoint tags them.

Tagged values are recomputed whatever it costs (their inputs must reach
backward: saved, or recomputed in turn); values tagged MUST_SAVE may not be
recomputed (views aside); every other value is saved or recomputed by a
minimum cut at the weights and with the bans of problem.remat (see
remat_classes.py), with two more bans that depend on the tags: a value
used far below an earlier, unfusible use of its input, and the end of a
long chain of fusible ops. Among minimum cuts, torch keeps the one that
recomputes least.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from fxckpt.solve.cut import min_cut
from fxckpt.solve.problem import Problem, read_in_backward

_LONG_CHAIN = 100   # fusible ops in a row after which the chain's end is banned


def partitioner_saved(problem: Problem, must_recompute: np.ndarray,
                      must_save: np.ndarray) -> np.ndarray:
    """The mask of values torch's partitioner saves and backward reads
    (torch's extraction drops the others)."""
    remat = problem.remat
    if remat is None:
        raise ValueError("the Problem carries no partitioner classes (build_problem makes them)")
    must_recompute = must_recompute & problem.can_recompute
    banned = remat.banned | (must_save & remat.tag_bans)
    banned &= ~remat.view & ~must_recompute
    allowed = ~remat.view & ~must_recompute
    banned = _ban_used_far_apart(remat, banned, allowed)
    banned = _ban_long_chains(remat, banned, allowed)
    can_save = problem.can_save & np.isfinite(remat.weight) & ~must_recompute
    network = replace(problem, can_save=can_save,
                      can_recompute=problem.can_recompute & ~banned,
                      needed=problem.needed | must_recompute)
    weight = np.where(np.isfinite(remat.weight), remat.weight, 0.0)
    saved = min_cut(network, weight, np.zeros(problem.n), side="sink")
    return saved & read_in_backward(problem, saved)


def _ban_used_far_apart(remat, banned: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A fusible use of a value placed after an unfusible op downstream of
    its earlier uses would not fuse with them: ban recomputing it."""
    banned = banned.copy()
    for i in np.flatnonzero(remat.required):
        users = remat.users[i]
        if not len(users):
            continue
        first = _first_unfusible(remat, users, int(remat.order[users].max()))
        late = users[(remat.order[users] > first) & remat.fuses[i]]
        banned[late[allowed[late]]] = True
    return banned


def _first_unfusible(remat, start: np.ndarray, last: int) -> int:
    """Position of the first op, in forward order, reached from ``start``
    through fusible edges that does not fuse with its input (``last`` if none
    before it)."""
    heap = [(int(remat.order[j]), int(j), True) for j in start]
    heapq.heapify(heap)
    while heap:
        position, j, fusible = heapq.heappop(heap)
        if not fusible:
            return position
        for user, fuses in zip(remat.users[j], remat.fuses[j]):
            entry = (int(remat.order[user]), int(user), bool(fuses))
            if entry[0] <= last and entry not in heap:
                heapq.heappush(heap, entry)
    return last


def _ban_long_chains(remat, banned: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Where a single chain of fusible ops runs on for more than a hundred
    ops, ban recomputing the op it reached."""
    banned = banned.copy()
    visited = np.zeros(len(banned), dtype=bool)
    for start in np.flatnonzero(remat.required):
        begin = int(remat.order[start])
        heap = [(begin, int(start))]
        while heap:
            position, j = heapq.heappop(heap)
            if visited[j]:
                continue
            visited[j] = True
            if position > begin + _LONG_CHAIN and not heap:
                banned[j] |= bool(allowed[j])
                break
            for user, fuses in zip(remat.users[j], remat.fuses[j]):
                if fuses and not banned[user]:
                    heapq.heappush(heap, (int(remat.order[user]), int(user)))
    return banned

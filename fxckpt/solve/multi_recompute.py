"""Values recomputed more than once: a plan space below single recomputation.

With one backward copy per recomputed value, a value is live from the first
backward step that needs it to the last: attention's scores, needed early
to rebuild the input of a block's MLP, stay alive through the MLP's backward
until the attention backward reads them, so a block's internals are all live
together, as under a checkpoint per block. Recomputing such a value again
when it is needed after a long idle stretch (and freeing the copy before)
is nested checkpointing inside a block; it trades recompute time for a lower
peak (Decision.copy_steps: the steps from which each new copy serves).

The design, and why. Checkmate's formulation (which value is computed at
which backward stage, binary) expresses this exactly, but it multiplies the
programme by the number of stages, and the ILP already runs near its size
limit here; Rotor/Rockmate's dynamic programmes need a chain of identical
blocks, which a joint graph with an embedding, a head and non-repeated parts
is not. Instead, for a plan whose saved set is fixed, each recomputed value's
backward needs (direct reads, and the copies of the recomputed values that
read it) are grouped: a need more than ``gap`` steps after the one before
starts a new copy. ``gap`` sweeps from "every distinct step" to "never", and
the exact memory model picks among the plans (solve/frontier). Numbers
in (the proxy's backward lifetimes), steps out.
"""

from __future__ import annotations

import numpy as np

from fxckpt.solve.problem import Problem


def copy_steps(problem: Problem, recomputed: np.ndarray, gap: float
               ) -> dict[int, tuple[int, ...]]:
    """For each recomputed value needed again more than ``gap`` (a fraction
    of backward's steps) after its previous need, the steps its later
    copies start at."""
    return {i: tuple(s[1:]) for i, s in copy_starts(problem, recomputed, gap).items()
            if len(s) > 1}


def copy_starts(problem: Problem, recomputed: np.ndarray, gap: float
                ) -> dict[int, list[int]]:
    """For each recomputed value backward needs, the steps its copies start
    at, the first need first. Its needs are the steps that read it and the
    starts of the copies of its recomputed readers."""
    lifetimes = problem.lifetimes
    if lifetimes is None or not len(lifetimes.reads):
        return {}
    gap *= max((int(r[-1]) for r in lifetimes.reads if len(r)), default=0)
    users = recomputed_users(problem, recomputed)
    starts: dict[int, list[int]] = {}
    for i in range(problem.n - 1, -1, -1):
        if recomputed[i]:
            needs = needs_of(problem, users, i, starts)
            if needs:
                starts[i] = _grouped(needs, gap)
    return starts


def needs_of(problem: Problem, users: list[list[int]], i: int,
             starts: dict[int, list[int]]) -> list[int]:
    """The backward steps needing value ``i``, ascending, given the copy
    starts of its recomputed readers ``users[i]``."""
    direct = problem.lifetimes.reads[i].tolist()  # ascending and distinct already
    later = [starts[u] for u in users[i] if u in starts]
    if not later:
        return direct
    # Short lists: sets beat numpy's unique here (called once per value).
    return sorted(set(direct).union(*later))


def recomputed_users(problem: Problem, recomputed: np.ndarray) -> list[list[int]]:
    """The recomputed readers of each value."""
    users: list[list[int]] = [[] for _ in range(problem.n)]
    for i, parents in enumerate(problem.parents):
        if recomputed[i]:
            for j in dict.fromkeys(parents.tolist()):
                users[j].append(i)
    return users


def _grouped(needs: list[int], gap: float) -> list[int]:
    """The needs that begin a new copy: the first, and each more than
    ``gap`` after the need before it."""
    return [step for k, step in enumerate(needs) if k == 0 or step - needs[k - 1] > gap]

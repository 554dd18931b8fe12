"""The runtime-optimal plan: fewest saved bytes without recomputing anything
costly, as a minimum cut (see cut.py).

Saving costs a value's bytes; recomputing is free except that a random op
must then save its generator state. Nothing tagged PREFER_SAVE or MUST_SAVE
(matmuls, convolutions, attention by default) may be recomputed, and nothing
a user tagged *_RECOMPUTE may be saved. Among cuts of equal bytes, the one
that recomputes values a default tag would rather recompute wins.

What "costly" means depends on the compiler. Inductor fuses a recomputed
pointwise op into the backward kernel that reads it, so recomputing it is
nearly free. Without fusion (``fuses=False``: compiler="eager") each
recomputed op is a kernel of its own that reads and writes memory. Then
only these are recomputed: ops that cost nothing (views, aliases, tuple
items); pointwise values no reader needs materialised (read only by
pointwise ops, forward and backward), which torch's partitioner recomputes
too, so that the plan peaks no higher than torch.compile's default on the
same runtime at about its step time; and what the user tagged *_RECOMPUTE.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from fxckpt.errors import PolicyError
from fxckpt.types import Decision
from fxckpt.solve.cut import NoFiniteCut, min_cut
from fxckpt.solve.problem import Problem, computed_in_backward, to_decision

_PREFER_RECOMPUTE_PENALTY = 1.001


def runtime_optimal(problem: Problem, *, fuses: bool = True) -> Decision:
    start = time.perf_counter()
    can_recompute = problem.can_recompute & ~problem.hint_save
    if not fuses:
        # A tensor that cannot be saved was tagged MUST_RECOMPUTE (a tuple
        # that cannot be saved holds no bytes: its items are saved instead).
        asked = problem.prefer_recompute | (~problem.can_save & (problem.size > 0))
        cheap = problem.cost <= 0.0
        if problem.unmaterialized is not None:
            cheap = cheap | problem.unmaterialized
        can_recompute &= cheap | asked
    restricted = replace(
        problem,
        can_recompute=can_recompute,
        can_save=problem.can_save & ~problem.prefer_recompute)
    save_weight = np.where(problem.hint_recompute,
                           problem.size * _PREFER_RECOMPUTE_PENALTY + 1.0, problem.size)
    try:
        saved = min_cut(restricted, save_weight, problem.replay)
    except NoFiniteCut:
        raise PolicyError(
            "the tags leave no feasible plan: some value backward needs can be "
            "neither saved nor recomputed. Check MUST_RECOMPUTE / PREFER_RECOMPUTE "
            "policies on values whose inputs cannot be recomputed either.") from None
    recomputed = computed_in_backward(problem, saved)
    return to_decision(problem, saved, recomputed, solver="mincut",
                       seconds=time.perf_counter() - start, gap=0.0, budget_bytes=None)

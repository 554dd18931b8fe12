"""The runtime-optimal plan: what to save when no budget asks for less.

What "runtime-optimal" means depends on the compiler.

Under Inductor (``fuses=True``) it is the partition torch.compile itself
makes: torch's minimum cut with its weights and bans (solve/partitioner.py),
tags as torch.utils.checkpoint would give them (what the user asks to
recompute is recomputed, what is preferred saved is never recomputed).
Those bans keep recomputes where Inductor fuses them into backward's
kernels: a reduction, a value backward must materialise anyway, a random
op or a long fusible chain is saved. The fewest saved bytes, recomputing
every op but matmuls as if each fused for free, compile to more kernels
than torch's partition and slow the compile past torch's own, where
torch's partition compiles in 0.99x its time at four layers
(`fxckpt bench --suite compile`). It peaks where torch's default does,
above the fewest saved bytes: plans that save less are a budget's to
choose, priced.
Compiled without fxckpt's fusion refusals (inductor/fusion.py), it runs
torch.compile's kernels.

Without fusion (``fuses=False``: compiler="eager") each recomputed op is a
kernel of its own that reads and writes memory: fewest saved bytes
(a minimum cut, see cut.py) without recomputing anything costly. Saving
costs a value's bytes; recomputing is free except that a random op must
then save its generator state. Nothing tagged PREFER_SAVE or MUST_SAVE
(matmuls, convolutions, attention by default) may be recomputed, and
nothing a user tagged *_RECOMPUTE may be saved. Only these are
recomputed: ops that cost nothing (views, aliases, tuple items); pointwise
values no reader needs materialised (read only by pointwise ops, forward
and backward), which torch's partitioner recomputes too, so that the plan
peaks no higher than torch.compile's default on the same runtime at about
its step time; and what the user tagged *_RECOMPUTE. Among cuts of equal
bytes, the one that recomputes values a default tag would rather
recompute wins. A Problem built without torch's partitioner classes
(``Problem.remat`` None) is planned this way under Inductor too, with
every recompute allowed.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from fxckpt.errors import PolicyError
from fxckpt.types import Decision
from fxckpt.solve.cut import NoFiniteCut, min_cut
from fxckpt.solve.partitioner import partitioner_saved
from fxckpt.solve.problem import Problem, computed_in_backward, to_decision

_PREFER_RECOMPUTE_PENALTY = 1.001


def runtime_optimal(problem: Problem, *, fuses: bool = True) -> Decision:
    start = time.perf_counter()
    # A tensor that cannot be saved counts as tagged MUST_RECOMPUTE (a tuple that
    # cannot be saved holds no bytes: its items are saved instead).
    asked = problem.prefer_recompute | (~problem.can_save & (problem.size > 0))
    try:
        if fuses and problem.remat is not None:
            saved = partitioner_saved(problem, asked, problem.hint_save | problem.prefer_save)
        else:
            saved = _fewest_bytes(problem, asked, fuses)
    except NoFiniteCut:
        raise PolicyError(
            "the tags leave no feasible plan: some value backward needs can be "
            "neither saved nor recomputed. Check MUST_RECOMPUTE / PREFER_RECOMPUTE "
            "policies on values whose inputs cannot be recomputed either.") from None
    recomputed = computed_in_backward(problem, saved)
    return to_decision(problem, saved, recomputed, solver="mincut",
                       seconds=time.perf_counter() - start, gap=0.0, budget_bytes=None)


def _fewest_bytes(problem: Problem, asked: np.ndarray, fuses: bool) -> np.ndarray:
    """The minimum cut over saved bytes (module docstring)."""
    can_recompute = problem.can_recompute & ~problem.hint_save
    if not fuses:
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
    return min_cut(restricted, save_weight, problem.replay)

"""The frontier's stage below the single-recompute floor: the lowest
plans (and the region seeds) with values recomputed again after idle
stretches (solve/multi_recompute.py)."""

from __future__ import annotations

from dataclasses import replace

from fxckpt.solve.candidates import Candidate, mask
from fxckpt.solve.effort import Effort
from fxckpt.solve.frontier.search import Added, Found, Search
from fxckpt.solve.multi_recompute import copy_steps
from fxckpt.solve.problem import Problem

# Seeds whose recompute chains stay inside a block or submodule.
REGION_SEEDS = ("per_block", "lean_blocks", "per_part")
# What a plan made here adds to its base's solver name (``Plan.solver``).
LABEL = "recomputed again"


def recompute_again(search: Search, found: Found) -> Added:
    """Plans below the lowest peak found, where the lowest plans recompute
    values again after idle stretches (solve/multi_recompute.py), for a
    sweep of ``effort.again_gaps`` stretch lengths. Each is checked by the
    exact memory model; only those below the single-recompute floor are
    kept: they cost more recompute than the plans they start from. Bases:
    the first ``effort.again_bases`` of the ``effort.again_tries`` lowest
    plans that give such a plan, and the region seeds (not where
    ``search.again_from_seeds`` is off: a compiler that reorders and fuses
    the copies, Inductor)."""
    return Added(recomputed_again(search.proxy, search.candidate, found.plans,
                                  search.effort, search.again_from_seeds))


def recomputed_again(problem: Problem, candidate, found: list[Candidate], effort: Effort,
                     from_seeds: bool = True) -> list[Candidate]:
    """``recompute_again``'s plans for ``found`` on ``problem``."""
    if effort.again_bases <= 0:
        return []
    lowest = min(c.peak for c in found)
    # A base the exact model cannot tell from one already taken (the same
    # peak and cost) is not started from again: on GPTs per_block and
    # lean_blocks differ by one view, and so do their plans recomputing
    # again, which tie too (tests/test_again.py).
    distinct: dict[tuple, Candidate] = {}
    for base in sorted(found, key=lambda c: (c.peak, c.cost)):
        distinct.setdefault((base.peak, base.cost), base)
    # Recomputing again keeps the base's saved set, so no plan made from it
    # peaks below what the base holds as backward starts (the schedule
    # model's held_at_backward, where it evaluated the base): a base holding
    # the lowest peak already is not started from (tests/test_again.py).
    usable = [base for base in distinct.values()
              if getattr(base.timeline, "held_at_backward", 0) < lowest]
    bases = usable[:effort.again_tries]
    among_lowest = {id(c) for c in bases}
    # The region seeds too: their recompute chains stay inside a block or
    # submodule, so copies made again are short-lived, and the lowest plan
    # recomputing again need not start from one of the lowest plans.
    bases += [c for c in usable if from_seeds and c.decision.solver in REGION_SEEDS
              and id(c) not in among_lowest]
    tried: set[tuple] = set()
    kept: list[Candidate] = []
    # A base whose first plan recomputing again ties an earlier base's first
    # (the same exact peak and cost) is not swept further: it behaves as
    # that base (per_block and lean_blocks on GPTs, whose saved sets differ
    # by a view and its base, and whose plans then tie at every stretch).
    firsts: set[tuple] = set()
    # Of the lowest plans, the first ``again_bases`` that give a plan below
    # the lowest peak are swept (the region seeds all are): a low plan that
    # recomputes little has little to recompute again, so one that gives
    # nothing takes no place from a later base that lowers the floor
    # (tests/test_again.py).
    productive = 0
    for base in bases:
        if id(base) in among_lowest and productive >= effort.again_bases:
            continue
        before = len(kept)
        recomputed = mask(problem, base.decision.recomputed)
        first = True
        for fraction in effort.again_gaps:
            again = tuple(sorted((problem.names[i], s) for i, s in
                                 copy_steps(problem, recomputed, fraction).items()))
            if not again or (base.decision.recomputed, again) in tried:
                continue
            tried.add((base.decision.recomputed, again))
            made = candidate(replace(base.decision, copy_steps=again,
                                     solver=f"{base.decision.solver}+{LABEL}"))
            if made.peak < lowest:
                kept.append(made)
            if first:
                first = False
                if (made.peak, made.cost) in firsts:
                    break
                firsts.add((made.peak, made.cost))
        productive += id(base) in among_lowest and len(kept) > before
    return kept

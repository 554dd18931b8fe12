"""The frontier's solver stages: the baselines' plans, the sweep of
targets stepping down from the top, solves aimed under the lowest peak
found, and solves aimed inside the frontier's widest gaps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fxckpt.solve.baselines import (lean_blocks, per_block, per_part, recompute_all,
                                    sqrt_segments)
from fxckpt.solve.candidates import Candidate, mask, non_dominated
from fxckpt.solve.cut import NoFiniteCut
from fxckpt.solve.frontier.search import Added, Found, Search
from fxckpt.solve.ilp import Infeasible


def seeds(search: Search, found: Found) -> Added:
    """The baselines' plans; a baseline whose blocks leave a value backward
    needs neither saved nor recomputed (NoFiniteCut) seeds nothing, the
    others still do."""
    plans = []
    for baseline in (recompute_all, per_block, lean_blocks, per_part, sqrt_segments):
        try:
            plans.append(search.candidate(baseline(search.base)))
        except NoFiniteCut:
            continue
    return Added(plans)


def sweep(search: Search, found: Found) -> Added:
    """Plans at targets stepping down geometrically from the runtime-optimal
    plan's peak (``found.plans[0]``), by ``_sweep_ratio``; after each, the
    proxy follows the recompute chains that plan uses (it only grows more
    cautious, so targets below stay honest); stopped where ``effort.stalls``
    targets in a row under the lowest peak found do not reach under it.
    With offload tags, the cheapest plan whatever its peak first: offload
    costs transfer time, so the runtime-optimal plan (which follows every
    offload tag) is not the cheapest, and the frontier reaches up to it.
    Hands on the refined proxy and the step ratio."""
    effort, proxy = search.effort, search.proxy
    plans: list[Candidate] = []
    target = float(found.plans[0].peak)
    if proxy.can_offload.any():
        plans.append(search.solved(np.inf))
        target = max(target, plans[-1].peak / effort.target_ratio)
    lowest, stalls = min(c.peak for c in found.plans + plans), 0
    ratio = _sweep_ratio(target, lowest, effort.targets, effort.target_ratio)
    for _ in range(effort.targets):
        target *= ratio
        try:
            plans.append(replace(search, proxy=proxy).solved(target))
        except Infeasible:
            break
        proxy = proxy.refined(mask(proxy, plans[-1].decision.recomputed))
        stalls = stalls + 1 if target < lowest <= plans[-1].peak else 0
        lowest = min(lowest, plans[-1].peak)
        if stalls >= effort.stalls:
            break
    return Added(plans, proxy=proxy, ratio=ratio)


def _sweep_ratio(top: float, lowest: int, count: int, ratio: float) -> float:
    """The step between targets: ``ratio``, or a larger step where that
    many targets would not reach down from ``top`` to the lowest peak the
    reference plans reach (when the runtime-optimal plan saves everything,
    the peaks between run from the step's full activations down to
    per-block checkpointing's)."""
    if top <= 0 or lowest <= 0 or lowest >= top:
        return ratio
    return min(ratio, (lowest / top) ** (1.0 / count))


def under_lowest(search: Search, found: Found) -> Added:
    """Plans aimed just under the lowest peak found, with the refined
    proxy, until none is lower: the geometric targets step over floors
    between them, and the floor BudgetError names must be the lowest the
    strategy can reach."""
    return Added(_below(lambda target: search.solved(target), found, search.effort))


def under_lowest_exact(search: Search, found: Found) -> Added:
    """As ``under_lowest``, with the exact programme (solver="auto", where
    ``effort.exact_under_lowest``): the plans recomputing again starts from
    are the lowest ones."""
    if search.solver != "auto" or not search.effort.exact_under_lowest:
        return Added([])
    return Added(_below(lambda target: search.solved(target, how="ilp"), found,
                        search.effort))


def under_lowest_first_proxy(search: Search, found: Found) -> Added:
    """As ``under_lowest``, with the proxy as first built: refinement makes
    the proxy more cautious, which can hide a lower floor from it; each
    plan's peak is the exact model's, so an optimistic proxy cannot put a
    false plan on the frontier."""
    if search.proxy is search.base:
        return Added([])
    return Added(_below(lambda target: search.solved(target, search.base), found,
                        search.effort))


def _below(solved, found: Found, effort) -> list[Candidate]:
    lowest = min(c.peak for c in found.plans)
    plans: list[Candidate] = []
    for _ in range(effort.floor_steps):
        try:
            plans.append(solved(float(lowest - 1)))
        except Infeasible:
            break
        if plans[-1].peak >= lowest:
            break
        lowest = plans[-1].peak
    return plans


def gaps(search: Search, found: Found) -> Added:
    """Plans aimed inside the widest gaps of the frontier: where two
    neighbouring frontier plans lie further apart than a step of the sweep
    (the strategy's proxy reached past the targets between them), a budget
    between them would pay the lower plan's recompute. Each solve, on the
    proxy as first built, aims at the gap's geometric middle, up to
    ``effort.gap_targets`` solves."""
    added: list[Candidate] = []
    tried: set[int] = set()
    for _ in range(search.effort.gap_targets):
        frontier = non_dominated(found.plans + added)
        wide = [(lower.peak / upper.peak, lower.peak, upper.peak)
                for lower, upper in zip(frontier, frontier[1:])
                if lower.peak < upper.peak * search.ratio]
        wide = [g for g in wide if int((g[1] * g[2]) ** 0.5) not in tried]
        if not wide:
            break
        _, low, high = min(wide)
        target = int((low * high) ** 0.5)
        tried.add(target)
        try:
            added.append(search.solved(float(target), search.base))
        except Infeasible:
            continue
    return Added(added)

"""The frontier's minimum-cut stages: plans chosen by price per byte
saved rather than by the proxy's peak, and their neighbours in the price
series walked to."""

from __future__ import annotations

import numpy as np

from fxckpt.solve.candidates import Candidate, non_dominated, plan_key
from fxckpt.solve.frontier.search import Added, Found, Search
from fxckpt.solve.problem import to_decision


def cut_plans(search: Search, found: Found) -> Added:
    """Minimum-cut plans at prices per byte spread over the values' own cost
    per byte (see fast.cut_plan): plans chosen by saved bytes, not by the
    proxy's peak, which can be cautious about a whole family of plans, so
    they fill gaps the proxy-guided solves leave: on tiny HF Llama and
    GPT-2 they give the frontier a plan lower and cheaper than torch's own
    at activation_memory_budget=0.5 (tests/test_torch_plans_dominated.py).
    Only plans whose recompute cost falls between two frontier plans wider
    apart in peak than ``effort.cut_gap`` are simulated, widest gaps first,
    at most ``effort.cut_plans``. Besides those, up to
    ``effort.steep_plans`` whose proxy peak lies furthest
    below the frontier plan just cheaper than them: where the frontier's
    cost drops steeply over a narrow band of peaks no gap is wide, yet such
    a plan can land below both neighbours (on the compile suite's 8-layer
    GPT, 2% below both; `fxckpt bench --suite solvers`). Adds those
    simulated, and hands on the series of distinct cut plans not already
    found, cheapest first (for ``cut_walk``). On ``search.base``, the proxy
    as first built."""
    problem, candidate, cuts, effort = search.base, search.candidate, search.cuts, search.effort
    found = found.plans
    ratio = problem.cost / np.maximum(problem.size, 1.0)
    ratio = ratio[(problem.cost > 0) & (problem.size > 0)]
    if not len(ratio):
        return Added([], cut_series=())
    low, high = np.quantile(ratio, [0.01, 0.99])
    prices = list(np.geomspace(max(low, 1e-30) / 10, max(high, low, 1e-30) * 10,
                               effort.cut_prices))
    plans = {lam: cuts(problem, float(lam)) for lam in prices}
    # The plans change within a narrower band of prices: as many again
    # spread over the band.
    saved_bytes = [float(problem.size[plans[lam][0]].sum()) for lam in prices]
    changes = [k for k in range(len(prices) - 1) if saved_bytes[k] != saved_bytes[k + 1]]
    if changes:
        band = np.geomspace(prices[changes[0]], prices[changes[-1] + 1],
                            effort.cut_band + 2)[1:-1]
        plans.update((float(lam), cuts(problem, float(lam))) for lam in band)
    frontier = non_dominated(found)
    known = {(c.decision.saved, c.decision.recomputed) for c in found}
    masks: dict[tuple, tuple] = {}
    for lam in sorted(plans):
        saved, recomputed = plans[lam]
        key = (saved.tobytes(), recomputed.tobytes())
        if key not in masks:
            masks[key] = (saved, recomputed, problem.plan_cost(recomputed))
    ranked, steep, series = [], [], []
    for saved, recomputed, cost in masks.values():
        decision = to_decision(problem, saved, recomputed, solver="cut", seconds=0.0,
                               gap=None, budget_bytes=None)
        if (decision.saved, decision.recomputed) in known:
            continue
        known.add((decision.saved, decision.recomputed))
        series.append(decision)
        # The frontier plans either side of it in cost, and how far apart
        # they are in peak (costlier than the lowest plan: it can only
        # help below it, tried last).
        cheaper = [c for c in frontier if c.cost <= cost]
        dearer = [c for c in frontier if c.cost > cost]
        width = cheaper[0].peak / max(dearer[-1].peak, 1) if cheaper and dearer else 1.0
        if cheaper and dearer and cost > cheaper[0].cost:
            # Where the frontier drops steeply in cost over a narrow band
            # of peaks, a plan costing between the two may still peak below
            # both: the proxy's peak says how far below.
            below = cheaper[0].peak / max(problem.peak(saved, recomputed), 1.0)
            if below > width and below >= 1.0 / effort.cut_gap:
                steep.append((-below, len(steep), decision))
        if dearer and width < 1.0 / effort.cut_gap:
            continue
        ranked.append((-width, len(ranked), decision))
    chosen = [decision for _, _, decision in sorted(ranked)[:effort.cut_plans]]
    keys = {plan_key(decision) for decision in chosen}
    chosen += [decision for _, _, decision in sorted(steep)
               if plan_key(decision) not in keys][:effort.steep_plans]
    return Added([candidate(decision) for decision in chosen], cut_series=tuple(series))


def cut_walk(search: Search, found: Found) -> Added:
    """Cut plans next to those on the frontier in the price series
    (``search.cut_series``, cheapest first: handed on by ``cut_plans``),
    towards the cheaper and the leaner neighbour, on while each lands on
    the frontier too, at most ``effort.cut_walks`` in all. The proxy's peak is cautious by
    different amounts along the series, so a neighbour the gaps did not
    pick can peak as low for less, and recomputing again from it can lower
    the step above (tests/test_solvers_unseen.py's StableLM). Recomputing
    again starts from the plans walked to, but the fills and descents do
    not see them: a plan walked to that they then beat would move the
    steps they fill, and a budget there could pay more."""
    candidate, series, count = search.candidate, search.cut_series, search.effort.cut_walks
    found = found.plans
    index = {plan_key(decision): k for k, decision in enumerate(series)}
    waiting = [(index[plan_key(c.decision)], step) for c in non_dominated(found)
               if plan_key(c.decision) in index for step in (-1, 1)]
    seen = {k for k, _ in waiting}
    walked: list[Candidate] = []
    while waiting and len(walked) < count:
        k, step = waiting.pop(0)
        k += step
        if not 0 <= k < len(series) or k in seen:
            continue
        seen.add(k)
        walked.append(candidate(series[k]))
        if any(c is walked[-1] for c in non_dominated(found + walked)):
            waiting.append((k, step))
    return Added(walked)

"""Planning under a budget, through the graph's trade-off frontier.

A strategy (the exact ILP or the fast solver) is asked for plans at a
descending series of memory targets below the runtime-optimal plan's peak;
every plan is checked against the exact memory model (the proxy the
strategies optimise can be off either way), and the reference strategies
join in. The plans no other plan beats on both exact peak and time cost
(recompute, plus transfers where values are offloaded) form the frontier.
A budget then takes the cheapest frontier plan whose exact peak fits it;
where the budget falls inside a step of the frontier, the cheapest of the
step's own plans that fits (``step_plans``: that plan and the frontier
plan under it filled towards the cheaper plan above, solve/fills.py's
``step_fills``; the plan above walked down, solve/descents.py, and
swapped, solve/swaps.py; a fixed few per step). The frontier holds filled
plans too: inside its steep steps, and the runtime-optimal plan filled at
its own peak at its top; and, inside the steep steps, their cheaper plans
walked down one recomputed value at a time (solve/descents.py).

Minimum-cut plans join in, chosen in the frontier's gaps, and the cut plans
next to those that land on the frontier are walked to (``_cut_walk``).
Below the lowest peak single recomputation reaches, the lowest plans are
tried again with values recomputed more than once (solve/again.py; the
first two of the lowest that give such a plan): each such plan is kept
only where its exact peak is lower still, so the frontier above that floor
is what it would be without them.

Because neither the frontier nor the plans filled inside its steps depend
on the budget:
* a larger budget never costs more recompute, and never yields a lower
  peak (along a frontier, cheaper means more memory);
* the floor named by BudgetError, the frontier's lowest peak, is always met
  when asked for.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from fxckpt.types import Decision
from fxckpt.solve import descents, fills, swaps
from fxckpt.solve.baselines import (lean_blocks, per_block, per_part, recompute_all,
                                    sqrt_segments)
from fxckpt.solve.cut import NoFiniteCut
from fxckpt.solve.candidates import (Candidate, Evaluate, mask, non_dominated, plan_cost,
                                     plan_key)
from fxckpt.solve.fast import CutPlans, solve_fast
from fxckpt.solve.ilp import Infeasible, Relaxations, solve_ilp
from fxckpt.solve.problem import Problem, to_decision
from fxckpt.solve.again import copy_steps
from fxckpt.solve.select import Fits, select

# solver="auto" sweeps with the fast solver and, on graphs up to this many
# forward values, also aims just under the lowest peak found with the exact
# ILP (``pareto_frontier``). Sweeping with the ILP there instead: on
# the compile suite's 4-layer GPT (387 values) 10 integer programmes took
# 0.34 s of its planning (each solved at the root: no start helps), and
# with steep steps walked down (solve/descents.py) the fast sweep's
# frontier costs what the ILP's does (81 budgets, geometric mean 1.003x on
# that GPT, 0.997x on tiny HF GPT-2, 1.004x on tiny HF Llama; worst budget
# +7%, +14%, +17%, best -7%, -9%, -7%). The ILP under the lowest peak keeps
# the floors, which the fast sweep alone moved (resnet_inplace under
# Inductor 642,288 B against 527,792 B: recomputing again starts from the
# lowest plans); with it they are unchanged (resnet_inplace 562,512 B eager,
# 527,792 B Inductor; zoo GPT 2,464,008 and 2,595,368 B), and that GPT's
# planning fell from 1.37 to 1.09 s.
ILP_MAX_VALUES = 400
# Targets step down geometrically from the runtime-optimal peak.
_TARGET_RATIO = 0.96
_MAX_TARGETS = 16
# Each target's plan is rewritten and simulated exactly, which costs time in
# proportion to the graph: large graphs get fewer targets.
_TARGET_WORK = 40_000
_STALLS_BEFORE_STOP = 3
# Solves spent inside gaps of the frontier wider than a step of the sweep.
_GAP_TARGETS = 4
# Solves spent aiming just under the lowest peak found.
_FLOOR_STEPS = 4
# Lagrangian cut plans (``_cut_plans``): prices per byte spread over the
# values' cost per byte; then more over the band where the plans change,
# fewer on large graphs as each is a minimum cut (48 up to 400 forward
# values, 12 from 1,600).
_CUT_PRICES = 16
_CUT_BAND = 48
_CUT_BAND_WORK = 19_200
# The distinct plans simulated: those between two frontier plans further
# apart in peak than _CUT_GAP, at most _CUT_PLANS, fewer on large graphs as
# each simulation takes time in proportion to the graph (12 up to 533
# forward values, 8 at 800, 2 from 3,200). Which gaps a sweep leaves moves
# with every change to the solvers: at 8, the zoo GPT's cut plan at
# 23.9 MiB and 131.5 us ranked 12th among the gaps after one such change,
# and the frontier fell from it to 147.2 us there.
_CUT_GAP = 0.99
_CUT_PLANS = 12
# Cut plans next to those simulated, walked to while they land on the
# frontier (``_cut_walk``), at most; none beyond _WALK_VALUES forward values
# (the compile suite's 8-layer GPT, 739 values, read 1.18x torch.compile's
# compile time with them and with 4 tries below, against 1.13x without,
# budget planning 1.14 against 1.11 s; see fills._BELOW_VALUES).
_CUT_WALKS = 4
_WALK_VALUES = 600
_CUT_WORK = 6_400
# Besides those, up to _STEEP_PLANS whose proxy peak lies below the frontier
# plans either side of them in cost (fewer on large graphs, none beyond
# 3,200 forward values).
_STEEP_PLANS = 3
# Recomputing again: how many of the lowest plans it starts from (besides the
# region seeds; 0: never recompute again), those that give a plan below the
# lowest peak, among how many of the lowest tried (up to _WALK_VALUES
# forward values; beyond, the lowest _AGAIN_BASES); and the idle stretches
# (fractions of backward's steps) after which a value is recomputed again
# rather than held.
_AGAIN_BASES = 2
_AGAIN_TRIES = 4
_AGAIN_GAPS = (0.0, 0.01, 0.03, 0.1, 0.3)
_REGION_SEEDS = ("per_block", "lean_blocks", "per_part")


def solve_budgeted(problem: Problem, evaluate: Evaluate, budget: int, solver: str, *,
                   runtime_optimal, frontier: list[Candidate] | None = None):
    """(decision, rewritten, timeline) of the plan ``Fits(budget)`` selects
    (solve/select.py) from ``frontier``, built here where not given;
    ``runtime_optimal`` is (decision, rewritten, timeline) of the plan
    without a budget."""
    start = time.perf_counter()
    if frontier is None:
        frontier = pareto_frontier(problem, evaluate, solver, runtime_optimal)
    seconds = time.perf_counter() - start
    top = Candidate(*runtime_optimal, plan_cost(problem, runtime_optimal[0]))
    chosen = select(frontier, Fits(budget), runtime_optimal=top,
                    inside=lambda lower, upper, below: step_plans(problem, evaluate, lower,
                                                                  upper, below))
    decision = replace(chosen.decision, budget_bytes=budget, solve_seconds=seconds)
    return decision, chosen.rewritten, chosen.timeline


def step_plans(problem: Problem, evaluate: Evaluate, lower: Candidate,
               upper: Candidate, below: Candidate | None = None) -> list[Candidate]:
    """What a budget inside the step from ``lower`` to ``upper`` (neighbours
    on the frontier; ``below``, the frontier plan under ``lower``, if any)
    can take besides ``lower``: ``lower`` and ``below`` filled towards
    ``upper`` (fills.step_fills), ``upper`` walked down towards ``lower``
    (descents.step_descents) and swapped (swaps.step_swaps), those no other
    beats, lowest peak first, each cheaper than the one before."""
    return non_dominated(fills.step_fills(problem, evaluate, lower, upper, below)
                         + descents.step_descents(problem, evaluate, lower, upper)
                         + swaps.step_swaps(problem, evaluate, lower, upper))


def _seeds(problem: Problem) -> list[Decision]:
    """The baselines' plans the frontier starts from; a baseline whose
    blocks leave a value backward needs neither saved nor recomputed
    (NoFiniteCut) seeds nothing, the others still do."""
    seeds = []
    for baseline in (recompute_all, per_block, lean_blocks, per_part, sqrt_segments):
        try:
            seeds.append(baseline(problem))
        except NoFiniteCut:
            continue
    return seeds


def pareto_frontier(problem: Problem, evaluate: Evaluate, solver: str, runtime_optimal,
                    *, again_from_seeds: bool = True) -> list[Candidate]:
    """Plans on the exact peak / time cost frontier, lowest peak first.
    ``again_from_seeds``: values recomputed again start from the region
    seeds too (not where a compiler reorders and fuses the copies: Inductor)."""
    strategy = _ilp if solver == "ilp" else _fast
    # Strategies and targets often land on the same plan: each distinct
    # plan is rewritten and simulated once.
    evaluated: dict[tuple, tuple] = {plan_key(runtime_optimal[0]): runtime_optimal[1:]}

    def candidate(decision: Decision) -> Candidate:
        key = plan_key(decision)
        if key not in evaluated:
            evaluated[key] = evaluate(decision)
        return Candidate(decision, *evaluated[key], plan_cost(problem, decision))

    found = [Candidate(*runtime_optimal, plan_cost(problem, runtime_optimal[0]))]
    found += [candidate(d) for d in _seeds(problem)]

    base = problem
    # Cut plans by price, shared by every solve and _cut_plans (all on base
    # or refinements of it).
    cuts = CutPlans()
    # The fast strategy's linear relaxations, each solve going on from the
    # last's basis (the same series whatever the budget).
    relaxations = Relaxations()

    def solved(target: float, proxy: Problem | None = None, how=None) -> Candidate:
        how = how or strategy
        started = time.perf_counter()
        saved, recomputed, offloaded, gap = how(proxy or problem, target, cuts,
                                                relaxations)
        return candidate(to_decision(
            problem, saved, recomputed, offloaded, solver=how.__name__,
            seconds=time.perf_counter() - started, gap=gap, budget_bytes=None))

    target = float(found[0].peak)
    if problem.can_offload.any():
        # Offload costs transfer time, so the runtime-optimal plan (which
        # follows every offload tag) is not the cheapest one: the frontier
        # also reaches up to the cheapest plan, whatever its peak.
        found.append(solved(np.inf))
        target = max(target, found[-1].peak / _TARGET_RATIO)
    lowest, stalls = min(c.peak for c in found), 0
    count = max(4, min(_MAX_TARGETS, _TARGET_WORK // max(problem.n, 1)))
    ratio = _sweep_ratio(target, lowest, count)
    for _ in range(count):
        target *= ratio
        try:
            found.append(solved(target))
        except Infeasible:
            break
        # Follow recompute chains this plan uses from now on: the proxy only
        # grows more cautious, so targets below stay honest.
        problem = problem.refined(mask(problem, found[-1].decision.recomputed))
        # Stalled: aiming below the lowest peak found, and not getting there.
        stalls = stalls + 1 if target < lowest <= found[-1].peak else 0
        lowest = min(lowest, found[-1].peak)
        if stalls >= _STALLS_BEFORE_STOP:
            break
    found += fills.top_filled(problem, candidate, found[0])
    found += _below_lowest(solved, min(c.peak for c in found))
    if solver == "auto" and base.n <= ILP_MAX_VALUES:
        # The exact programme aims under the lowest peak too: the plans
        # recomputing again starts from are the lowest ones.
        found += _below_lowest(lambda target: solved(target, how=_ilp),
                               min(c.peak for c in found))
    if problem is not base:
        found += _below_lowest(lambda target: solved(target, base),
                               min(c.peak for c in found))
    found += _fill_gaps(lambda target: solved(target, base), found, ratio)
    cut, series = _cut_plans(base, candidate, found, cuts)
    found += cut
    walked = _cut_walk(base, candidate, found, series)
    # Recomputing again before the steps are filled: a filled plan peaks
    # about as low as the plan it fills and costs less, so it would take
    # that plan's place among the lowest plans recomputing again starts
    # from, and a plan recomputing more leaves more to recompute again
    # (tiny HF Llama: the floor rose from 110,280 to 118,216 bytes).
    found += _recomputed_again(problem, candidate, found + walked, again_from_seeds)
    # The steep steps are walked down before the fills, and the steps the
    # fills make after them: a filled plan can take a step's place on the
    # frontier, and what walking that step down gave is kept all the same,
    # so the fills only ever add (a random graph of 23 values: the step to
    # the runtime-optimal plan walked down to 86,720 B at no cost; filled
    # first, the step became one to a fill at 86,784 B, which no descent
    # lowered, and a budget of 86,720 B paid 77.5 us).
    before = descents.step_keys(found)
    walked_down = descents.steps_descended(problem, candidate, found)
    found += fills.steps_filled(problem, candidate, found)
    found += walked_down + descents.steps_descended(problem, candidate, found, before)
    # The cut plans walked to join the frontier after the fills and
    # descents (``_cut_walk``).
    return non_dominated(found + walked)


def _sweep_ratio(top: float, lowest: int, count: int) -> float:
    """The step between targets: ``_TARGET_RATIO``, or a larger step where
    that many targets would not reach down from ``top`` to the lowest peak
    the reference plans reach (when the runtime-optimal plan saves
    everything, the peaks between run from the step's full activations
    down to per-block checkpointing's)."""
    if top <= 0 or lowest <= 0 or lowest >= top:
        return _TARGET_RATIO
    return min(_TARGET_RATIO, (lowest / top) ** (1.0 / count))


def _fill_gaps(solved, found: list[Candidate], ratio: float) -> list[Candidate]:
    """Plans aimed inside the widest gaps of the frontier: where two
    neighbouring frontier plans lie further apart than a step of the sweep
    (the strategy's proxy reached past the targets between them), a budget
    between them would pay the lower plan's recompute. Each solve aims at
    the gap's geometric middle, up to ``_GAP_TARGETS`` solves."""
    added: list[Candidate] = []
    tried: set[int] = set()
    for _ in range(_GAP_TARGETS):
        frontier = non_dominated(found + added)
        gaps = [(lower.peak / upper.peak, lower.peak, upper.peak)
                for lower, upper in zip(frontier, frontier[1:])
                if lower.peak < upper.peak * ratio]
        gaps = [g for g in gaps if int((g[1] * g[2]) ** 0.5) not in tried]
        if not gaps:
            break
        _, low, high = min(gaps)
        target = int((low * high) ** 0.5)
        tried.add(target)
        try:
            added.append(solved(float(target)))
        except Infeasible:
            continue
    return added


def _cut_plans(problem: Problem, candidate, found: list[Candidate],
               cuts: CutPlans) -> tuple[list[Candidate], list[Decision]]:
    """Minimum-cut plans at prices per byte spread over the values' own cost
    per byte (see fast.cut_plan): plans chosen by saved bytes, not by the
    proxy's peak, which can be cautious about a whole family of plans. On
    tiny HF Llama and GPT-2 they lie in gaps the proxy-guided solves left:
    torch's own plan at activation_memory_budget=0.5, made bitwise (dropout
    replayed from saved generator states), peaks at 130,632 B costing
    5.75 us (GPT-2: 219,400 B, 7.74 us) where the frontier offered no plan
    that cheap below 134,792 B (220,057 B); a cut plan gives 128,648 B at
    5.16 us (218,248 B at 4.48 us). Only plans whose recompute cost falls
    between two frontier plans more than 1% apart in peak are simulated,
    widest gaps first, at most ``_CUT_PLANS`` (fewer on large graphs).
    Besides those, up to ``_STEEP_PLANS`` whose proxy peak lies furthest
    below the frontier plan just cheaper than them: where the frontier's
    cost drops steeply over a narrow band of peaks no gap is wide, yet such
    a plan can land below both neighbours (8-layer compile-suite GPT: from
    107.5 to 15.7 us within 0.6% of peak, where a cut plan gives
    1,839,304 B at 19.2 us, 2% below both). Answers those simulated, and
    the series of distinct cut plans not found before, cheapest first (for
    ``_cut_walk``)."""
    ratio = problem.cost / np.maximum(problem.size, 1.0)
    ratio = ratio[(problem.cost > 0) & (problem.size > 0)]
    if not len(ratio):
        return [], []
    low, high = np.quantile(ratio, [0.01, 0.99])
    prices = list(np.geomspace(max(low, 1e-30) / 10, max(high, low, 1e-30) * 10, _CUT_PRICES))
    plans = {lam: cuts(problem, float(lam)) for lam in prices}
    # The plans change within a narrower band of prices: as many again
    # spread over the band.
    saved_bytes = [float(problem.size[plans[lam][0]].sum()) for lam in prices]
    changes = [k for k in range(len(prices) - 1) if saved_bytes[k] != saved_bytes[k + 1]]
    if changes:
        count = max(_CUT_PRICES // 2, min(_CUT_BAND, _CUT_BAND_WORK // max(problem.n, 1)))
        band = np.geomspace(prices[changes[0]], prices[changes[-1] + 1], count + 2)[1:-1]
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
            if below > width and below >= 1.0 / _CUT_GAP:
                steep.append((-below, len(steep), decision))
        if dearer and width < 1.0 / _CUT_GAP:
            continue
        ranked.append((-width, len(ranked), decision))
    count = max(2, min(_CUT_PLANS, _CUT_WORK // max(problem.n, 1)))
    chosen = [decision for _, _, decision in sorted(ranked)[:count]]
    keys = {plan_key(decision) for decision in chosen}
    extra = min(_STEEP_PLANS, _CUT_WORK // max(2 * problem.n, 1))
    chosen += [decision for _, _, decision in sorted(steep)
               if plan_key(decision) not in keys][:extra]
    return [candidate(decision) for decision in chosen], series


def _cut_walk(problem: Problem, candidate, found: list[Candidate],
              series: list) -> list[Candidate]:
    """Cut plans next to those on the frontier in the price series
    (``series``, cheapest first: ``_cut_plans``' second answer), towards
    the cheaper and the leaner neighbour, on while each lands on the
    frontier too, at most ``_CUT_WALKS`` in all (none beyond
    ``_WALK_VALUES`` forward values). The proxy's peak is cautious by
    different amounts along the series, so a neighbour the gaps did not
    pick can peak as low: stablelm (hidden 64, sequence 16), where the gaps
    picked a cut plan at 379,912 B costing 4.253 us, and the next cheaper
    one peaks at 379,912 B too, costing 3.277 us; recomputing again from it
    gave 373,256 B at 7.055 us, where the lowest plans gave 372,232 B at
    8.491 us. Recomputing again starts from the plans walked to, but the
    fills and descents do not see them: a plan walked to that they then
    beat moves the steps they fill (tiny HF Qwen2, hidden 32: one budget
    went from 1.00x the exact programme's to 1.06x)."""
    count = _CUT_WALKS if problem.n <= _WALK_VALUES else 0
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
    return walked


def _recomputed_again(problem: Problem, candidate, found: list[Candidate],
                      from_seeds: bool = True) -> list[Candidate]:
    """Plans below the lowest peak found, where the lowest plans recompute
    values again after idle stretches (solve/again.py), for a sweep of
    stretch lengths. Each is checked by the exact memory model; only those
    below the single-recompute floor are kept: they cost more recompute than
    the plans they start from."""
    if _AGAIN_BASES <= 0:
        return []
    lowest = min(c.peak for c in found)
    # A base the exact model cannot tell from one taken before (the same
    # peak and cost) is not started from again: on GPTs per_block and
    # lean_blocks differ by one view, and so do their plans recomputing
    # again, which tie too (58-layer GPT: two evaluations, 0.3 s, saved).
    distinct: dict[tuple, Candidate] = {}
    for base in sorted(found, key=lambda c: (c.peak, c.cost)):
        distinct.setdefault((base.peak, base.cost), base)
    # Recomputing again keeps the base's saved set, so no plan made from it
    # peaks below what the base holds as backward starts (the schedule
    # model's held_at_backward, where it evaluated the base): a base holding
    # the lowest peak already is not started from (58-layer GPT: per_part,
    # 15.6 MB saved against a lowest peak of 6.6 MB).
    usable = [base for base in distinct.values()
              if getattr(base.timeline, "held_at_backward", 0) < lowest]
    bases = usable[:_AGAIN_TRIES if problem.n <= _WALK_VALUES else _AGAIN_BASES]
    among_lowest = {id(c) for c in bases}
    # The region seeds too: their recompute chains stay inside a block or
    # submodule, so copies made again are short-lived, and the lowest plan
    # after recomputing again need not be among the lowest before.
    bases += [c for c in usable if from_seeds and c.decision.solver in _REGION_SEEDS
              and id(c) not in among_lowest]
    tried: set[tuple] = set()
    kept: list[Candidate] = []
    # A base whose first plan recomputing again ties an earlier base's first
    # (the same exact peak and cost) is not swept further: it behaves as
    # that base (per_block and lean_blocks on GPTs, whose saved sets differ
    # by a view and its base, and whose plans then tie at every stretch; 16
    # layers: 2 of 12 evaluations; 8 layers: 3 of 15).
    firsts: set[tuple] = set()
    # Of the lowest plans, the first _AGAIN_BASES that give a plan below
    # the lowest peak are swept (the region seeds all are): a low plan that
    # recomputes little has little to recompute again (tiny HF GPT-NeoX,
    # hidden 32: the second lowest plan, at 111,752 B, gave none, and the
    # third, a cut plan at 112,008 B, gave the floor at 5.166 us where the
    # lowest alone gave it at 8.146 us).
    productive = 0
    for base in bases:
        if id(base) in among_lowest and productive >= _AGAIN_BASES:
            continue
        before = len(kept)
        recomputed = mask(problem, base.decision.recomputed)
        first = True
        for fraction in _AGAIN_GAPS:
            again = tuple(sorted((problem.names[i], s) for i, s in
                                 copy_steps(problem, recomputed, fraction).items()))
            if not again or (base.decision.recomputed, again) in tried:
                continue
            tried.add((base.decision.recomputed, again))
            made = candidate(replace(base.decision, again=again,
                                     solver=f"{base.decision.solver}+again"))
            if made.peak < lowest:
                kept.append(made)
            if first:
                first = False
                if (made.peak, made.cost) in firsts:
                    break
                firsts.add((made.peak, made.cost))
        productive += id(base) in among_lowest and len(kept) > before
    return kept


def _below_lowest(solved, lowest: int) -> list[Candidate]:
    """Plans aimed just under the lowest peak found, until none is lower: the
    geometric targets step over floors between them, and the floor
    BudgetError names must be the lowest the strategy can reach.

    The frontier calls it twice: with the refined proxy, then with the
    proxy as first built. Refinement makes the proxy more cautious (it
    follows recompute chains some plans used), which can hide a lower floor
    from it; each candidate's peak is what ``evaluate`` measures, so an
    optimistic proxy cannot put a false plan on the frontier."""
    found: list[Candidate] = []
    for _ in range(_FLOOR_STEPS):
        try:
            found.append(solved(float(lowest - 1)))
        except Infeasible:
            break
        if found[-1].peak >= lowest:
            break
        lowest = found[-1].peak
    return found


def _ilp(problem, target, cuts, relaxations):
    return solve_ilp(problem, target)


def _fast(problem, target, cuts, relaxations):
    return (*solve_fast(problem, target, cuts, relaxations), None)


_ilp.__name__, _fast.__name__ = "ilp", "fast"

"""The fast strategy: LP rounding and Lagrangian min-cuts, then a greedy fill.

Two sources of candidate plans, the cheapest feasible one wins:
* the ILP's linear relaxation (HiGHS solves it in a fraction of a second even
  on 10,000-node graphs; a frontier's solves each go on from the last one's
  basis, ilp.Relaxations), rounded at several thresholds: values saved above
  the threshold are saved, backward recomputes what it then needs, and
  values it cannot recompute are saved too;
* for a price per byte ``lam``, the minimum cut with saving weight lam * size
  and recompute weight cost (+ a penalty on user preferences) is the
  cheapest plan at that price; bisecting on lam finds the cheapest such plan
  whose proxy peak fits the budget.
Rounded and cut plans usually leave room under the budget: the greedy fill
then saves recomputed values back, best recompute cost removed per byte of
peak added first, for at most ``_FILL_ROUNDS`` rounds (also values that cost
nothing to recompute but end a costly chain backward would recompute for
them; where no single value helps, all the recomputed readers of a costly
value that cannot be saved, such as an op with several outputs). Where no candidate fits but one is
over by at most ``_REPAIR_REACH``, it is repaired first: values live at the
proxy's peak are recomputed while it is over. Last, on graphs of
up to ``_POLISH_MAX_VALUES`` forward values the exact programme runs, its
search bounded by ``_POLISH_NODES`` branch-and-bound nodes: there it costs
little, and the floor (the lowest plan) is then exact.

Every bound is a count of work, never a clock: the same problem and budget
give the same plan whatever the machine's load.

Offload (values tagged *_CPU_OFFLOAD) enters each candidate after the fact:
a plan over the budget offloads saved values live at its peak, largest
first, while it is over; the fill then also weighs keeping an offloaded value on
the device (saves its transfer) and offloading a recomputed one (saves its
recompute, costs its transfer).
"""

from __future__ import annotations

import heapq

import numpy as np

from fxckpt.solve.cut import min_cut
from fxckpt.solve.ilp import Infeasible, Relaxations, solve_ilp
from fxckpt.solve.problem import (Problem, computed_after_saving, computed_in_backward,
                                  peak_of)

_BISECTION_STEPS = 24
_FILL_CANDIDATES = 64
# Releasing moves weighed per round (``_released``): one per op with several
# outputs backward recomputes, hundreds on deep models.
_RELEASE_CANDIDATES = 16
# Values free to recompute whose saving spares a costly chain, weighed per
# round besides the costly values (``_chain_ends``): 4 gives plans as cheap
# as 8 or 16 do (tiny HF GPT-2: 1.03x the exact programme's cost;
# `fxckpt bench --suite solvers`). Finding them walks every free value
# backward reads each round, so graphs of more than _END_MAX_VALUES forward
# values skip it, where it costs planning time and finds no cheaper plan.
_END_CANDIDATES = 4
_END_MAX_VALUES = 3_200
_THRESHOLDS = (0.5, 0.3, 0.7, 0.1, 0.9, 0.01)
_FILL_ROUNDS = 24
# Moves taken in one round of the fill, at most (``_batched``).
_FILL_BATCH = 8
# The exact programme's root and a short search, on graphs of up to 100
# values only: the root's cuts are what the rounded plans lack, and on small
# graphs they cost little. Larger graphs skip it: with the cut plan filled
# their frontiers stay within 3% of the exact programme's
# (`fxckpt bench --suite solvers`), and polishing them slows planning past
# what the compile suite allows (`fxckpt bench --suite compile`).
_POLISH_MAX_VALUES = 100
_POLISH_NODES = 200
# The cut plan is filled besides the cheapest candidate on graphs of up to
# this many values (``solve_fast``): a fill weighs moves in proportion to
# the graph, and on larger graphs filling the cut plan rather than the next
# cheapest costs planning time for the same plan (`fxckpt bench --suite solvers`).
_CUT_FILL_MAX_VALUES = 3_200
# A plan over the budget by at most _REPAIR_REACH is repaired (``repaired``)
# when no candidate fits, in at most _REPAIR_ROUNDS rounds.
_REPAIR_REACH = 0.02
_REPAIR_ROUNDS = 8
# Near misses repaired besides the candidates that fit (``_repaired_misses``):
# the cheapest only, since repairing more finds the same frontiers on the
# 4- and 8-layer GPTs and costs planning time (`fxckpt bench --suite compile`).
_REPAIR_MISSES = 1
# Values weighed per round when repairing a near miss (``repaired``'s
# ``width``; where nothing fits, _FILL_CANDIDATES): a narrow repair is a
# fraction of the cost of weighing 64 and finds the same plans, the 8-layer
# GPT's frontier staying within 5% of the exact programme's
# (`fxckpt bench --suite solvers`).
_MISS_WIDTH = 16


def solve_fast(problem: Problem, budget: float, cuts: "CutPlans | None" = None,
               relaxations: Relaxations | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plan within ``budget`` under the memory proxy; return (saved,
    recomputed, offloaded). ``cuts``: cut plans already found for this problem
    or a refinement of it (CutPlans), kept there; ``relaxations``: the
    series of linear relaxations this solve continues (ilp.Relaxations)."""
    candidates = _rounded_plans(problem, budget, relaxations or Relaxations())
    if problem.n <= _POLISH_MAX_VALUES:
        try:
            candidates.append(solve_ilp(problem, budget, node_limit=_POLISH_NODES)[:3])
        except Infeasible:
            pass
    cut = None
    try:
        cut = _with_offload(problem, budget, *_cut_plan(problem, budget, cuts or CutPlans()))
        candidates.append(cut)
    except Infeasible:
        pass
    price = objective_of(problem)
    peaks = [problem.peak(*c) for c in candidates]
    feasible = [c for c, peak in zip(candidates, peaks) if peak <= budget]
    over = [(peak, c) for c, peak in zip(candidates, peaks) if peak > budget]
    feasible += _repaired_misses(problem, budget, price, over, feasible)
    if not feasible:
        raise Infeasible("no plan fits the budget under the memory model")
    feasible.sort(key=lambda c: price(*c))
    # Two plans are filled: the cheapest, and on graphs up to
    # _CUT_FILL_MAX_VALUES values the cut plan whatever its price: it saves
    # by bytes, so the fill has more room to spend there and often ends
    # cheaper than the filled cheapest (`fxckpt bench --suite solvers`);
    # beyond that the next cheapest. They are often the same plan, filled
    # once. Filling more rounded plans costs planning time for rare gains.
    if problem.n <= _CUT_FILL_MAX_VALUES and any(c is cut for c in feasible):
        chosen = [feasible[0], cut]
    else:
        chosen = feasible[:2]
    filled = [fill(problem, budget, *c) for c in _distinct(chosen)]
    return min(filled, key=lambda c: (price(*c), problem.peak(*c)))


def _repaired_misses(problem: Problem, budget: float, price, over: list,
                     feasible: list) -> list:
    """Candidates just over the budget (``over``: (proxy peak, plan) of each
    candidate over it), repaired (``repaired``): where none fits, the one
    that peaks lowest; else the ``_REPAIR_MISSES`` cheapest of those cheaper
    than every one that fits. A rounded plan a fraction of a percent over
    the budget can be a better start than the plans that fit: repaired and
    filled, it can end nearer the exact programme's cost
    (`fxckpt bench --suite solvers`)."""
    if not feasible:
        if not over:
            return []
        fixed = repaired(problem, budget, min(over, key=lambda pc: pc[0])[1])
        return [fixed] if fixed is not None else []
    cheapest = min(price(*c) for c in feasible)
    misses = [c for c in _distinct([c for _, c in over]) if price(*c) < cheapest]
    misses.sort(key=lambda c: price(*c))
    fixed = (repaired(problem, budget, c, _MISS_WIDTH) for c in misses[:_REPAIR_MISSES])
    return [c for c in fixed if c is not None]


def repaired(problem: Problem, budget: float, plan, width: int = _FILL_CANDIDATES) -> tuple | None:
    """A plan within ``budget`` made from ``plan``, over it by at most
    ``_REPAIR_REACH``, by recomputing saved values live at the proxy's peak
    (``lowered``, one move a round); None if ``_REPAIR_ROUNDS`` rounds do
    not get there. The rounded and cut plans can all miss, by a fraction of
    a percent, a budget the exact programme meets, and repairing one still
    gives a plan there. ``width``: the values weighed each round, those
    freeing most bytes per recompute cost."""
    if problem.peak(*plan) > budget * (1 + _REPAIR_REACH):
        return None
    for _ in range(_REPAIR_ROUNDS):
        if problem.peak(*plan) <= budget:
            return plan
        plan = lowered(problem, plan, width)
        if plan is None:
            return None
    return plan if problem.peak(*plan) <= budget else None


def lowered(problem: Problem, plan, width: int = _FILL_CANDIDATES) -> tuple | None:
    """``plan`` (saved, recomputed, offloaded) with one saved value live at
    the proxy's peak recomputed instead, the move lowering that peak most
    per unit of the strategies' objective added (recompute, with penalties
    where a move overrides a user preference, and transfers: ``price``);
    the value simply dropped from the saved set, or dropped with its inputs
    saved instead. None if no move lowers it. ``width``: the values
    weighed, those freeing most bytes per recompute cost."""
    live = problem.stage_live(*plan)
    price = objective_of(problem)
    peak, cost = float(live.max()), price(*plan)
    best = None
    for trial in lowering_moves(problem, plan, width, live):
        drop = peak - float(problem.moved_live(live, plan, trial).max())
        if drop <= 0:
            continue
        score = drop / (max(price(*trial) - cost, 0.0) + 1e-12)
        if best is None or score > best[0]:
            best = (score, trial)
    return None if best is None else best[1]


def lowering_moves(problem: Problem, plan, width: int = _FILL_CANDIDATES, live=None):
    """The plans ``lowered`` weighs, one saved value live at the proxy's
    peak recomputed instead (simply dropped, or with its inputs saved
    instead), whether or not they lower the peak: the ``width`` values
    freeing most bytes per recompute cost. ``live``: the plan's stage
    bytes (Problem.stage_live), when the caller has them."""
    saved, recomputed, offloaded = plan
    if live is None:
        live = problem.stage_live(saved, recomputed, offloaded)
    at_peak = np.flatnonzero(saved & (problem.stage_saved[int(live.argmax())] > 0)
                             & problem.can_recompute & (problem.size > 0))
    at_peak = sorted(at_peak, key=lambda i: -problem.size[i] / (problem.cost[i] + 1e-12))
    for i in at_peak[:width]:
        for trial in (_unsaved(problem, saved, i, inputs) for inputs in (False, True)):
            if trial is not None:
                # What must be offloaded when saved is, if newly saved.
                yield (*trial, (offloaded | problem.must_offload) & trial[0])


def saving_moves(problem: Problem, plan):
    """The plans one move of the fill from ``plan`` (saved, recomputed,
    offloaded): a recomputed value saved back (on the device or offloaded),
    an offloaded one kept on the device, or all the recomputed readers of a
    costly value that cannot be saved itself (``_moves``, ``_released``),
    whether or not they fit a budget or save time."""
    for _, trial in _moves(problem, *plan):
        yield trial
    for _, trial in _moves(problem, *plan, releasing=True):
        yield trial


def _unsaved(problem: Problem, saved: np.ndarray, i: int, inputs: bool):
    """(saved, recomputed) with value ``i`` no longer saved (``inputs``: its
    inputs saved instead, through inputs that cannot be saved); None if no
    runnable plan results."""
    trial = saved.copy()
    trial[i] = False
    if inputs:
        indptr, indices = problem.input_lists
        waiting, seen = list(indices[indptr[i]:indptr[i + 1]]), set()
        while waiting:
            j = waiting.pop()
            if j in seen:
                continue
            seen.add(j)
            if problem.can_save[j]:
                trial[j] = True
            elif problem.can_recompute[j]:
                waiting.extend(indices[indptr[j]:indptr[j + 1]])
    return runnable(problem, trial)


def _distinct(plans: list) -> list:
    """``plans`` without repeats, in order."""
    seen: set = set()
    kept = []
    for plan in plans:
        key = tuple(np.asarray(mask, dtype=bool).tobytes() for mask in plan)
        if key not in seen:
            seen.add(key)
            kept.append(plan)
    return kept


def objective_of(problem: Problem):
    """The objective the strategies minimise, as a function of a plan's
    masks: recompute (with preference penalties) and transfer time. Its
    weights are computed once (the fill prices thousands of moves)."""
    recompute, penalty, transfer = _recompute_weight(problem), _save_penalty(problem), \
        problem.transfer

    def objective(saved: np.ndarray, recomputed: np.ndarray, offloaded: np.ndarray) -> float:
        return float(recompute[recomputed].sum() + penalty[saved].sum()
                     + transfer[offloaded].sum())
    return objective


def _rounded_plans(problem: Problem, budget: float, relaxations: Relaxations) -> list:
    try:
        fraction_saved, fraction_offloaded = relaxations(problem, budget)
    except Infeasible:
        return []
    plans = []
    for threshold in _THRESHOLDS:
        plan = runnable(problem, fraction_saved >= threshold)
        if plan is not None:
            saved, recomputed = plan
            offloaded = saved & problem.can_offload & (fraction_offloaded >= threshold)
            plans.append(_with_offload(problem, budget, saved, recomputed, offloaded))
    return plans


def _with_offload(problem: Problem, budget: float, saved: np.ndarray,
                  recomputed: np.ndarray, offloaded: np.ndarray | None = None):
    """The plan with what MUST be offloaded offloaded and, while it is over
    the budget, saved values live at its peak offloaded, largest first."""
    offloaded = np.zeros(problem.n, dtype=bool) if offloaded is None else offloaded.copy()
    offloaded |= saved & problem.must_offload
    movable = saved & problem.can_offload
    while movable[~offloaded].any():
        live = problem.stage_live(saved, recomputed, offloaded)
        if live.max() <= budget:
            break
        at_peak = problem.stage_saved[int(live.argmax())] > 0
        choices = np.flatnonzero(movable & ~offloaded & at_peak)
        if not len(choices):
            break
        offloaded[choices[np.argmax(problem.size[choices])]] = True
    return saved, recomputed, offloaded


def runnable(problem: Problem, saved: np.ndarray) -> tuple | None:
    """(saved, recomputed) of a plan saving ``saved`` made runnable: saved
    only where allowed, values backward would have to recompute but cannot
    saved too, saved values nothing reads dropped; None if none runs."""
    saved = saved & problem.can_save
    while True:
        recomputed = computed_in_backward(problem, saved)
        stuck = recomputed & ~problem.can_recompute
        if not stuck.any():
            return saved & (problem.needed | _read_by(problem, recomputed)), recomputed
        if (stuck & ~problem.can_save).any():
            return None
        saved = saved | stuck


def cut_plan(problem: Problem, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(saved, recomputed) of the minimum cut at price ``lam`` per byte
    saved: the cheapest plan in recompute plus ``lam`` times saved bytes
    (generator states of random recomputes included)."""
    saved = min_cut(problem, lam * problem.size + 1e-12,
                    _recompute_weight(problem) + lam * problem.replay)
    return saved, computed_in_backward(problem, saved)


class CutPlans:
    """``cut_plan`` by price, remembered for one problem and its
    refinements (Problem.refined changes the proxy's stage rows, never what
    a cut plan is). The bisections of a frontier's solves probe many of the
    same prices, so each is cut once. The plans are read-only."""

    def __init__(self) -> None:
        self._plans: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, problem: Problem, lam: float) -> tuple[np.ndarray, np.ndarray]:
        plan = self._plans.get(lam)
        if plan is None:
            plan = cut_plan(problem, lam)
            for mask in plan:
                mask.flags.writeable = False
            self._plans[lam] = plan
        return plan


def _cut_plan(problem: Problem, budget: float, cuts: CutPlans):
    """The cheapest Lagrangian cut plan whose proxy peak fits the budget."""
    low, high = 0.0, 1.0
    best = cuts(problem, high)
    while problem.peak(*best) > budget:
        if high > 1e18:
            raise Infeasible("no cut plan fits the budget under the memory model")
        low, high = high, high * 1e3
        best = cuts(problem, high)
    for _ in range(_BISECTION_STEPS):
        mid = np.sqrt(max(low, 1e-30) * high) if low > 0 else high / 1e3
        candidate = cuts(problem, mid)
        if problem.peak(*candidate) <= budget:
            high, best = mid, candidate
        else:
            low = mid
        if low > 0 and high / low < 1.01:
            break
    return best


def _penalty(problem: Problem) -> float:
    return 10.0 * (float(problem.cost.sum()) + 1e-9) + 1.0


def _recompute_weight(problem: Problem) -> np.ndarray:
    return problem.cost + _penalty(problem) * problem.prefer_save + 1e-12


def _save_penalty(problem: Problem) -> np.ndarray:
    return _penalty(problem) * problem.prefer_recompute


def fill(problem: Problem, budget: float, saved: np.ndarray, recomputed: np.ndarray,
         offloaded: np.ndarray):
    """Trade memory the budget leaves for time while it allows. Each round
    scores the most promising moves (save a recomputed value back, on the
    device or offloaded; keep an offloaded value on the device) by time saved
    per byte of peak added, and takes the best that fits, then the next
    best saving moves with it while the plan still fits and costs less (at
    most ``_FILL_BATCH`` a round: a model with a dropout per sublayer has
    hundreds of small masks worth saving, and one a round would run every
    fill to its last round)."""
    plan = (saved.copy(), recomputed.copy(), offloaded.copy())
    price = objective_of(problem)
    objective = price(*plan)
    live = problem.stage_live(*plan)
    for _ in range(_FILL_ROUNDS):
        ranked = _ranked_moves(problem, budget, price, objective, plan, live,
                               _moves(problem, *plan))
        if not ranked:
            # Only then the releasing moves (``_released``): there are as
            # many as ops with several outputs, and weighing them every
            # round makes each fill much slower (`fxckpt bench --suite compile`).
            ranked = _ranked_moves(problem, budget, price, objective, plan, live,
                                   _moves(problem, *plan, releasing=True))
        if not ranked:
            break
        plan, live, objective = _batched(problem, budget, price, ranked, plan[2])
    return plan


def _ranked_moves(problem: Problem, budget: float, price, objective: float, plan: tuple,
                  live: np.ndarray, moves) -> list:
    """[(score, position, plan, stage bytes, objective, members saved)] of
    the moves from ``plan`` (its stage bytes ``live``) that save time and
    fit the budget, best first: time saved per byte of peak added (ties in
    the order weighed)."""
    ranked = []
    peak = peak_of(live)
    for members, trial in moves:
        trial_objective = price(*trial)
        gain = objective - trial_objective
        if gain <= 0:
            continue
        trial_live = problem.moved_live(live, plan, trial)
        trial_peak = peak_of(trial_live)
        if trial_peak > budget:
            continue
        score = gain / (max(trial_peak - peak, 0.0) + 1.0)
        ranked.append((score, len(ranked), trial, trial_live, trial_objective, members))
    ranked.sort(key=lambda r: (-r[0], r[1]))
    return ranked


def _batched(problem: Problem, budget: float, price, ranked: list, offloaded: np.ndarray):
    """(plan, stage bytes, objective) after the best move, and after each
    next best saving move (up to ``_FILL_BATCH`` in all) that, taken with
    those already taken, still fits and costs less. ``offloaded``: the round's
    plan's, so that a move adds only the offload it makes (a value the best
    move keeps on the device stays there)."""
    _, _, plan, live, objective, taken = ranked[0]
    taken = set(taken)
    batch = 1
    for _, _, trial, _, _, members in ranked[1:]:
        if batch >= _FILL_BATCH:
            break
        if not members or taken & set(members):
            continue
        saved = plan[0].copy()
        saved[list(members)] = True
        recomputed = computed_in_backward(problem, saved)
        saved &= problem.needed | _read_by(problem, recomputed)
        together = (saved, recomputed, (plan[2] | (trial[2] & ~offloaded)) & saved)
        together_live = problem.moved_live(live, plan, together)
        together_peak = peak_of(together_live)
        together_objective = price(*together)
        if together_peak <= budget and together_objective < objective:
            plan, live, objective = together, together_live, together_objective
            taken |= set(members)
            batch += 1
    return plan, live, objective


def _moves(problem: Problem, saved: np.ndarray, recomputed: np.ndarray,
           offloaded: np.ndarray, *, releasing: bool = False):
    """(values saved, plan) one step from the given plan that may cost less
    time: a recomputed value saved back (on the device or offloaded), an
    offloaded one kept on the device (no value saved); or, ``releasing``,
    the recomputed readers of a value that is not to be saved itself
    (``_released``). Besides the costly recomputed values, a few that cost
    nothing but end a costly chain (``_chain_ends``)."""
    if releasing:
        candidates = _released(problem, recomputed)
    else:
        movable = recomputed & problem.can_save & ~problem.prefer_recompute
        candidates = [(i, (i,)) for i in np.flatnonzero(movable & (problem.cost > 0))]
    candidates.sort(key=lambda c: -problem.cost[c[0]] / (problem.size[list(c[1])].sum() + 1.0))
    candidates = candidates[:_RELEASE_CANDIDATES if releasing else _FILL_CANDIDATES]
    if not releasing and problem.n <= _END_MAX_VALUES:
        candidates += _chain_ends(problem, recomputed, movable)
    # Each move's recompute follows from the plan's (computed_after_saving)
    # where the plan recomputes exactly what its saved values leave.
    whole = bool(candidates) and np.array_equal(recomputed, computed_in_backward(problem, saved))
    for _, members in candidates:
        trial = saved.copy()
        trial[list(members)] = True
        trial_recomputed = computed_after_saving(problem, recomputed, members) if whole \
            else computed_in_backward(problem, trial)
        # Inputs of a value no longer recomputed may no longer need saving.
        trial &= problem.needed | _read_by(problem, trial_recomputed)
        kept = offloaded & trial
        if not problem.must_offload[list(members)].any():
            yield members, (trial, trial_recomputed, kept)
        if len(members) == 1 and problem.can_offload[members[0]]:
            moved = kept.copy()
            moved[members[0]] = True
            yield members, (trial, trial_recomputed, moved)
    if releasing:
        return
    for i in np.flatnonzero(offloaded & ~problem.must_offload)[:_FILL_CANDIDATES]:
        kept = offloaded.copy()
        kept[i] = False
        yield (), (saved, recomputed, kept)


def _chain_ends(problem: Problem, recomputed: np.ndarray, movable: np.ndarray
                ) -> list[tuple[int, tuple]]:
    """(i, (i,)) for values that cost nothing to recompute (views, ops the
    profile prices at 0) but that backward reads, where saving one spares
    costly recompute: the recomputed values only it needs, up the chain it
    is made from (tiny HF GPT-2: a free ``mul`` whose recompute recomputes
    the MLP's matmul behind it, which the exact programme saves instead).
    Their own cost would never rank them. At most ``_END_CANDIDATES``, the
    most recompute spared per byte first. Forward values are numbered in
    program order, so taking the highest-numbered first weighs a value
    only after every reader of it on the chain."""
    indptr, indices = problem.reader_lists
    found = []
    for i in np.flatnonzero(movable & (problem.cost <= 0) & problem.needed):
        spared, only = 0.0, {int(i)}
        waiting = [-int(p) for p in problem.parents[i] if recomputed[p]]
        heapq.heapify(waiting)
        while waiting:
            p = -heapq.heappop(waiting)
            if p in only or problem.needed[p]:
                continue
            readers = indices[indptr[p]:indptr[p + 1]]
            if all(r in only for r in readers[recomputed[readers]]):
                only.add(p)
                spared += problem.cost[p]
                for q in problem.parents[p]:
                    if recomputed[q]:
                        heapq.heappush(waiting, -int(q))
        if spared > 0:
            found.append((spared / (problem.size[i] + 1.0), int(i)))
    found.sort(reverse=True)
    return [(i, (i,)) for _, i in found[:_END_CANDIDATES]]


def _released(problem: Problem, recomputed: np.ndarray) -> list[tuple[int, tuple]]:
    """(j, the recomputed values reading j) for each costly recomputed j that
    is not to be saved itself: saving all its readers ends its recompute.
    An op with several outputs (max_pool2d_with_indices, native_layer_norm,
    batch norm) holds a tuple that cannot be saved, and its outputs, getitems,
    cost nothing to recompute: saving one value at a time never ends the
    op's recompute, which leaves a fill on the zoo CNN far costlier than
    the exact programme (`fxckpt bench --suite solvers`)."""
    indptr, indices = problem.reader_lists
    found = []
    for j in np.flatnonzero(recomputed & (problem.cost > 0)
                            & (~problem.can_save | problem.prefer_recompute)):
        readers = indices[indptr[j]:indptr[j + 1]]
        readers = readers[recomputed[readers]]
        if len(readers) and (problem.can_save[readers] & ~problem.prefer_recompute[readers]).all():
            found.append((int(j), tuple(int(k) for k in readers)))
    return found


def _read_by(problem: Problem, computed: np.ndarray) -> np.ndarray:
    """Values some value in ``computed`` reads."""
    edges = problem.input_edges
    read = np.zeros(problem.n, dtype=bool)
    read[edges.col[computed[edges.row]]] = True
    return read

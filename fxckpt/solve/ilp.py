"""The exact strategy: a mixed-integer programme solved by HiGHS (solve/highs.py).

Variables, per forward value i: s_i = 1 if saved, r_i = 1 if backward computes
it; per value tagged *_CPU_OFFLOAD, o_i = 1 if it is saved in host memory.
Constraints:
  s_i + r_i >= 1                 backward reads i                     (needed)
  r_i - s_j - r_j <= 0           recomputing i needs each input j     (closure)
  s_i + r_i <= 1                 never both
  o_i <= s_i                     only a saved value is offloaded
  o_i >= s_i                     where MUST_CPU_OFFLOAD
  s_i <= can_save_i, r_i <= can_recompute_i                          (MUST_*)
  base_k + sum_i size_i (A_ki (s_i - o_i) + B_ki (r_i + o_i))
         + replay . r <= budget                                       (each stage k*)
(A: a saved value is live at stage k; B: a value backward computes, or
reloads, is live at stage k. *The integer programme keeps only the stages
no other stage's bytes bound, Problem.binding_stages.) The linear
relaxation writes the rows as running totals, one variable m_k per stage:
m_k = m_{k-1} + (row k - row k-1) . x, m_k <= budget - base_k. A value is
live over one or two runs of stages, so the differences have a few entries
per value where the rows have one per stage it is live
(Problem.stage_steps): the same programme with a tenth of the entries,
which HiGHS solves faster. The integer programme keeps the rows whole,
since HiGHS's branch and bound runs slower on the totals (the ILP's
frontier time: `fxckpt bench --suite solvers`).
Objective: sum_i cost_i r_i + sum_i transfer_i o_i
           + penalty * (PREFER_SAVE / PREFER_RECOMPUTE overridden) + eps * sum_i size_i s_i.
The penalty exceeds any recompute cost, so a preference is overridden only
when the budget leaves no other way; eps breaks ties towards less memory.
Memory rows count bytes in units of the largest value (``_unit``): in bytes
their coefficients span 1 to 1e5 and more, which slows HiGHS's presolve
for the same answers.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint

from fxckpt.solve import highs
from fxckpt.solve.problem import Problem


_OBJECTIVE_SCALE = 1e6
# Relaxations: a refinement starts from the last basis on problems of at
# least this many values (see there).
_WARM_REFINED_VALUES = 1_000


class Infeasible(ValueError):
    """No plan meets the budget under the memory model."""


def solve_ilp(problem: Problem, budget: float, *, time_limit: float = 20.0,
              node_limit: int | None = None,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Return (saved, recomputed, offloaded, gap); raise Infeasible when none
    exists. ``node_limit``: the search stops after that many branch-and-bound
    nodes instead of after ``time_limit`` seconds (the answer then does not
    depend on the machine's speed or load)."""
    c, bounds = _objective_and_bounds(problem)
    constraints = _constraints(problem, budget)
    limit = {"time_limit": time_limit} if node_limit is None else {"mip_max_nodes": node_limit}
    answer = highs.solve(c, bounds, constraints, integral=True,
                         options={**limit, "mip_rel_gap": 1e-4})
    if answer.x is None:
        raise Infeasible(answer.message)
    saved, recomputed, offloaded = _split(problem, np.round(answer.x) > 0.5)
    gap = answer.gap
    return saved, recomputed, offloaded, gap if gap is not None and np.isfinite(gap) else 0.0


def relaxed_saved(problem: Problem, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """The linear relaxation's fraction saved, and offloaded, of each value."""
    return Relaxations()(problem, budget)


class Relaxations:
    """relaxed_saved for a series of solves (one frontier's), each going on
    from the basis the previous one ended at. Between two solves of one
    problem only the budget moves, which bounds the running totals alone:
    HiGHS's dual simplex goes on from the last basis instead of solving
    anew. A new problem of the same shape (a refinement: Problem.refined)
    is loaded anew, and on problems of ``_WARM_REFINED_VALUES`` values or
    more starts from that basis too.

    Going on from the last basis cuts a deep GPT's relaxations by a third
    or more (`fxckpt bench --suite solvers`). Of several optimal answers the
    one reached depends on where the simplex starts, so the frontier's
    plans differ from those solved anew, by what the rounding's luck moves
    and at the same costs in geometric mean. Below
    ``_WARM_REFINED_VALUES`` values, where a frontier solves more targets
    and the relaxations weigh less, the start is kept to its own problem:
    starting across refinements there costs the frontier against the exact
    programme's. A frontier solves the same series whatever the budget, so
    a budget's plan does not depend on the budgets asked earlier."""

    def __init__(self) -> None:
        self._problem: Problem | None = None
        self._programme: highs.Programme | None = None
        self._basis = None
        self._basis_shape: tuple[int, int] | None = None
        # The last answer's whole point: the plan's variables, then the
        # running totals (``relaxation``).
        self.point: np.ndarray | None = None

    def __call__(self, problem: Problem, budget: float) -> tuple[np.ndarray, np.ndarray]:
        width = _width(problem)
        stages = len(problem.stage_base)
        if problem is not self._problem:
            self._programme = highs.Programme(*relaxation(problem, budget))
            self._problem = problem
            if self._programme.shape == self._basis_shape \
                    and problem.n >= _WARM_REFINED_VALUES:
                self._programme.start_from(self._basis)
        else:
            self._programme.set_bounds(width, np.full(stages, -np.inf),
                                       (budget - problem.stage_base) * _unit(problem))
        answer = self._programme.solve()
        if answer.x is None:
            raise Infeasible(answer.message)
        self._basis, self._basis_shape = self._programme.basis(), self._programme.shape
        self.point = answer.x
        saved, _, offloaded = _split(problem, answer.x[:width])
        return saved, offloaded


def relaxation(problem: Problem, budget: float):
    """(objective, bounds, constraints) of the linear relaxation: the
    plan's variables, then one running total per stage (module docstring)."""
    c, bounds = _objective_and_bounds(problem)
    stages = len(problem.stage_base)
    return (np.concatenate([c, np.zeros(stages)]),
            Bounds(np.concatenate([bounds.lb, np.full(stages, -np.inf)]),
                   np.concatenate([bounds.ub, (budget - problem.stage_base) * _unit(problem)])),
            _constraints(problem, budget, running_totals=True))


def _width(problem: Problem) -> int:
    """How many of the variables are the plan's (s, r, o)."""
    return 2 * problem.n + int(problem.can_offload.sum())


def _split(problem: Problem, x: np.ndarray):
    """(saved, recomputed, offloaded) from the variable vector, offloaded
    spread back over all values."""
    n = problem.n
    offloaded = np.zeros(n, dtype=x.dtype)
    offloaded[np.flatnonzero(problem.can_offload)] = x[2 * n:]
    return x[:n], x[n:2 * n], offloaded


def _objective_and_bounds(problem: Problem):
    movable = np.flatnonzero(problem.can_offload)
    cost = problem.cost
    penalty = 10.0 * (float(cost.sum()) + 1e-9) + 1.0
    eps = 1e-3 * (float(cost[cost > 0].min()) if (cost > 0).any() else 1.0) \
        / max(float(problem.size.sum()), 1.0)
    c_save = eps * problem.size + penalty * problem.prefer_recompute
    c_recompute = cost + penalty * problem.prefer_save
    upper = np.concatenate([problem.can_save, problem.can_recompute,
                            np.ones(len(movable), dtype=bool)]).astype(float)
    # Costs are seconds (1e-6 and less): scale so HiGHS's absolute gap
    # tolerance cannot end the search early.
    c = np.concatenate([c_save, c_recompute, problem.transfer[movable]])
    scale = _OBJECTIVE_SCALE / max(float(np.abs(c).max()), 1e-30)
    return c * scale, Bounds(np.zeros(len(c)), upper)


def _constraints(problem: Problem, budget: float, *, running_totals: bool = False
                 ) -> list[LinearConstraint]:
    """The structure rows, then the memory rows: whole, or as running totals
    over one more variable per stage, after the plan's (module docstring)."""
    n = problem.n
    # Rows of two or three entries, built as arrays (a 58-layer GPT has
    # some 30,000): (columns per row, values per row, lower, upper).
    blocks = []
    needed = np.flatnonzero(problem.needed)
    blocks.append((np.stack([needed, n + needed], 1), np.ones((len(needed), 2)), 1.0, np.inf))
    indptr, indices = problem.input_lists
    counts = np.diff(indptr)
    recomputable = problem.can_recompute.astype(bool)
    child = np.repeat(np.arange(n), np.where(recomputable, counts, 0))
    parent = indices[np.repeat(recomputable, counts)]
    blocks.append((np.stack([n + child, parent, n + parent], 1),
                   np.tile([1.0, -1.0, -1.0], (len(child), 1)), -np.inf, 0.0))
    every = np.arange(n)
    blocks.append((np.stack([every, n + every], 1), np.ones((n, 2)), -np.inf, 1.0))
    movable = np.flatnonzero(problem.can_offload)
    # Per movable value o_k <= s_i, and where it must be offloaded
    # o_k >= s_i right after.
    must = problem.must_offload[movable].astype(bool)
    repeats = 1 + must
    k = np.repeat(np.arange(len(movable)), repeats)
    second = np.zeros(len(k), dtype=bool)
    second[np.cumsum(repeats)[must] - 1] = True
    blocks.append((np.stack([2 * n + k, movable[k]], 1), np.tile([1.0, -1.0], (len(k), 1)),
                   np.where(second, 0.0, -np.inf), np.where(second, np.inf, 0.0)))
    rows, cols, vals, lower, upper = [], [], [], [], []
    count = 0
    for columns, values, lo, hi in blocks:
        height, entries = columns.shape
        rows.append(np.repeat(np.arange(count, count + height), entries))
        cols.append(columns.reshape(-1))
        vals.append(values.reshape(-1))
        lower.append(np.broadcast_to(lo, (height,)))
        upper.append(np.broadcast_to(hi, (height,)))
        count += height
    rows, cols, vals = (np.concatenate(a) for a in (rows, cols, vals))
    lower, upper = np.concatenate(lower), np.concatenate(upper)
    width = 2 * n + len(movable)
    stages = len(problem.stage_base) if running_totals else 0
    structure = sp.csr_array((vals, (rows, cols)), shape=(count, width + stages))
    if running_totals:
        return [LinearConstraint(structure, lower, upper), _running_totals(problem, movable)]
    # An offloaded value leaves the saved rows (A) for the backward lifetime
    # rows (B): o_i moves size_i from one to the other.
    # Only the stages no other stage's bytes bound (Problem.binding_stages).
    stages = problem.binding_stages
    saved_rows, recomputed_rows = problem.stage_saved[stages], problem.stage_recomputed[stages]
    moved = (recomputed_rows - saved_rows)[:, movable] * problem.size[movable]
    memory = np.hstack([saved_rows * problem.size,
                        recomputed_rows * problem.size + problem.replay[None, :], moved])
    unit = _unit(problem)
    return [LinearConstraint(structure, lower, upper),
            LinearConstraint(memory * unit, -np.inf,
                             (budget - problem.stage_base[stages]) * unit)]


def _unit(problem: Problem) -> float:
    """The factor from bytes to the memory rows' unit, the largest value's
    size."""
    return 1.0 / max(float(problem.size.max(initial=0.0)), 1.0)


def _running_totals(problem: Problem, movable: np.ndarray) -> LinearConstraint:
    """m_k - m_{k-1} = (row k - row k-1) . x for each stage k (m_-1 = 0):
    the memory rows' differences (Problem.stage_steps), generator states
    entering the first total as they are held at every stage."""
    n, stages = problem.n, len(problem.stage_base)
    saved_steps, recomputed_steps = problem.stage_steps
    replay = sp.csr_array((problem.replay, (np.zeros(n, dtype=np.int64), np.arange(n))),
                          shape=(stages, n))
    moved = sp.csr_array(recomputed_steps[:, movable] - saved_steps[:, movable])
    totals = sp.eye_array(stages, k=-1) - sp.eye_array(stages)
    unit = _unit(problem)
    rows = sp.hstack([saved_steps * (problem.size[None, :] * unit),
                      (recomputed_steps * problem.size[None, :] + replay) * unit,
                      moved * (problem.size[movable][None, :] * unit), totals], format="csr")
    return LinearConstraint(rows, 0.0, 0.0)

"""HiGHS on a programme given as arrays: minimise c . x subject to
lower <= x <= upper and, for each LinearConstraint, lb <= A x <= ub; all of x
integral, or none of it.

HiGHS is driven through highspy, not scipy.optimize.milp: scipy bundles an
older HiGHS (1.12 with scipy 1.17) whose branch and bound took twice as long
on the integer programmes fxckpt solves (a 4-layer GPT's frontier: 16
programmes, 2.0 s of CPU against 1.0 s with highspy 1.16, the same costs).
The relaxation, too, solves in about 0.85 of the time (a 58-layer GPT).
It is another HiGHS, so of several optimal answers it may return another.

One thread: a plan must not depend on the machine's core count, and
planning runs inside a training process that has its own threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint

# The solution statuses HiGHS reports for the primal answer (HighsInfo).
_FEASIBLE = 2


@dataclass(frozen=True)
class Answer:
    """``x`` is None when HiGHS found no feasible point (``message`` says
    why); ``gap`` is the relative MIP gap left (None for a linear
    programme)."""

    x: np.ndarray | None
    gap: float | None
    message: str


def solve(c: np.ndarray, bounds: Bounds, constraints: list[LinearConstraint], *,
          integral: bool, options: dict | None = None) -> Answer:
    """Solve the programme; ``options`` are HiGHS's own (mip_rel_gap,
    time_limit, mip_max_nodes, ...)."""
    highs = _quiet_highs()
    highs.passModel(_model(c, bounds, constraints, integral))
    for name, value in (options or {}).items():
        highs.setOptionValue(name, value)
    return _run(highs, integral)


def _run(highs, integral: bool) -> Answer:
    """Run HiGHS on the programme it holds; its Answer."""
    highs.run()
    info = highs.getInfo()
    status = highs.modelStatusToString(highs.getModelStatus())
    if info.primal_solution_status != _FEASIBLE:
        return Answer(None, None, status)
    x = np.asarray(highs.getSolution().col_value, dtype=float)
    gap = float(info.mip_gap) if integral else None
    return Answer(x, gap, status)


class Programme:
    """One linear programme kept loaded, to be solved again after its
    variables' bounds change: HiGHS then starts from the last basis (the
    dual simplex's warm start), where ``solve`` starts from nothing. A
    programme may also start from another's basis of the same shape
    (``start_from``): HiGHS repairs what no longer fits."""

    def __init__(self, c: np.ndarray, bounds: Bounds, constraints: list[LinearConstraint]):
        self._highs = _quiet_highs()
        model = _model(c, bounds, constraints, integral=False)
        self._highs.passModel(model)
        # (variables, rows): a basis fits programmes of one shape.
        self.shape = (model.num_col_, model.num_row_)

    def start_from(self, basis) -> None:
        """Start the next solve from ``basis``, another programme's of the
        same ``shape``."""
        self._highs.setBasis(basis)

    def set_bounds(self, first: int, lower: np.ndarray, upper: np.ndarray) -> None:
        """Bounds of the variables from ``first`` on."""
        columns = np.arange(first, first + len(upper), dtype=np.int32)
        self._highs.changeColsBounds(len(columns), columns, np.asarray(lower, dtype=float),
                                     np.asarray(upper, dtype=float))

    def solve(self) -> Answer:
        return _run(self._highs, integral=False)

    def basis(self):
        """The last solve's basis, for another programme of the same shape."""
        return self._highs.getBasis()


def _quiet_highs():
    """A HiGHS instance that writes nothing. highspy.Highs's constructor
    enables its callbacks, which writes HiGHS's banner to stdout before any
    option can turn output off (ERGO-Code/HiGHS#2749); its base class does
    not, so output is turned off first."""
    highs = highspy._core._Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("threads", 1)
    return highs


def _model(c: np.ndarray, bounds: Bounds, constraints: list[LinearConstraint],
           integral: bool):
    matrix = sp.vstack([sp.csr_array(k.A) for k in constraints], format="csc")
    lower = np.concatenate([np.broadcast_to(np.asarray(k.lb, dtype=float), (k.A.shape[0],))
                            for k in constraints])
    upper = np.concatenate([np.broadcast_to(np.asarray(k.ub, dtype=float), (k.A.shape[0],))
                            for k in constraints])
    model = highspy.HighsLp()
    model.num_col_, model.num_row_ = len(c), matrix.shape[0]
    model.col_cost_ = np.asarray(c, dtype=float)
    model.col_lower_ = np.broadcast_to(np.asarray(bounds.lb, dtype=float), (len(c),))
    model.col_upper_ = np.broadcast_to(np.asarray(bounds.ub, dtype=float), (len(c),))
    model.row_lower_, model.row_upper_ = lower, upper
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_ = matrix.indptr
    model.a_matrix_.index_ = matrix.indices
    model.a_matrix_.value_ = matrix.data
    if integral:
        model.integrality_ = [highspy.HighsVarType.kInteger] * len(c)
    return model


"""solve/highs.py: HiGHS through highspy, quietly and with one thread."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint

from fxckpt.solve import highs

# max 5a + 4b + 3c subject to 2a + 3b + c <= 5, a, b, c in {0, 1}: a and b
# (value 9, weight 5).
KNAPSACK = (np.array([-5.0, -4.0, -3.0]), Bounds(np.zeros(3), np.ones(3)),
            [LinearConstraint(np.array([[2.0, 3.0, 1.0]]), -np.inf, 5.0)])


def test_integer_programme_optimum():
    answer = highs.solve(*KNAPSACK, integral=True, options={"mip_rel_gap": 0.0})
    np.testing.assert_array_equal(np.round(answer.x), [1, 1, 0])
    assert answer.gap == pytest.approx(0.0, abs=1e-9)


def test_relaxation_is_fractional():
    answer = highs.solve(*KNAPSACK, integral=False)
    # Greedy by value per weight: c (3), a (2.5), then 2/3 of b.
    np.testing.assert_allclose(answer.x, [1.0, 2.0 / 3.0, 1.0], atol=1e-9)
    assert answer.gap is None


def test_infeasible_has_no_answer():
    c, bounds, _ = KNAPSACK
    answer = highs.solve(c, bounds, [LinearConstraint(np.ones((1, 3)), 4.0, np.inf)],
                         integral=True)
    assert answer.x is None
    assert "infeasible" in answer.message.lower()


def test_solving_writes_nothing():
    """HiGHS writes a banner to stdout from highspy.Highs's constructor;
    fxckpt's solves must not (a fresh process: the banner comes once)."""
    code = ("import numpy as np\n"
            "from scipy.optimize import Bounds, LinearConstraint\n"
            "from fxckpt.solve import highs\n"
            "highs.solve(np.array([-1.0]), Bounds([0.0], [1.0]),\n"
            "            [LinearConstraint(np.ones((1, 1)), -np.inf, 1.0)], integral=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout == ""

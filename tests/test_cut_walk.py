"""Cut plans walked to (the frontier's "cut walk" stage, frontier/cuts.py): from each cut plan
on the frontier, the neighbours in the price series are evaluated, on in
each direction while the plan walked to lands on the frontier, within a
bounded count. (On a model: tests/test_solvers_unseen.py's StableLM.)"""

from __future__ import annotations

from dataclasses import replace

from fxckpt.solve.baselines import per_block
from fxckpt.solve.candidates import Candidate
from fxckpt.solve.effort import effort_for
from fxckpt.solve.frontier import Found, Search
from fxckpt.solve.frontier.cuts import cut_walk
from fxckpt.solve.problem import build_problem

try:
    from tests.random_graphs import random_profile
except ImportError:  # pragma: no cover
    from random_graphs import random_profile


class _Timeline:
    def __init__(self, peak):
        self.peak_bytes, self.peak_at = peak, ""


def _walked(problem, candidate, found, series, walks: int) -> list[Candidate]:
    """The cut walk's plans from ``found`` along ``series``, at most ``walks``."""
    search = Search(base=problem, proxy=problem, candidate=candidate, solver="fast",
                    effort=replace(effort_for(problem.n), cut_walks=walks),
                    again_from_seeds=True, cut_series=tuple(series))
    return cut_walk(search, Found(found, ("start",) * len(found))).plans


def _walk(walks: int):
    """(series, evaluated positions, walked candidates) on a series of six
    cut plans of which the fourth is on the frontier."""
    problem = build_problem(*random_profile(0))
    base = per_block(problem)
    series = [replace(base, saved=(f"v{k}",), solver="cut") for k in range(6)]
    # (peak, cost) of each plan in the series when evaluated: cheaper ones
    # first; the fourth is on the frontier already.
    read = {0: (300, 2.0), 1: (100, 3.0), 2: (100, 4.0), 4: (90, 6.0), 5: (95, 7.0)}
    found = [Candidate(replace(base, solver="low"), None, _Timeline(50), 10.0),
             Candidate(series[3], None, _Timeline(100), 5.0),
             Candidate(replace(base, solver="high"), None, _Timeline(200), 1.0)]
    evaluated = []

    def candidate(decision):
        k = series.index(decision)
        evaluated.append(k)
        peak, cost = read[k]
        return Candidate(decision, None, _Timeline(peak), cost)

    return series, evaluated, _walked(problem, candidate, found, series, walks)


def test_the_walk_goes_on_while_plans_land_on_the_frontier():
    series, evaluated, walked = _walk(8)
    # Cheaper: 2 (100 B, 4.0) and 1 (100 B, 3.0) land, 0 (300 B) does not
    # and ends that way; leaner: 4 (90 B, 6.0) lands, 5 (95 B, 7.0) does not.
    # Both directions a step at a time, nearest first.
    assert evaluated == [2, 4, 1, 5, 0]
    assert [c.decision for c in walked] == [series[k] for k in evaluated]


def test_the_walk_evaluates_at_most_its_count():
    _, evaluated, walked = _walk(2)
    assert evaluated == [2, 4] and len(walked) == 2


def test_no_walk_from_plans_off_the_series_or_off_the_frontier():
    problem = build_problem(*random_profile(0))
    base = per_block(problem)
    series = [replace(base, saved=(f"v{k}",), solver="cut") for k in range(3)]
    # The series' middle plan is beaten by another plan: nothing is walked.
    found = [Candidate(series[1], None, _Timeline(100), 5.0),
             Candidate(replace(base, solver="other"), None, _Timeline(90), 4.0)]

    def candidate(decision):
        raise AssertionError("evaluated a plan next to one off the frontier")

    assert _walked(problem, candidate, found, series, 8) == []

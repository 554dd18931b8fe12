"""The frontier's effort (solve/effort.py): one setting by graph size, with
named levels; a larger graph never gets more search than a smaller one."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxckpt.solve.effort import LEVELS, Effort, effort_for, level_of

_COUNTS = [f.name for f in fields(Effort) if f.type == "int" and f.name != "values"]
_SWITCHES = [f.name for f in fields(Effort) if f.type == "bool"]


@pytest.mark.parametrize("values, level", [(0, "small"), (400, "small"), (401, "medium"),
                                           (600, "medium"), (601, "large"),
                                           (3_200, "large"), (3_201, "huge"),
                                           (10**6, "huge")])
def test_levels_by_size(values, level):
    assert level_of(values) == level == effort_for(values).level


def test_levels_switch_stages_off_in_order():
    """Each level leaves out what the one before runs, and more."""
    sizes = [most for _, most in LEVELS[:-1]]
    efforts = [effort_for(values) for values in sizes + [sizes[-1] + 1]]
    on = [{name for name in _SWITCHES if getattr(e, name)} for e in efforts]
    assert all(later < earlier for earlier, later in zip(on, on[1:])), on
    assert on[0] == set(_SWITCHES)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=20_000), st.integers(min_value=0, max_value=20_000))
def test_a_larger_graph_never_gets_more_search(a, b):
    small, large = effort_for(min(a, b)), effort_for(max(a, b))
    assert len(_COUNTS) >= 20 and len(_SWITCHES) == 4
    for name in _COUNTS:
        assert getattr(large, name) <= getattr(small, name), name
    for name in _SWITCHES:
        assert getattr(small, name) or not getattr(large, name), name


@pytest.mark.parametrize("values, expected", [
    # The compile suite's 4-layer GPT: every count at its most.
    (387, dict(level="small", targets=16, cut_band=48, cut_plans=12, steep_plans=3,
               cut_walks=4, again_tries=4, steps_filled=12, aim_levels=3,
               steps_descended=6, swaps=True, exact_under_lowest=True)),
    # Its 8-layer GPT: fewer cut plans and step fills, no walk or swaps.
    (739, dict(level="large", targets=16, cut_band=25, cut_plans=8, steep_plans=3,
               cut_walks=0, again_tries=2, steps_filled=8, aim_levels=3,
               steps_descended=6, swaps=False, fill_from_below=False,
               exact_under_lowest=False)),
    # A 58-layer GPT: one of each where the work scales with the graph.
    (5_599, dict(level="huge", targets=7, cut_band=8, cut_plans=2, steep_plans=0,
                 steps_filled=1, aim_levels=1, steps_descended=1, seen_views=False)),
])
def test_efforts_of_the_suites_graphs(values, expected):
    effort = effort_for(values)
    assert {name: getattr(effort, name) for name in expected} == expected

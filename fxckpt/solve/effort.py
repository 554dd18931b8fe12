"""How hard the frontier searches a graph: one setting by graph size.

Every stage's work is a count of exact evaluations (a rewrite and a
simulation, each in proportion to the graph) or of solves. The counts
scale down with the graph's forward values (``work // values``, clamped),
and four named levels by size switch off the stages whose cost grows
fastest:

=========  ==============  ===============================================
level      forward values  what it leaves out
=========  ==============  ===============================================
small      up to 400       nothing
medium     401 - 600       the exact programme aiming under the lowest peak
large      601 - 3,200     also cut walks, swaps, fills from the plan below,
                           and half the bases recomputing again tries
huge       beyond 3,200    also fills aimed with the proxy seen from a plan
=========  ==============  ===============================================

The cut-offs keep the compile suite within its compile-time bar: its
4-layer GPT (387 values) is small, its 8-layer GPT (739 values) large,
where the walks, swaps and below-fills took budget planning from 1.01 to
1.13 s (``fxckpt bench --suite compile`` re-measures). The counts are the
ones the frontier was tuned with (``fxckpt bench --suite solvers``).
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, the most forward values it covers), smallest first.
LEVELS = (("small", 400), ("medium", 600), ("large", 3_200), ("huge", None))


@dataclass(frozen=True)
class Effort:
    """Counts and switches for every frontier stage and local-search move
    on one graph (``effort_for``); ``dataclasses.replace`` one to switch a
    stage off."""

    level: str
    values: int
    # The sweep: targets stepping down geometrically from the top plan,
    # stopped after ``stalls`` in a row aimed under the lowest peak that
    # did not reach it.
    targets: int
    target_ratio: float = 0.96
    stalls: int = 3
    # Solves aimed just under the lowest peak found, each pass.
    floor_steps: int = 4
    # Whether the exact programme aims under the lowest peak too (solver="auto").
    exact_under_lowest: bool = True
    # Solves aimed inside frontier gaps wider than a step of the sweep.
    gap_targets: int = 4
    # Minimum-cut plans: prices spread over the values' cost per byte, as
    # many again over the band where plans change, those simulated (gaps
    # wider than ``cut_gap``), and steep-band plans besides.
    cut_prices: int = 16
    cut_band: int = 48
    cut_gap: float = 0.99
    cut_plans: int = 12
    steep_plans: int = 3
    # Neighbours of landed cut plans walked to.
    cut_walks: int = 4
    # Recomputing again: bases that must give a plan below the floor,
    # among how many of the lowest, over these idle stretches (fractions
    # of backward's steps).
    again_bases: int = 2
    again_tries: int = 4
    again_gaps: tuple = (0.0, 0.01, 0.03, 0.1, 0.3)
    # Local search (solve/local_search): a step is steep where its lower
    # plan costs more than ``step_ratio`` times its upper one.
    step_ratio: float = 1.05
    steps_filled: int = 12
    aim_levels: int = 3
    seen_views: bool = True
    fill_from_below: bool = True
    steps_descended: int = 6
    descent_moves: int = 4
    descent_width: int = 16
    step_descent_moves: int = 2
    swaps: bool = True
    swap_evaluations: int = 3
    swap_rounds: int = 2
    swap_width: int = 8
    swap_checks: int = 16
    swap_near: float = 0.1


def level_of(values: int) -> str:
    """The named level of a graph with ``values`` forward values."""
    for name, most in LEVELS:
        if most is None or values <= most:
            return name
    raise AssertionError("the last level covers every size")


def effort_for(values: int) -> Effort:
    """The effort for a graph of ``values`` forward values."""
    level = level_of(values)
    rank = [name for name, _ in LEVELS].index(level)
    n = max(values, 1)
    return Effort(
        level=level, values=values,
        targets=max(4, min(16, 40_000 // n)),
        exact_under_lowest=rank < 1,
        cut_band=max(8, min(48, 19_200 // n)),
        cut_plans=max(2, min(12, 6_400 // n)),
        steep_plans=min(3, 6_400 // max(2 * values, 1)),
        cut_walks=4 if rank < 2 else 0,
        again_tries=4 if rank < 2 else 2,
        steps_filled=min(12, 6_400 // n),
        aim_levels=max(0, min(3, 6_400 // n)),
        seen_views=rank < 3,
        fill_from_below=rank < 2,
        steps_descended=min(6, 6_400 // n),
        swaps=rank < 2,
    )

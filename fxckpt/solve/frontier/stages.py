"""The frontier's stages, in the order they run (``STAGES``).

Each is ``(search, found) -> Added`` (frontier/search.py): it only adds
plans, and every plan's peak is the exact memory model's. The order
matters where a stage starts from what the ones before found:

1. seeds: the baselines' plans (recompute all, per block, lean blocks,
   per submodule, sqrt segments);
2. sweep: targets stepping down from the runtime-optimal peak; it hands
   on the proxy refined by the recompute chains its plans use;
3. top filled: the runtime-optimal plan filled at its own peak;
4-6. under the lowest: solves aimed just under the lowest peak found
   (refined proxy; the exact programme; the proxy as first built);
7. gaps: solves aimed inside the widest gaps;
8. cut plans: minimum cuts by price per byte, in the gaps and the steep
   bands; it hands on their price series;
9. cut walk: neighbours in that series, while they land on the frontier;
   shown only to recompute again, so the fills and descents do not start
   from them (a plan walked to that they beat would move their steps);
10. recompute again: below the single-recompute floor, before the steps
   are filled, because a filled plan peaks about as low as the plan it
   fills and costs less, so it would take that plan's place among the
   bases while leaving less to recompute again (tiny HF Llama: the floor
   rose from 110,280 to 118,216 B);
11. steep steps filled: each steep step's dearer plan filled halfway up;
12. steep steps walked down: the steps as they were before the fills, then
   the steps the fills made, so a fill taking a step's place never drops
   what walking that step down gave.

Each stage's own docstring says what it adds and why;
``fxckpt bench --suite solvers`` re-measures what the frontier costs.
"""

from __future__ import annotations

from fxckpt.solve.frontier.cuts import cut_plans, cut_walk
from fxckpt.solve.frontier.recompute_again import recompute_again
from fxckpt.solve.frontier.search import Added, Found, Search, Stage
from fxckpt.solve.frontier.sweep import (gaps, seeds, sweep, under_lowest, under_lowest_exact,
                                         under_lowest_first_proxy)
from fxckpt.solve.local_search.descend import step_keys, steps_descended
from fxckpt.solve.local_search.fill import steps_filled, top_filled


def fill_top(search: Search, found: Found) -> Added:
    """The runtime-optimal plan (``found.plans[0]``) filled at its own
    proxy peak: it recomputes what is cheap to recompute, not what costs
    least at its peak, and filled it gives the top of the frontier to
    either solver (local_search/fill.py's ``top_filled``)."""
    return Added(top_filled(search.proxy, search.candidate, found.plans[0], search.effort))


def fill_steep_steps(search: Search, found: Found) -> Added:
    """The dearer plan of each steep step filled halfway up."""
    return Added(steps_filled(search.proxy, search.candidate, found.plans, search.effort))


def descend_steep_steps(search: Search, found: Found) -> Added:
    """The cheaper plan of each steep step walked down: first the steps of
    the plans before the fills, then the new steps the fills made."""
    before = found.before("steep steps filled")
    effort = search.effort
    return Added(steps_descended(search.proxy, search.candidate, before, effort)
                 + steps_descended(search.proxy, search.candidate, found.plans, effort,
                                   step_keys(before, effort)))


STAGES: tuple[Stage, ...] = (
    Stage("seeds", seeds),
    Stage("sweep", sweep),
    Stage("top filled", fill_top),
    Stage("under the lowest", under_lowest),
    Stage("under the lowest, exact", under_lowest_exact),
    Stage("under the lowest, first proxy", under_lowest_first_proxy),
    Stage("gaps", gaps),
    Stage("cut plans", cut_plans),
    Stage("cut walk", cut_walk, shown_to=("recompute again",)),
    Stage("recompute again", recompute_again),
    Stage("steep steps filled", fill_steep_steps),
    Stage("steep steps walked down", descend_steep_steps),
)


def without(*names: str) -> tuple[Stage, ...]:
    """``STAGES`` less those named (to see what a stage adds)."""
    unknown = set(names) - {stage.name for stage in STAGES}
    if unknown:
        raise ValueError(f"no frontier stage named {sorted(unknown)}; "
                         f"the stages are {[stage.name for stage in STAGES]}")
    return tuple(stage for stage in STAGES if stage.name not in names)

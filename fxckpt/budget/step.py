"""The step's budget as decisions on numbers: what one graph may plan for,
when the first step is planned again, what a measured excess keeps aside,
and the error naming the step's floor. ``Backend`` (fxckpt/entry/backend.py)
asks; nothing here compiles, plans or reads a device.

``StepState`` is what the step's callbacks move: whether a graph of the
first step ran at its floor over the budget, whether the first step was
checked, whether a check is queued for the end of the backward, what the
floors of graphs that did not fit were made of, and whether code after the
graphs was said to be uncounted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fxckpt.errors import BudgetError
from fxckpt.options import format_bytes


@dataclass
class StepState:
    over_budget: bool = False           # a graph of the first step ran at its floor over it
    first_step_checked: bool = False
    end_of_backward_queued: bool = False
    floors_made_of: list[str] = field(default_factory=list)   # of graphs that did not fit
    outside_said: bool = False          # code after the graphs was said to be uncounted (CPU)

    def graph_did_not_fit(self, made_of: str | None) -> None:
        """A graph of the step runs at its own floor, over the budget: the
        step changed, and is checked again at the end of its backward."""
        self.over_budget = True
        self.first_step_checked = False
        if made_of:
            self.floors_made_of.append(made_of)


def graph_share(budget: int, held_by_graphs: int, held_elsewhere: int, kept_aside: int) -> int:
    """The bytes one graph may plan for: the budget less what the rest of
    the step holds while it runs (the graphs before it, the eager fallback
    regions, what measured steps showed the model misses). BudgetError
    where nothing is left, naming what holds it."""
    held = held_by_graphs + held_elsewhere + kept_aside
    remaining = budget - held
    if remaining > 0:
        return remaining
    holders = [f"the {format_bytes(held_by_graphs)} that the graphs running "
               "before this one save for backward"] if held_by_graphs else []
    if held_elsewhere:
        holders.append(f"the {format_bytes(held_elsewhere)} that eager fallback "
                       "regions save for backward")
    if kept_aside:
        holders.append(f"the {format_bytes(kept_aside)} kept aside for what "
                       "measured steps held beyond the memory model's reading")
    raise BudgetError(
        f"the budget of {format_bytes(budget)} is used up by {' and '.join(holders)}; "
        "raise the budget", floor_bytes=held + 1)


def first_step_replans(predicted: int, budget: int, over_budget: bool) -> bool:
    """Whether the first step's graphs are planned again, together: the
    step as its plans hold it is over the budget, or a graph ran at its
    floor over it."""
    return predicted > budget or over_budget


def kept_aside_after(peak: int, model: int, budget: int, kept: int) -> int:
    """Bytes kept aside once a step measured ``peak`` over ``budget`` where
    the memory model read ``model`` and ``kept`` were kept aside before:
    what the model missed, and where the plans were to fit with what was
    kept, the rest of the excess too (it happened where the model reads
    less than its peak)."""
    new = max(kept, peak - model)
    if model + kept <= budget:
        new = max(new, kept + peak - budget)
    return new


def step_floor_error(budget: int, runs: list[int], floor: int, *, regions: int,
                     regions_held: int, kept_aside: int,
                     floors_made_of: list[str]) -> BudgetError:
    """The error for a step no choice of plans fits: its graphs ran
    ``runs`` times each, and ``floor`` is the smallest budget that fits."""
    return BudgetError(
        f"no plans fit a budget of {format_bytes(budget)} for the whole step: its "
        f"{len(runs)} graph(s) ran {runs} time(s) each, and at "
        f"the lowest peak each can reach the step peaks at "
        f"{format_bytes(floor)} ({floor} bytes)"
        + (f", {format_bytes(regions_held)} of it held by {regions} eager fallback "
           "region(s) at their floor (their inputs and MUST saves)"
           if regions else "")
        + (f", {format_bytes(kept_aside)} of it measured outside what "
           "the memory model reads (tensors made outside the compiled graphs, "
           "scratch it does not know) and kept aside" if kept_aside else "")
        + "".join(f". At its own floor, a graph that did not fit peaks at a point made of {what}"
                  for what in floors_made_of)
        + f". Raise the budget to at least {floor} bytes, or shrink the batch.",
        floor_bytes=floor, dominated_by="; ".join(floors_made_of))

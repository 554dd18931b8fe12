"""Choosing a plan from a graph's frontier: a pure function of the frontier
and a request, the one place a budget becomes a plan.

A request says what is asked of the graph, in the terms users and the step
ledger use:

* ``Fits(bytes)``: the cheapest plan whose exact peak is at most ``bytes``;
* ``Floor()``: the cheapest plan at the frontier's lowest peak;
* ``RuntimeOptimal()``: the plan without a budget;
* ``Fraction(f)``: ``Fits`` at the bytes ``f`` of the way from the floor to
  the runtime-optimal plan's peak (torch's ``activation_memory_budget``).

Along a frontier cheaper means a higher peak, so a fitting request takes
the last plan that fits; where it falls inside a step of the frontier, the
step's own plans (``inside``: the plan below filled towards the one above,
the one above walked down and swapped) are weighed too. Neither the
frontier nor a step's plans depend on the request, so a larger request
never costs more and ``Floor()`` is met whenever the floor is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from fxckpt.errors import BudgetError
from fxckpt.solve.candidates import Candidate


@dataclass(frozen=True)
class Fits:
    bytes: int

    def __str__(self) -> str:
        return f"fits {self.bytes} bytes"


@dataclass(frozen=True)
class Floor:
    def __str__(self) -> str:
        return "the floor"


@dataclass(frozen=True)
class RuntimeOptimal:
    def __str__(self) -> str:
        return "the runtime-optimal plan"


@dataclass(frozen=True)
class Fraction:
    value: float

    def __str__(self) -> str:
        return f"{self.value:g} of the way from the floor to the runtime-optimal peak"


Request = Fits | Floor | RuntimeOptimal | Fraction


class NoPlanFits(BudgetError):
    """No frontier plan peaks within ``budget``; ``floor`` is the lowest one.
    The numbers only: the pipeline words the error users see."""

    def __init__(self, budget: int, floor: Candidate, runtime_optimal_peak: int) -> None:
        super().__init__(f"no plan fits {budget} bytes; the floor is {floor.peak} bytes",
                         floor_bytes=floor.peak)
        self.budget = budget
        self.floor = floor
        self.runtime_optimal_peak = runtime_optimal_peak

# What a budget inside a step can take besides the step's lower plan:
# inside(lower, upper, below) -> candidates, lowest peak first.
Inside = Callable[[Candidate, Candidate, "Candidate | None"], list[Candidate]]


def bytes_asked(request: Request, floor: int, runtime_optimal_peak: int) -> int | None:
    """The bytes ``request`` asks a plan to fit, given the frontier's floor and
    the runtime-optimal plan's peak; None for ``RuntimeOptimal()``."""
    if isinstance(request, Fits):
        return request.bytes
    if isinstance(request, Floor):
        return floor
    if isinstance(request, Fraction):
        low = min(floor, runtime_optimal_peak)
        return int(low + request.value * (runtime_optimal_peak - low))
    if isinstance(request, RuntimeOptimal):
        return None
    raise TypeError(f"not a plan request: {request!r}")


def select(frontier: Sequence[Candidate], request: Request, *, runtime_optimal: Candidate,
           inside: Inside | None = None) -> Candidate:
    """The plan ``request`` takes from ``frontier`` (lowest peak first, each
    cheaper than the one before); NoPlanFits where no plan fits the bytes
    it asks. ``inside``: a step's own plans, weighed where the bytes fall
    inside a step (none when not given)."""
    budget = bytes_asked(request, frontier[0].peak, runtime_optimal.peak)
    if budget is None:
        return runtime_optimal
    fitting = [c for c in frontier if c.peak <= budget]
    if not fitting:
        raise NoPlanFits(budget, frontier[0], runtime_optimal.peak)
    chosen = min(fitting, key=lambda c: (c.cost, c.peak))
    above = [c for c in frontier if c.peak > budget]
    if not above or inside is None:
        return chosen
    upper = min(above, key=lambda c: c.peak)
    under = [c for c in fitting if c.peak < chosen.peak]
    below = max(under, key=lambda c: c.peak) if under else None
    within = [c for c in inside(chosen, upper, below) if c.peak <= budget]
    return within[-1] if within else chosen

"""Where planning time goes, and progress while it goes.

``PhaseClock`` splits a graph's planning time into the pipeline's phases:
profile, tag, solve, rewrite (rewriting and simulating each candidate plan)
and verify. Phases nest (the solver evaluates candidates while it solves):
time is charged to the innermost phase only, so the phases never add up to
more than the planning took.

``Progress`` writes what a long planning run is doing to the ``fxckpt``
logger hierarchy at INFO: the graph and its size when planning starts, the
candidates evaluated so far (at most every ``interval`` seconds), and the
phases when it ends. The library adds no handlers; an application shows the
lines with ``logging.basicConfig(level=logging.INFO)`` or a handler on
``logging.getLogger("fxckpt")``.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable

PHASES = ("profile", "tag", "solve", "rewrite", "verify")

log = logging.getLogger("fxckpt.planner")


class PhaseClock:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._open: list[str] = []
        self._since = self.start

    @contextmanager
    def phase(self, name: str):
        self._charge()
        self._open.append(name)
        try:
            yield
        finally:
            self._charge()
            self._open.pop()

    def timed(self, name: str, fn: Callable) -> Callable:
        """``fn``, its calls charged to phase ``name``."""
        def call(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        return call

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def recorded(self) -> tuple[tuple[str, float], ...]:
        """(phase, seconds) in pipeline order, for ``Plan.phase_seconds``."""
        self._charge()
        return tuple(self.seconds.items())

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._open:
            self.seconds[self._open[-1]] += now - self._since
        self._since = now


def describe_phases(phase_seconds) -> str:
    """"profile 12.0 ms, tag 3.1 ms, ..." for a plan's ``phase_seconds``."""
    return ", ".join(f"{name} {_duration(seconds)}" for name, seconds in phase_seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1.0 else f"{seconds * 1e3:.1f} ms"


class Progress:
    """INFO lines about one graph's planning (see the module docstring)."""

    def __init__(self, graph_id: int, clock: PhaseClock, *, interval: float = 5.0) -> None:
        self.graph_id = graph_id
        self.clock = clock
        self.interval = interval
        self.candidates = 0
        self._last = clock.start

    def started(self, nodes: int, forward_values: int, options) -> None:
        log.info("fxckpt: planning graph %d: %d nodes, %d forward values (solver %s, "
                 "budget %s)", self.graph_id, nodes, forward_values, options.solver,
                 options.budget if options.budget is not None else "none")

    def counted(self, evaluate: Callable[..., Any]) -> Callable[..., Any]:
        """``evaluate``, each call counted as one candidate plan done."""
        def evaluate_counted(decision, *args):
            result = evaluate(decision, *args)
            self.candidates += 1
            now = time.perf_counter()
            log.debug("fxckpt: graph %d: candidate %d done", self.graph_id, self.candidates)
            if now - self._last >= self.interval:
                self._last = now
                log.info("fxckpt: graph %d: %d candidate plans done, %.1f s", self.graph_id,
                         self.candidates, self.clock.elapsed())
            return result
        return evaluate_counted

    def finished(self, plan) -> None:
        log.info("fxckpt: graph %d planned in %.2f s, %d candidate plans (%s)",
                 self.graph_id, plan.plan_seconds, self.candidates,
                 describe_phases(plan.phase_seconds))

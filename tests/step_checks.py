"""Checks shared by the tests of plans made inside the frontier's steps
(solve/local_search: descend, swap, fill): which made plan a
budget gains most on, and that a budget at its peak compiles exactly it,
holds it measured and trains bitwise equal to eager."""

from __future__ import annotations

import copy

import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes

try:
    from tests.harness import assert_bitwise_equal, run_step
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step


def most_gained(made, plain):
    """(gain, plan): of ``made`` (fxckpt.Plan), the plan a budget at its
    peak pays least for against ``plain``'s frontier (fxckpt.pareto's), and
    how many times that frontier's plan there costs."""
    return max(
        ([q for q in plain.frontier if q.peak_bytes <= p.peak_bytes][-1].recompute_cost
         / p.recompute_cost, p.peak_bytes, p) for p in made)[::2]


def assert_compiled_at_its_peak(step, inputs, solver, chosen):
    """A budget at ``chosen``'s peak compiles exactly that plan, whose step
    peaks within it (measured) and trains bitwise equal to eager."""
    backend = fxckpt.backend(compiler="eager", solver=solver, budget=chosen.peak_bytes)
    compiled = torch.compile(copy.deepcopy(step), backend=backend)
    ours = run_step(compiled, inputs, lambda loss: loss)
    measured = measure_peak_bytes(lambda: compiled(*inputs).backward())
    reference = run_step(copy.deepcopy(step), inputs, lambda loss: loss)
    assert [plan.fingerprint for plan in backend.plans] == [chosen.fingerprint]
    assert backend.plans[0].peak_bytes <= chosen.peak_bytes
    assert measured <= chosen.peak_bytes, (measured, chosen.peak_bytes)
    assert_bitwise_equal(ours, reference)

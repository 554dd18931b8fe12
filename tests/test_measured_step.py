"""A step's measured peak on a CUDA device against a byte budget
(fxckpt/memory/measured.py), with the allocator's counters stood in for on
the CPU: a step read over its budget is re-planned with what the memory
model missed kept aside, or refused with BudgetError naming the smallest
budget that fits with it -- and that budget, asked for, fits."""

from __future__ import annotations

import warnings

import pytest
import torch

import fxckpt
from fxckpt.memory.measured import StepPeakWatch, cuda_device
from fxckpt.entry.backend import Backend

from harness import DeviceCounters, read_as_on_a_device

pytestmark = pytest.mark.releases


class FakeAllocator:
    """torch.cuda's two counters, set by the test."""

    def __init__(self, allocated: int, peak: int) -> None:
        self.allocated, self.peak = allocated, peak

    def memory_allocated(self, device) -> int:
        return self.allocated

    def max_memory_allocated(self, device) -> int:
        return self.peak


def test_the_peak_is_read_only_when_the_step_moved_it():
    allocator = FakeAllocator(allocated=1_000, peak=5_000)
    watch = StepPeakWatch(torch.device("cuda", 0), reader=allocator)
    watch.start()
    allocator.peak = 4_000          # not possible for a real counter; still not above
    assert watch.peak() is None
    allocator.peak = 7_500          # the step set a new peak: 6,500 above its start
    assert watch.peak() == 6_500


def test_on_the_cpu_nothing_is_watched():
    assert cuda_device([torch.zeros(2), 3]) is None
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    be = fxckpt.backend(budget=1 << 20, compiler="eager")
    torch.compile(model, backend=be)(torch.randn(4, 8)).sum().backward()
    assert be.plans and be.watch.settled and be.watch.current is None
    assert be.first_step_peak_bytes is None


class StepAllocator(DeviceCounters):
    """The counters for a step whose graph runs its current plan: it peaks
    at what the plan's memory model reads plus ``unseen`` bytes the model
    does not see; by default the user resets the peak before each step."""

    def __init__(self, unseen: int, resets: bool = True) -> None:
        super().__init__(self._step, resets)
        self.unseen = unseen
        self.backend: Backend | None = None

    def _step(self) -> int:
        return sum(e.plan.peak_bytes for e in self.backend.ledger.live()) + self.unseen


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 1))


X = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))


def _floor_and_optimal() -> tuple[int, int]:
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(_mlp(), X, budget=1, compiler="eager")
    return refused.value.floor_bytes, fxckpt.explain(_mlp(), X, compiler="eager").peak_bytes


def _watched(monkeypatch, budget: int, allocator: StepAllocator):
    """A compiled MLP under ``budget`` whose steps the allocator reads, its
    inputs standing in for a CUDA device's."""
    read_as_on_a_device(monkeypatch, allocator)
    be = fxckpt.backend(budget=budget, compiler="eager")
    allocator.backend = be
    return be, torch.compile(_mlp(), backend=be)


def _step(compiled) -> dict:
    compiled.zero_grad(set_to_none=True)
    compiled(X).square().mean().backward()
    return {name: p.grad.clone() for name, p in compiled.named_parameters()}


def test_a_step_read_over_its_budget_is_replanned_with_the_excess_kept_aside(monkeypatch):
    floor, optimal = _floor_and_optimal()
    budget = (floor + optimal) // 2
    unseen = (budget - floor) // 2
    allocator = StepAllocator(unseen)
    be, compiled = _watched(monkeypatch, budget, allocator)
    with pytest.warns(UserWarning, match=r"kept aside .* planned again"):
        first = _step(compiled)
    plan_run = be.step_peaks[0] - unseen
    assert be.step_peaks[0] > budget and be.unmodelled_bytes == unseen
    assert be.replans == 1
    replanned = be.ledger.live()[0].plan
    assert replanned.peak_bytes + unseen <= budget < plan_run + unseen
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = _step(compiled)          # read within the budget: no more reads after it
    assert be.step_peaks[1] == replanned.peak_bytes + unseen <= budget
    reads = allocator.reads
    _step(compiled)
    assert allocator.reads == reads and be.replans == 1
    for name, grad in first.items():
        assert torch.equal(grad, second[name])


def test_no_fit_with_the_excess_names_the_budget_that_fits_and_it_does(monkeypatch):
    floor, optimal = _floor_and_optimal()
    budget = (floor + optimal) // 2
    unseen = budget - floor + 4096        # the floor plus it is over the budget
    be, compiled = _watched(monkeypatch, budget, StepAllocator(unseen))
    with pytest.warns(UserWarning, match="kept aside"), \
            pytest.raises(fxckpt.BudgetError, match="measured outside") as refused:
        _step(compiled)
    assert refused.value.floor_bytes == floor + unseen
    torch._dynamo.reset()
    allocator = StepAllocator(unseen)
    be, compiled = _watched(monkeypatch, refused.value.floor_bytes, allocator)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the first step may be corrected, with a warning
        _step(compiled)
    _step(compiled)
    assert be.ledger.live()[0].plan.peak_bytes + unseen <= refused.value.floor_bytes
    assert be.step_peaks[-1] <= refused.value.floor_bytes


def test_without_resets_a_lower_step_cannot_be_read_and_is_not(monkeypatch):
    """The process's peak counter, never reset: after a step read over the
    budget and corrected, the next step peaks lower, which the counter
    cannot show; it is not read, and nothing more is watched."""
    floor, optimal = _floor_and_optimal()
    budget = (floor + optimal) // 2
    allocator = StepAllocator((budget - floor) // 2, resets=False)
    be, compiled = _watched(monkeypatch, budget, allocator)
    with pytest.warns(UserWarning, match="kept aside"):
        _step(compiled)
    _step(compiled)
    assert len(be.step_peaks) == 1 and be.watch.settled
    reads = allocator.reads
    _step(compiled)
    assert allocator.reads == reads


def test_after_three_corrections_an_excess_is_only_reported(monkeypatch):
    """Eager code does not depend on the plans, so one correction is what
    it takes; a step still over after three (scratch that grows as the plans
    change) is reported with the excess, and no longer watched."""
    floor, optimal = _floor_and_optimal()
    budget = (floor + optimal) // 2
    be, compiled = _watched(monkeypatch, budget, StepAllocator(4096))
    be.watch.corrections = 3
    with pytest.warns(UserWarning, match=r"still measured .* Lower the budget by \d+ bytes"):
        _step(compiled)
    assert be.watch.settled and be.replans == 0 and be.unmodelled_bytes == 0


class Broken(torch.nn.Module):
    """The MLP with a graph break in its middle: two graphs, the second
    compiled while the first step runs."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _mlp()

    def forward(self, x):
        x = self.mlp[:4](x)
        torch._dynamo.graph_break()
        return self.mlp[4:](x)


def test_a_step_that_compiled_a_graph_meanwhile_is_not_read_but_the_next_is(monkeypatch):
    allocator = StepAllocator(0)
    be, _ = _watched(monkeypatch, 1 << 30, allocator)
    compiled = torch.compile(Broken(), backend=be)
    _step(compiled)                       # the second graph compiled inside it
    assert be.step_peaks == [] and not be.watch.settled
    _step(compiled)
    assert len(be.step_peaks) == 1 and be.watch.settled

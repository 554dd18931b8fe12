"""The first step's measured peak on a CUDA device against a byte budget
(fxckpt/budget/measured.py), with the allocator's counters stood in for on
the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import fxckpt
from fxckpt.budget.measured import StepPeakWatch, cuda_device
from fxckpt.entry.backend import Backend
from fxckpt.options import Options


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


def _watching(budget: int, allocator: FakeAllocator) -> Backend:
    backend = Backend(Options.create(budget=budget, compiler="eager"))
    backend._watch = StepPeakWatch(torch.device("cuda", 0), reader=allocator)
    backend._watch.start()
    return backend


def test_a_step_over_its_byte_budget_warns_with_the_excess():
    allocator = FakeAllocator(allocated=1_000, peak=2_000)
    backend = _watching(10_000, allocator)
    allocator.peak = 11_500         # 10,500 above the start: 500 over
    with pytest.warns(UserWarning, match=r"over the byte budget .* Lower the budget by 500 bytes"):
        backend._watch_ended()
    assert backend.first_step_peak_bytes == 10_500


def test_a_step_within_its_budget_or_not_measured_says_nothing():
    allocator = FakeAllocator(allocated=1_000, peak=2_000)
    backend = _watching(10_000, allocator)
    allocator.peak = 10_000         # 9,000 above the start
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend._watch_ended()
    assert backend.first_step_peak_bytes == 9_000
    allocator = FakeAllocator(allocated=1_000, peak=50_000)
    backend = _watching(10_000, allocator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend._watch_ended()      # the process peaked higher before: unknown
    assert backend.first_step_peak_bytes is None


def test_on_the_cpu_nothing_is_watched():
    assert cuda_device([torch.zeros(2), 3]) is None
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    be = fxckpt.backend(budget=1 << 20, compiler="eager")
    torch.compile(model, backend=be)(torch.randn(4, 8)).sum().backward()
    assert be.plans and be._watched and be._watch is None
    assert be.first_step_peak_bytes is None


def test_the_hooks_read_the_peak_as_the_first_backward_ends(monkeypatch):
    """Through a real step (CPU tensors standing in for a CUDA device): the
    watch starts before the first graph runs, is read when the first
    backward ends, once, and an excess warns."""
    import fxckpt.entry.backend as backend_module

    allocator = FakeAllocator(allocated=0, peak=0)
    reads = []

    def peak_read(device):
        reads.append(allocator.peak)
        return allocator.peak

    allocator.max_memory_allocated = peak_read
    monkeypatch.setattr(backend_module, "cuda_device", lambda inputs: torch.device("cuda", 0))
    monkeypatch.setattr(backend_module, "StepPeakWatch",
                        lambda device: StepPeakWatch(device, reader=allocator))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    be = fxckpt.backend(budget=1 << 20, compiler="eager")
    compiled = torch.compile(model, backend=be)
    out = compiled(torch.randn(4, 8)).sum()
    assert reads == [0]             # read at the start only
    allocator.peak = (1 << 20) + 4096
    with pytest.warns(UserWarning, match="Lower the budget by 4096 bytes"):
        out.backward()
    assert be.first_step_peak_bytes == (1 << 20) + 4096
    compiled(torch.randn(4, 8)).sum().backward()     # later steps are not watched
    assert len(reads) == 2


def test_a_step_that_compiled_a_graph_meanwhile_is_not_read():
    allocator = FakeAllocator(allocated=1_000, peak=2_000)
    backend = _watching(10_000, allocator)
    backend._watch.compiled_meanwhile = True
    allocator.peak = 50_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend._watch_ended()
    assert backend.first_step_peak_bytes is None

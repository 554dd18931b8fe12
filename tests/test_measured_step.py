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
    with pytest.warns(UserWarning, match=r"over the byte budget .* lower the budget by 500 bytes"):
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
    with pytest.warns(UserWarning, match="lower the budget by 4096 bytes"):
        out.backward()
    assert be.first_step_peak_bytes == (1 << 20) + 4096
    # Later steps are not watched; the second one is planned with what the
    # first measured beyond its plan set aside, more than this budget leaves.
    with pytest.raises(fxckpt.BudgetError, match="measured beyond its plans"):
        compiled(torch.randn(4, 8)).sum().backward()
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


def _deep_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(64, 64), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 1))


def _plan_peak(budget) -> int:
    be = fxckpt.backend(budget=budget, compiler="eager")
    torch.compile(_deep_mlp(), backend=be)(torch.ones(32, 64)).sum().backward()
    return be.plans[0].peak_bytes


def _steps_measured(monkeypatch, budget: int, missed: int, steps: int):
    """``steps`` training steps of the deep MLP under ``budget``; the first
    one's measured peak (a stand-in allocator) is its plan's predicted peak
    plus ``missed`` bytes the model does not know of."""
    import fxckpt.entry.backend as backend_module

    allocator = FakeAllocator(allocated=0, peak=0)
    monkeypatch.setattr(backend_module, "cuda_device", lambda inputs: torch.device("cuda", 0))
    monkeypatch.setattr(backend_module, "StepPeakWatch",
                        lambda device: StepPeakWatch(device, reader=allocator))
    model = _deep_mlp()
    be = fxckpt.backend(budget=budget, compiler="eager")
    compiled = torch.compile(model, backend=be)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    out = compiled(x).sum()
    allocator.peak = be.plans[-1].peak_bytes + missed
    with pytest.warns(UserWarning, match="planned again with what the model missed set aside"):
        out.backward()
    for _ in range(steps - 1):
        model.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
    return be, model, x


def test_what_the_first_step_measured_beyond_its_plan_is_set_aside(monkeypatch):
    """The first step measured above its byte budget, by bytes the plans do
    not hold (on CUDA: the user's loss outside the graphs, a kernel's
    scratch): from the second step on the graphs are planned within the
    budget less those bytes, with gradients unchanged."""
    top, floor = _plan_peak(None), _plan_peak(0.0)
    missed = (top - floor) // 2
    be, model, x = _steps_measured(monkeypatch, top, missed, steps=3)
    assert be.first_step_peak_bytes == top + missed
    assert be.measured_reserve_bytes == missed
    assert be.replans == 1
    (entry,) = be.ledger.run_order()
    assert entry.plan.peak_bytes <= top - missed < top
    assert any("set aside" in note for note in entry.plan.notes)
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    ref = _deep_mlp()
    ref(x).sum().backward()
    for k, p in ref.named_parameters():
        assert torch.equal(p.grad, grads[k]), k


def test_a_measured_excess_below_the_floor_names_the_budget_that_works(monkeypatch):
    """Set aside, the measured excess leaves less than the step's floor: the
    second step raises BudgetError naming the floor plus the excess, and
    that budget, asked for, runs every step at the floor plan."""
    floor = _plan_peak(0.0)
    missed = 10_000
    with pytest.raises(fxckpt.BudgetError, match="measured beyond its plans") as refused:
        _steps_measured(monkeypatch, floor + missed // 2, missed, steps=2)
    assert refused.value.floor_bytes == floor + missed
    torch._dynamo.reset()
    be, _, _ = _steps_measured(monkeypatch, refused.value.floor_bytes, missed, steps=3)
    (entry,) = be.ledger.run_order()
    assert entry.plan.peak_bytes + be.measured_reserve_bytes <= refused.value.floor_bytes

"""budget="fit" (fxckpt/budget/fit.py): the CUDA device's free memory at the first
compile, what PyTorch has cached but not allocated counted as free, less
10%. Elsewhere it is an error naming the alternatives. The arithmetic is
checked here with the CUDA queries replaced; the real path runs only where
CUDA is."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fxckpt
from fxckpt.entry.backend import Backend
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.budget.fit import fit_budget, fit_bytes
from fxckpt.options import FIT_MARGIN, FIT_SLACK, Budget, Options, parse_budget

pytestmark = pytest.mark.usefixtures("reset_dynamo")


def mlp(device="cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(256, 10)).to(device)


def test_fit_without_cuda_is_refused_where_the_budget_is_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for make in (lambda: fxckpt.backend(budget="fit"),
                 lambda: fxckpt.compile(mlp(), budget="fit"),
                 lambda: torch.compile(mlp(), backend="fxckpt",
                                       options={"budget": "fit"})(torch.randn(4, 64))):
        with pytest.raises(Exception) as refused:
            make()
        text = str(refused.value)
        assert "CUDA" in text and "byte budget" in text and "fraction" in text


def test_fit_on_a_graph_off_cuda_is_refused_at_its_first_compile(monkeypatch):
    """A machine with CUDA, a model left on the CPU: known only when the
    first graph compiles, and refused then with the device named."""
    with monkeypatch.context() as patched:     # as if the machine had CUDA
        patched.setattr(torch.cuda, "is_available", lambda: True)
        be = fxckpt.backend(budget="fit", compiler="eager")
    assert be.options.budget == Budget(fit=True)
    with pytest.raises(fxckpt.FxckptError, match=r"runs on cpu.*byte budget.*fraction"):
        torch.compile(mlp(), backend=be)(torch.randn(4, 64))


def test_fit_arithmetic(monkeypatch):
    """free 1000 MiB, 300 MiB reserved of which 100 MiB allocated: 1200 MiB
    usable, 10% and 64 MiB kept back."""
    mib = 2**20
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000 * mib, 8000 * mib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 300 * mib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 100 * mib)
    budget = fit_budget(torch.device("cuda", 0))
    assert FIT_MARGIN == 0.10
    assert FIT_SLACK == 64 * mib
    assert budget == Budget(bytes=int(1200 * mib * 0.9) - 64 * mib, fit=True)
    assert budget.bytes == fit_bytes(1000 * mib, 200 * mib)
    assert "1016.00 MiB (the CUDA device's free memory at the first compile, less 10% and " \
        "64.00 MiB)" \
        == str(budget)
    assert budget.resolve(runtime_optimal_peak=1) == budget.bytes


def test_fit_is_parsed_and_unresolved_until_a_device_is_seen(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parse_budget("fit") == parse_budget(" FIT ") == Budget(fit=True)
    with pytest.raises(ValueError, match="read off the device"):
        Budget(fit=True).resolve(runtime_optimal_peak=100)


def test_plans_made_under_fit_say_what_it_was_read_as():
    """Once read (here given as read, on the CPU), every plan notes it."""
    be = Backend(Options(budget=Budget(bytes=2**30, fit=True), compiler="eager"))
    torch.compile(mlp(), backend=be)(torch.randn(4, 64)).sum().backward()
    assert be.plans
    for plan in be.plans:
        assert "budget='fit': 1.00 GiB (the CUDA device's free memory at the first " \
            "compile, less 10% and 64.00 MiB)" in plan.notes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="budget='fit' reads a CUDA device")
def test_fit_on_cuda_plans_to_the_free_memory():
    device = torch.device("cuda")
    model = mlp(device)
    x = torch.randn(512, 64, device=device)
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    expected = fit_bytes(free, cached)
    be = fxckpt.backend(budget="fit", compiler="eager")
    compiled = torch.compile(model, backend=be)
    peak = measure_peak_bytes(lambda: compiled(x).sum().backward(), device=device)
    budget = be.options.budget
    assert budget.fit and budget.bytes is not None
    # Read at the first compile: within what compiling itself allocated of
    # what was free just before.
    assert 0.9 * expected <= budget.bytes <= expected * 1.01
    assert peak <= budget.bytes
    assert be.plans and all(p.budget_bytes is not None for p in be.plans)
    assert all(any("budget='fit'" in note and "less 10%" in note for note in p.notes)
               for p in be.plans)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="budget='fit' reads a CUDA device")
def test_fit_binds_on_a_nearly_full_device():
    """The device filled until what is free is 0.6x what the step needs with
    every activation saved: "fit" then plans below that, the step runs, its
    measured peak is within the budget, and gradients equal eager's."""
    from fxckpt.models import GPT, GPTConfig, gpt_loss

    device = torch.device("cuda")
    config = GPTConfig(vocab_size=256, block_size=256, n_layer=4, n_head=4, n_embd=256,
                       dropout=0.1)

    def model():
        torch.manual_seed(0)
        return GPT(config).to(device)

    generator = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(256, (16, 256), generator=generator).to(device)
                    for _ in range(2))

    def step(m):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        loss = gpt_loss(m(idx), targets)
        loss.backward()
        return [loss.detach(), *(p.grad for p in m.parameters())]

    eager = model()
    step(eager)                                      # cuBLAS workspaces allocated
    save_all_peak = measure_peak_bytes(lambda: step(eager), device=device)
    reference = step(eager)
    compiled_model = model()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    room = int((0.6 * save_all_peak + FIT_SLACK) / (1 - FIT_MARGIN))
    blocker = torch.empty(free - room, dtype=torch.uint8, device=device)
    try:
        be = fxckpt.backend(budget="fit", compiler="eager")
        compiled = torch.compile(compiled_model, backend=be)
        got = step(compiled)
        budget = be.options.budget.bytes
        peak = measure_peak_bytes(lambda: step(compiled), device=device)
    finally:
        del blocker
        torch.cuda.empty_cache()
    # The budget is what was left, less the margin: below the save-all step.
    assert budget < 0.7 * save_all_peak
    print(f"fit: budget {budget} B, measured {peak} B, save-all {save_all_peak} B")
    assert peak <= budget * 1.05
    assert any(p.recomputed for p in be.plans)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))

"""The README's Python examples, run as written on a tiny model, and what
they claim checked: the compiled steps' gradients are those of the model
without fxckpt (torch.compile with Inductor alone), each compiled graph has a
plan, and every policy listed resolves and plans a graph bitwise equal to
eager PyTorch."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxckpt
from fxckpt.report.plan import Plan

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.dropout(self.fc1(x).relu(), 0.2, training=self.training)).tanh()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_the_readme_has_its_examples():
    assert len(python_blocks()) >= 2


@pytest.mark.slow
def test_use_it_with_torch_compile_runs_and_matches_inductor(capsys):
    """The 'Use it with torch.compile' block: two compiled steps; their
    gradients equal torch.compile(backend="inductor")'s (dropout replayed by
    Inductor's own random kernels, so compared with fallback_random)."""
    block = next(b for b in python_blocks() if 'backend="fxckpt"' in b)
    torch.manual_seed(0)
    base = TinyNet()
    inputs = (torch.randn(4, 16),)
    model = copy.deepcopy(base)
    namespace = {"model": model, "inputs": inputs,
                 "loss_fn": lambda out: out.square().sum()}
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(1)
        exec(compile(block, str(README), "exec"), namespace)   # the README's code, as written
        reference = copy.deepcopy(base)
        torch.manual_seed(1)
        for _ in range(2):   # the block runs two steps, accumulating gradients
            torch.compile(reference, backend="inductor")(*inputs).square().sum().backward()
    plan = namespace["backend"].plans[0]
    assert isinstance(plan, Plan)
    assert capsys.readouterr().out.strip() == str(plan).strip()   # the block prints it
    for ours, theirs in zip(_grads(model), _grads(reference)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_every_listed_policy_plans_bitwise_equal_to_eager():
    """The 'Policies' block: each line is a policy fxckpt.compile accepts; with
    compiler="eager" a step under it is bitwise eager PyTorch's."""
    block = next(b for b in python_blocks() if "from fxckpt import policies as P" in b)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    lines = [line.split("#")[0].strip() for line in block.splitlines()[1:]]
    policies = [eval(line, namespace) for line in lines if line]
    assert len(policies) >= 7
    torch.manual_seed(0)
    base = TinyNet()
    x = torch.randn(4, 16)
    for policy in policies:
        torch.manual_seed(2)
        eager = copy.deepcopy(base)
        loss = eager(x).square().sum()
        loss.backward()
        ours = copy.deepcopy(base)
        compiled = fxckpt.compile(ours, compiler="eager", policy=policy)
        torch.manual_seed(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # offload on the CPU degrades to save, warning
            mine = compiled(x).square().sum()
        mine.backward()
        assert torch.equal(loss, mine), policy
        for a, b in zip(_grads(eager), _grads(ours)):
            assert torch.equal(a, b), policy


"""CPU offload: a saved value tagged *_CPU_OFFLOAD is copied to host memory
after it is produced and copied back just before backward first reads it.

This machine has no GPU. On the host, offload degrades to save (tested), and
the rewrite's offload path is exercised by letting host values "offload"
(plain copies): graph structure, plan accounting and bitwise gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxckpt
from fxckpt import policies
from fxckpt.passes import tag

try:
    from tests.harness import assert_bitwise_equal, run_step
    from tests.opcount import OpCounter
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step
    from opcount import OpCounter


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(F.dropout(torch.relu(self.fc1(x)), 0.1, self.training)).square().sum()


def _net():
    torch.manual_seed(0)
    return Net(), (torch.randn(16, 32),)


pytestmark = pytest.mark.usefixtures("reset_dynamo")


def test_offload_on_host_degrades_to_save_with_a_warning(monkeypatch):
    monkeypatch.setattr(tag, "_offload_warned", False)
    model, inputs = _net()
    with pytest.warns(UserWarning, match="degrades to save"):
        plan = fxckpt.explain(model, *inputs, policy=policies.offload(policies.save_matmuls()))
    assert plan.offloaded == () and plan.offloaded_bytes == 0
    assert any("degrades to save" in e.reason for e in plan.entries)


def test_offload_rewrite_copies_out_and_back(monkeypatch):
    monkeypatch.setattr(tag, "OFFLOAD_DEVICES", frozenset({"cpu"}))
    model, inputs = _net()
    reference = run_step(model, inputs, lambda loss: loss)
    model, inputs = _net()
    be = fxckpt.backend(compiler="eager",
                        policy=policies.offload(policies.save_matmuls()))
    compiled = torch.compile(model, backend=be)
    got = run_step(compiled, inputs, lambda loss: loss)
    assert_bitwise_equal(reference, got)
    plan = be.plans[0]
    assert set(plan.offloaded) == {"addmm", "addmm_1"} & set(plan.saved)
    assert plan.offloaded and plan.offloaded_bytes > 0
    assert all(e.action == "offloaded" for e in plan.entries if e.name in plan.offloaded)
    with OpCounter() as counter:
        counter.phase("forward")
        loss = compiled(*inputs)
        counter.phase("backward")
        loss.backward()
    assert counter.total(torch.ops.fxckpt.offload, "forward") == len(plan.offloaded)
    assert counter.total(torch.ops.fxckpt.reload, "backward") == len(plan.offloaded)
    assert counter.total(torch.ops.fxckpt.reload, "forward") == 0

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
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.opcount import OpCounter
    from tests.test_memory_model import Step
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, fresh, run_step
    from opcount import OpCounter
    from test_memory_model import Step
    from zoo import ZOO


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
    monkeypatch.setattr(fxckpt.errors, "_warned", set())
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
    counter = _count_ops(compiled, inputs)
    assert counter.total(torch.ops.fxckpt.offload, "forward") == len(plan.offloaded)
    assert counter.total(torch.ops.fxckpt.reload, "backward") == len(plan.offloaded)
    assert counter.total(torch.ops.fxckpt.reload, "forward") == 0


def _count_ops(compiled, inputs) -> OpCounter:
    """Ops one step runs, by phase."""
    with OpCounter() as counter:
        counter.phase("forward")
        loss = compiled(*inputs)
        counter.phase("backward")
        loss.backward()
    return counter


# --- the solver's third option, on a stand-in device -------------------------
# Host values "offload" (OFFLOAD_DEVICES includes "cpu"), and the memory model
# counts fxckpt::offload's copies as host memory, as it does on CUDA: the plan
# figures below are what a CUDA device would see; the measured CUDA figures
# need a GPU (tests/test_offload_cuda.py).

OFFLOAD_MATMULS = policies.offload(policies.save_matmuls())


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(tag, "OFFLOAD_DEVICES", frozenset({"cpu"}))


def _gpt_plan(**options):
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    be = fxckpt.backend(compiler="eager", **options)
    compiled = torch.compile(Step(model, loss_fn), backend=be)
    result = run_step(compiled, inputs, lambda loss: loss)
    return be.plans[0], result, compiled, inputs


def _gpt_reference():
    model, inputs, loss_fn = fresh(ZOO["gpt"])
    return run_step(Step(model, loss_fn), inputs, lambda loss: loss)


def _end_of_forward(plan) -> int:
    return [live for phase, _, live in plan.timeline.points if phase == "forward"][-1]


def test_offload_frees_the_device_by_the_offloaded_bytes(stand_in):
    """Without a budget PREFER_CPU_OFFLOAD is followed: every saved matmul
    output waits in host memory, so the device holds exactly the offloaded
    bytes less when forward ends, and the peak falls."""
    kept, _, _, _ = _gpt_plan(policy=policies.save_matmuls())
    moved, _, _, _ = _gpt_plan(policy=OFFLOAD_MATMULS, offload_bandwidth="10GB/s")
    assert moved.saved_bytes + moved.offloaded_bytes == kept.saved_bytes
    assert _end_of_forward(kept) - _end_of_forward(moved) == moved.offloaded_bytes
    assert 0 < kept.peak_bytes - moved.peak_bytes <= moved.offloaded_bytes
    assert moved.offload_seconds == pytest.approx(2 * moved.offloaded_bytes / 10e9)
    entries = {e.name: e for e in moved.entries if e.action == "offloaded"}
    assert set(entries) == set(moved.offloaded)
    assert all(e.cost == pytest.approx(2 * e.bytes / 10e9) for e in entries.values())
    assert "offloaded" in str(moved) and "GB/s" in str(moved)


BUDGET = 3_700_000   # just above the all-offloaded peak (3.58 MB): on the device alone a plan recomputes matmuls to fit


def test_a_fast_link_makes_offload_the_cheapest_way_to_fit(stand_in):
    reference = _gpt_reference()
    plan, got, compiled, inputs = _gpt_plan(policy=OFFLOAD_MATMULS, budget=BUDGET,
                                            offload_bandwidth=1e15)
    assert_bitwise_equal(reference, got)
    assert plan.peak_bytes <= BUDGET
    assert plan.offloaded, "offload costs next to nothing here: it should be used"
    # Nothing the policy wanted kept is recomputed: offloading was cheaper.
    assert not set(plan.recomputed) & {"addmm", "addmm_1", "bmm", "mm"}
    counter = _count_ops(compiled, inputs)
    assert counter.total(torch.ops.fxckpt.offload, "forward") == len(plan.offloaded)
    assert counter.total(torch.ops.fxckpt.reload, "backward") == len(plan.offloaded)
    # Values kept on the device are listed as overrides, with the price.
    kept = [o for o in plan.overrides if "kept on the device" in o]
    assert len(kept) == sum(1 for e in plan.entries
                            if e.action == "saved" and e.tag == "PREFER_CPU_OFFLOAD")


def test_a_slow_link_prices_offload_out(stand_in):
    reference = _gpt_reference()
    plan, got, _, _ = _gpt_plan(policy=OFFLOAD_MATMULS, budget=BUDGET, offload_bandwidth=1e6)
    assert_bitwise_equal(reference, got)
    assert plan.peak_bytes <= BUDGET
    assert plan.offloaded == () and plan.offload_seconds == 0
    not_followed = [o for o in plan.overrides if "PREFER_CPU_OFFLOAD not followed" in o]
    tagged = [e for e in plan.entries if e.tag == "PREFER_CPU_OFFLOAD"]
    assert tagged and len(not_followed) == len(tagged)
    assert any("recomputed" in o and "to host and back costs" in o for o in not_followed)


def test_must_offload_is_kept_whatever_it_costs(stand_in):
    plan, _, _, _ = _gpt_plan(policy=policies.offload(policies.must(policies.save_matmuls())),
                              budget=BUDGET, offload_bandwidth=1e6)
    tagged = {e.name for e in plan.entries if e.tag == "MUST_CPU_OFFLOAD"}
    assert tagged and tagged == set(plan.offloaded)
    assert not [o for o in plan.overrides if "CPU_OFFLOAD" in o]


def test_offload_bandwidth_option_is_validated():
    from fxckpt.options import Options

    assert Options.create(offload_bandwidth="12GB/s").offload_bandwidth == 12e9
    assert Options.create(offload_bandwidth="1GiB/s").offload_bandwidth == 2**30
    assert Options.from_mapping({"offload_bandwidth": 5e9}).offload_bandwidth == 5e9
    for bad in (0, -1.0, "fast", "12GB", True, float("nan")):
        with pytest.raises(ValueError, match="offload_bandwidth"):
            Options.create(offload_bandwidth=bad)


def test_offload_bench_on_the_stand_in(stand_in):
    """The bench suite's rows, on the host standing in for a device: plans and
    gradients are real; the measured host peak cannot drop (the copies are
    host memory too), so only the predicted drop is checked."""
    from fxckpt.bench import offload as bench_offload

    result = bench_offload.run_offload(device="cpu", size="tiny", repeat=1,
                                       offload_bandwidth=1e10)
    rows = {row["way"]: row for row in result["rows"]}
    assert all(row["bitwise_equal_to_eager"] for row in result["rows"])
    offloaded = rows["fxckpt, offloaded"]
    assert offloaded["offloaded_values"] > 0 and offloaded["offloaded_bytes"] > 0
    assert rows["fxckpt, saved on device"]["offloaded_values"] == 0
    assert 0 < result["summary"]["predicted_peak_drop_bytes"] <= offloaded["offloaded_bytes"]
    text = bench_offload.offload_markdown(result)
    assert "| fxckpt, offloaded |" in text and "lowered the predicted peak" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_offload_bench_refuses_without_cuda(capsys):
    from fxckpt.cli import main

    assert main(["bench", "--suite", "offload"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_offload_ops_survive_inductor(stand_in):
    """fxckpt::offload / fxckpt::reload are opaque custom ops to Inductor:
    the offloaded plan's gradients equal Inductor's without offload."""
    def grads(policy):
        torch._dynamo.reset()
        model, inputs = _net()
        model.eval()   # no dropout: Inductor's RNG differs from eager's
        be = fxckpt.backend(compiler="inductor", policy=policy, offload_bandwidth=1e10)
        torch.compile(model, backend=be)(*inputs).backward()
        return [p.grad for p in model.parameters()], be.plans[0]

    kept, _ = grads(policies.save_matmuls())
    moved, plan = grads(OFFLOAD_MATMULS)
    assert plan.offloaded
    assert all(torch.equal(a, b) for a, b in zip(kept, moved))

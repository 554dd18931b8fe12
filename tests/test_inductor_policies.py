"""Policies that recompute random ops, under Inductor with its native RNG
(``fallback_random=False``, Inductor's default).

Inductor's joint-graph passes turn each random op into ``inductor_random``
reading a seed from one ``inductor_seeds`` draw per device. fxckpt saves the
seeds and recomputes ``inductor_random`` from them, so backward replays the
forward's numbers. Compared with Inductor without fxckpt (same seeds, same
draws): bit for bit on the MLP and the user-checkpoint model; on the GPT,
Inductor fuses differently once the partition changes (even under
``save_all``, which recomputes nothing), so it is held to fp32 tolerance."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
from torch.utils.checkpoint import CheckpointPolicy

import fxckpt
from fxckpt import policies as pol

try:
    from tests.harness import assert_bitwise_equal, assert_close, fresh, run_step
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, assert_close, fresh, run_step
    from zoo import ZOO


def _sac_save_mm(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


POLICIES = {
    "save_matmuls": pol.save_matmuls(),
    "recompute_all": pol.recompute_all(),
    "every_nth_matmul": pol.every_nth_matmul(2),
    "recompute_ops": pol.recompute_ops("aten.native_dropout", "aten.gelu"),
    "sac_function": _sac_save_mm,
}


class _DropoutMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                       torch.nn.Dropout(0.5), torch.nn.Linear(16, 8))

    def forward(self, x):
        return self.net(x)


def _minimal():
    torch.manual_seed(0)
    return _DropoutMLP(), (torch.randn(4, 8),), lambda out: out.square().sum()


def _step(make, backend=None):
    torch._dynamo.reset()
    model, inputs, loss_fn = make()
    compiled = torch.compile(model) if backend is None else torch.compile(model, backend=backend)
    return run_step(compiled, inputs, loss_fn)


def _recomputed_random(be) -> list[str]:
    return [n for plan in be.plans for n in plan.recomputed if "inductor_random" in n]


@pytest.mark.releases
@pytest.mark.parametrize("policy", list(POLICIES), ids=list(POLICIES))
def test_recomputed_dropout_replays_inductor_native_rng(policy, reset_dynamo):
    assert not inductor_config.fallback_random
    ref = _step(_minimal)
    be = fxckpt.backend(policy=POLICIES[policy])
    got = _step(_minimal, be)
    assert _recomputed_random(be), "the dropout's random draw was not recomputed"
    assert any("inductor_seeds" in name for plan in be.plans for name in plan.saved)
    assert_bitwise_equal(ref, got)


def test_replay_is_not_a_fresh_draw(reset_dynamo):
    # Two steps from different seeds differ, so equal gradients above come
    # from replaying forward's mask, not from the mask being irrelevant.
    be = fxckpt.backend(policy=pol.recompute_all())
    torch._dynamo.reset()
    model, inputs, loss_fn = _minimal()
    compiled = torch.compile(model, backend=be)
    a, b = run_step(compiled, inputs, loss_fn, seed=0), run_step(compiled, inputs, loss_fn, seed=1)
    assert not torch.equal(a.loss, b.loss)


_ZOO_CASES = [("mlp", True), ("user_checkpoint", True),
              pytest.param("gpt", False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, exact", _ZOO_CASES)
@pytest.mark.parametrize("policy", ["save_matmuls", "recompute_all", "every_nth_matmul"])
def test_zoo_policies_inductor(name, exact, policy, reset_dynamo):
    ref = _step(lambda: fresh(ZOO[name]))
    be = fxckpt.backend(policy=POLICIES[policy])
    got = _step(lambda: fresh(ZOO[name]), be)
    assert _recomputed_random(be)
    if exact:
        assert_bitwise_equal(ref, got)
    else:
        assert_close(ref, got, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["mlp", "user_checkpoint", "gpt"])
@pytest.mark.parametrize("policy", ["save_matmuls", "recompute_all", "every_nth_matmul"])
def test_zoo_policies_eager_compiler(name, policy, reset_dynamo):
    torch._dynamo.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    ref = run_step(model, inputs, loss_fn)
    be = fxckpt.backend(policy=POLICIES[policy], compiler="eager")
    got = _step(lambda: fresh(ZOO[name]), be)
    assert any(plan.recomputed for plan in be.plans)
    assert_bitwise_equal(ref, got)

@pytest.mark.releases
def test_explain_and_pareto_plan_what_the_default_backend_runs(reset_dynamo):
    model, inputs, loss_fn = _minimal()
    be = fxckpt.backend(policy=pol.save_matmuls())
    _step(_minimal, be)
    explained = fxckpt.explain(model, *inputs, policy=pol.save_matmuls())
    run = be.plans[0]
    assert (set(explained.saved), set(explained.recomputed), explained.peak_bytes) == \
        (set(run.saved), set(run.recomputed), run.peak_bytes)
    assert any("inductor_seeds" in name for name in explained.saved)
    eager = fxckpt.explain(model, *inputs, policy=pol.save_matmuls(), compiler="eager")
    assert not any("inductor" in name for name in eager.saved + eager.recomputed)
    sweep = fxckpt.pareto(model, *inputs)
    # Inductor's graph: its dropout draws with inductor_random, and the
    # runtime-optimal plan, torch's partition, saves the mask it compares
    # (``gt``) as torch does, where compiler="eager" saves aten's dropout.
    assert "gt" in sweep.runtime_optimal.saved
    assert not any("native_dropout" in name for name in sweep.runtime_optimal.saved)
    # Its peaks are the memory model's, and say so: under Inductor the
    # compiled code, which a budget is checked against, can peak higher.
    assert "compiled code" in sweep.peaks_from and sweep.peaks_from in str(sweep)
    assert not any("inductor" in name for name in
                   fxckpt.pareto(model, *inputs, compiler="eager").runtime_optimal.saved)


@pytest.mark.releases
@pytest.mark.parametrize("name", ["mlp", "cnn_bn", pytest.param("hf_gpt2", marks=pytest.mark.slow),
                                  "multi_out_embed", "resnet_inplace", "user_checkpoint",
                                  pytest.param("gpt", marks=pytest.mark.slow),
                                  pytest.param("hf_llama", marks=pytest.mark.slow)])
def test_inductor_predicted_peak_within_10_percent_of_measured(name, reset_dynamo):
    """Under Inductor a plan's peak is read from the code Inductor generated."""
    be, step, inputs, model = _compiled_step(name)
    measured = _measured(step, inputs, model)
    predicted = sum(plan.peak_bytes for plan in be.plans)
    assert abs(measured - predicted) <= 0.10 * measured, (measured, predicted)
    assert all(any("Inductor's generated code" in note for note in plan.notes)
               for plan in be.plans)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "hf_llama"])
def test_inductor_byte_budget_is_kept(name, reset_dynamo):
    """A byte budget below the compiled default peak is met, or refused with
    a floor between it and the default peak that is then met."""
    default_be, step, inputs, model = _compiled_step(name)
    default_peak = sum(plan.peak_bytes for plan in default_be.plans)
    budget = default_peak * 3 // 4
    try:
        be, step, inputs, model = _compiled_step(name, budget=budget)
    except fxckpt.BudgetError as error:
        # Refused only with a floor no higher than the compiled default.
        assert budget < error.floor_bytes <= default_peak
        torch._dynamo.reset()
        budget = error.floor_bytes
        be, step, inputs, model = _compiled_step(name, budget=budget)
    assert _measured(step, inputs, model) <= budget


def _compiled_step(name, **options):
    model, inputs, loss_fn = fresh(ZOO[name])
    be = fxckpt.backend(**options)
    step = torch.compile(_Step(model, loss_fn), backend=be)
    step(*inputs).backward()
    return be, step, inputs, model


def _measured(step, inputs, model) -> int:
    from fxckpt.bench.measure import measure_peak_bytes

    model.zero_grad(set_to_none=True)
    return measure_peak_bytes(lambda: step(*inputs).backward())


class _Step(torch.nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.model(*inputs))

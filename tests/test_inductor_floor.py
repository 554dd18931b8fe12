"""Under Inductor the floor a BudgetError names is a compiled peak: the
lowest of the code Inductor generates for the memory model's floor plan,
for the runtime-optimal plan and for the plan halfway between them. Asked
for, it is met, measured."""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.models import make_model

try:
    from tests.harness import assert_close, fresh, run_step
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover
    from harness import assert_close, fresh, run_step
    from zoo import ZOO


class _Step(torch.nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.model(*inputs))


def _tiny_gpt():
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    return _Step(model, loss_fn), inputs


@pytest.mark.releases
@pytest.mark.slow
def test_named_inductor_floor_is_met_and_keeps_gradients(reset_dynamo):
    step, inputs = _tiny_gpt()
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(step, *inputs, budget=1)
    floor = refused.value.floor_bytes
    assert "Inductor" in str(refused.value) and str(floor) in str(refused.value)

    _met_and_close(_tiny_gpt, floor)


def _met_and_close(make, floor: int) -> None:
    """A budget of ``floor`` compiles plans within it, measured within it,
    with gradients close to torch.compile's without fxckpt."""
    torch._dynamo.reset()
    step, inputs = make()
    reference = run_step(torch.compile(step), inputs, lambda loss: loss)

    torch._dynamo.reset()
    step, inputs = make()
    be = fxckpt.backend(budget=floor)
    compiled = torch.compile(step, backend=be)
    got = run_step(compiled, inputs, lambda loss: loss)
    assert [plan.peak_bytes for plan in be.plans] and \
        all(plan.peak_bytes <= floor for plan in be.plans)
    assert_close(reference, got, rtol=1e-5, atol=1e-7)

    step.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: compiled(*inputs).backward())
    assert measured <= floor, (measured, floor)


def _floor(name: str, compiler: str) -> int:
    torch._dynamo.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(_Step(model, loss_fn), *inputs, budget=1, compiler=compiler)
    return refused.value.floor_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "resnet_inplace"])
def test_inductor_floor_is_within_a_tenth_of_the_eager_floor(name, reset_dynamo):
    """Inductor follows the floor plan: no addmm made of the tied head's
    gradient matmul and the embedding's gradient (gpt: its operands held
    across the backward), no fusion that makes a recomputed value early
    (resnet_inplace: two copies of a recomputed convolution live at once;
    gpt: attention probabilities recomputed beside their gradient)."""
    eager = _floor(name, "eager")
    inductor = _floor(name, "inductor")
    assert inductor <= 1.10 * eager, (name, inductor, eager, inductor / eager)


def _budgeted_step_peak(name: str, budget):
    """(the plans, the measured peak of the second step) of a fresh compile."""
    torch._dynamo.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    backend = fxckpt.backend(budget=budget)
    step = torch.compile(_Step(model, loss_fn), backend=backend)
    step(*inputs).backward()
    model.zero_grad(set_to_none=True)
    return backend.plans, measure_peak_bytes(lambda: step(*inputs).backward())


@pytest.fixture
def torch_caches(tmp_path, monkeypatch):
    """torch's caches on (conftest turns them off), in a directory of the test's own."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with torch._functorch.config.patch(enable_autograd_cache=True):
        yield


@pytest.mark.releases
@pytest.mark.slow
def test_a_recompile_served_from_caches_runs_the_plan_that_fitted(reset_dynamo, torch_caches,
                                                                   monkeypatch):
    """When no plan made for a byte budget compiles within it but the
    runtime-optimal plan does, that compile is kept. A later compile of the
    same graph (another process, or after a reset) is served from torch's
    caches: it must get that compile's code, not that of an attempt thrown
    away for peaking over the budget (zoo cnn_bn: it measured 141,352 bytes
    against a budget of 137,936). The plans made for cnn_bn's budget now
    compile within it (102,440 bytes), so here every attempt at a plan
    made for the budget is reported over it, as Inductor's code for such a
    plan can be."""
    import fxckpt.planning.capture as capture
    from fxckpt.solve.select import RuntimeOptimal

    torch.set_num_threads(1)
    default, _ = _budgeted_step_peak("cnn_bn", None)
    budget = default[0].peak_bytes           # the runtime-optimal plan's compiled peak
    attempt = capture._attempt

    def over_unless_runtime_optimal(gm, example_inputs, planner, uuid, mark, target=None):
        compiled, over = attempt(gm, example_inputs, planner, uuid, mark, target)
        return compiled, over if isinstance(target, RuntimeOptimal) else max(over, 1)

    monkeypatch.setattr(capture, "_attempt", over_unless_runtime_optimal)
    monkeypatch.setattr(capture, "_ATTEMPTS", 1)
    first, first_peak = _budgeted_step_peak("cnn_bn", budget)
    assert any("runtime-optimal plan: its compiled code meets the budget" in note
               for note in first[0].notes), first[0].notes
    monkeypatch.setattr(capture, "_attempt", attempt)
    again, again_peak = _budgeted_step_peak("cnn_bn", budget)
    assert again[0].fingerprint == first[0].fingerprint
    assert first_peak <= budget and again_peak <= budget, (first_peak, again_peak, budget)


def _tiny_glm():
    """Tiny HF GLM (hidden 64, 2 layers, sequence 64, no weights)."""
    try:
        from tests.zoo import HFCausalLM, _hf_loss, _import_transformers
    except ImportError:  # pragma: no cover
        from zoo import HFCausalLM, _hf_loss, _import_transformers

    transformers = _import_transformers()
    torch.manual_seed(0)
    config = transformers.GlmConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    pad_token_id=0, vocab_size=128, use_cache=False)
    model = transformers.GlmForCausalLM._from_config(config, attn_implementation="sdpa")
    model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(0))
    return _Step(HFCausalLM(model).train(), _hf_loss), (ids, ids.clone())


@pytest.mark.slow
def test_the_floor_named_is_the_lowest_of_three_compiled_plans_and_is_met(reset_dynamo,
                                                                           monkeypatch):
    """Inductor's code can peak lower for a plan above the memory model's
    floor than for the floor's own plan (tiny HF GLM on torch 2.13: the
    floor plan's code reads 1,230,856 bytes, the plan halfway to the
    runtime-optimal one, what budget=0.5 plans, 1,100,552). The BudgetError
    names the lowest compiled peak of the floor's plan, that halfway plan
    and the runtime-optimal plan, whichever it is on the release; a budget
    of it compiles within it, measured, with gradients close to
    torch.compile's."""
    pytest.importorskip("transformers")
    import fxckpt.planning.capture as capture

    torch.set_num_threads(1)
    compiled: list[int] = []
    note = capture._note_compiled_peaks

    def reading(planner, mark, *args):
        over = note(planner, mark, *args)
        if len(planner.plans) == mark + 1:
            compiled.append(planner.plans[mark].peak_bytes)
        return over

    monkeypatch.setattr(capture, "_note_compiled_peaks", reading)
    step, inputs = _tiny_glm()
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(step, *inputs, budget=1)
    floor = refused.value.floor_bytes
    # The floor's plan, the runtime-optimal plan and the halfway plan.
    assert len(compiled) == 3, compiled
    assert floor == min(compiled), (compiled, floor)
    _met_and_close(_tiny_glm, floor)


class _DepthwiseBlock(torch.nn.Module):
    """A ConvNeXt-style block: depthwise 7x7 convolution, layer norm, MLP."""

    def __init__(self, channels: int):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = torch.nn.LayerNorm(channels)
        self.up, self.down = torch.nn.Linear(channels, 4 * channels), \
            torch.nn.Linear(4 * channels, channels)

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.down(torch.nn.functional.gelu(self.up(y)))
        return x + y.permute(0, 3, 1, 2)


class _TwoGraphConvNet(torch.nn.Module):
    """A stem and a block, a graph break, a block and the loss."""

    def __init__(self, channels: int = 32):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.first, self.second = _DepthwiseBlock(channels), _DepthwiseBlock(channels)

    def forward(self, x):
        h = self.first(self.stem(x))
        torch._dynamo.graph_break()
        return self.second(h).mean()


def _two_graph_step(net, x, budget):
    """(backend, the step) of a fresh compile of ``net`` under ``budget``."""
    torch._dynamo.reset()
    backend = fxckpt.backend(budget=budget)
    compiled = torch.compile(net, backend=backend)

    def step():
        net.zero_grad(set_to_none=True)
        compiled(x).backward()
    return backend, step


@pytest.mark.releases
@pytest.mark.slow
def test_a_two_graph_steps_floor_is_one_its_graphs_reach(reset_dynamo):
    """A budget under the first graph's floor: it runs at its floor, and the
    second graph finds the budget used up by what the first saves before
    any planning. The second runs at the plan its own planning names as
    lowest too: the memory model's floor plan compiles far above it here
    (a depthwise convolution's backward the FX graph runs channels-last,
    with scratch, the compiled code does not), and the step was planned,
    and refused, from that plan (2,579,848 B named, 1,799,560 B measured
    there). What the first graph holds for backward is read from its code,
    which saves a channels-last copy of the stem's weight the memory model
    does not count (without it the floor named measured 1,408 B over).
    Asked, the floor named is met from the second step, measured, and is
    within 1% of what it measures: the graph that fitted its share is
    planned down to its compiled floor point with the step, not to the
    memory model's floor point (which compiles 9,728 B higher here, and was
    refused)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net, x = _TwoGraphConvNet(), torch.randn(2, 3, 16, 16)
    backend, step = _two_graph_step(net, x, 1)
    with pytest.warns(UserWarning), pytest.raises(fxckpt.BudgetError) as refused:
        step()
    floor = refused.value.floor_bytes

    backend, step = _two_graph_step(net, x, floor)
    step()
    step()
    assert backend.replans <= 1 and len(backend.plans) == 2 + backend.replans, backend.plans
    measured = measure_peak_bytes(step)
    assert measured <= floor <= 1.01 * measured, (measured, floor)

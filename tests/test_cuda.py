"""On a CUDA device (skipped without one): the invariants the CPU suite checks,
where the device's own generator, allocator and kernels are in play.

- Loss and every gradient equal eager PyTorch's bit for bit, on every zoo
  model built on the device, under the default plan, recompute-all and the
  floor (random ops replayed from the CUDA generator's saved philox state);
  where torch.compile(backend="aot_eager") itself is not bitwise eager's,
  equal to aot_eager's.
- A byte budget holds for the device allocator's measured step peak, at the
  floor plan's predicted peak and between it and the default plan's; on
  every zoo model at five budgets, the measured peak is within 10% of the
  plan's prediction; on HF Llama and GPT-2 at training sizes (float32 and
  bfloat16), within the budget (5%) at three budgets.
Inductor on CUDA (fxckpt's recomputing plan against Inductor without it)
is tests/test_inductor.py's test, on each device there is.
"""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.models import GPT, GPTConfig, gpt_loss

try:
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.zoo import ZOO, ZOO_NAMES
except ImportError:  # pragma: no cover - run from inside tests/
    from harness import assert_bitwise_equal, fresh, run_step
    from zoo import ZOO, ZOO_NAMES

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("reset_dynamo")]

CUDA = torch.device("cuda")

# solver= or budget= per row: the default plan, recompute-all, the floor.
PLANS = {"auto": {}, "recompute_all": {"solver": "recompute_all"}, "floor": {"budget": 0.0}}


def on_cuda(case):
    """The zoo case built on the device: its weights, inputs and the tensors
    its loss closes over are made there (the same seeds as on the CPU)."""
    if case.needs:
        pytest.importorskip(case.needs)
    with CUDA:
        return fresh(case)


def equal(a, b) -> bool:
    try:
        assert_bitwise_equal(a, b)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_cuda_zoo_bitwise_equal_to_eager(name, plan):
    """Bitwise equal to eager; where torch.compile(backend="aot_eager") (the
    same runtime without fxckpt's plan) is not, equal to that instead. Seen
    on an H200 (torch 2.11): aot_eager differs from eager for batch norm
    (AOTAutograd's functional batch norm is not eager's cuDNN kernel), and
    fxckpt with it; in torch.utils.checkpoint regions aot_eager draws other
    dropout masks than eager (its graph-safe RNG functionalization), while
    fxckpt's replay draws eager's."""
    eager_model, inputs, loss_fn = on_cuda(ZOO[name])
    aot_model = torch.compile(on_cuda(ZOO[name])[0], backend="aot_eager")
    model, _, _ = on_cuda(ZOO[name])
    be = fxckpt.backend(compiler="eager", **PLANS[plan])
    compiled = torch.compile(model, backend=be)
    for seed in (0, 1):     # the second step draws other random numbers
        eager = run_step(eager_model, inputs, loss_fn, seed=seed)
        aot = run_step(aot_model, inputs, loss_fn, seed=seed)
        got = run_step(compiled, inputs, loss_fn, seed=seed)
        if equal(eager, got):
            continue
        # Only where torch's own compile differs from eager too, and then
        # equal to it.
        assert not equal(eager, aot), f"{name}: fxckpt differs from eager, aot_eager does not"
        assert_bitwise_equal(aot, got)
        print(f"{name} step {seed}: equal to aot_eager, which differs from eager on CUDA")
    assert be.plans
    if plan != "auto":
        assert any(p.recomputed for p in be.plans)
        if ZOO[name].uses_rng and plan == "recompute_all":
            assert any(e.op == "rng state" for p in be.plans for e in p.entries)


CONFIG = GPTConfig(vocab_size=256, block_size=128, n_layer=3, n_head=4, n_embd=128,
                   dropout=0.1)


def gpt_on_cuda() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG).to(CUDA)


def batch():
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(CONFIG.vocab_size, (8, 128), generator=generator).to(CUDA)
    targets = torch.randint(CONFIG.vocab_size, (8, 128), generator=generator).to(CUDA)
    return (idx,), (lambda logits: gpt_loss(logits, targets))


def measured_step(model, inputs, loss_fn) -> int:
    """The allocator's peak over one step, after a step that compiles and
    leaves the library workspaces (cuBLAS) allocated. The output is kept
    through backward, as a training loop that names it does (and as the
    memory model counts it)."""
    run_step(model, inputs, loss_fn)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)

    def step():
        out = model(*inputs)
        loss_fn(out).backward()
        return out

    peak = measure_peak_bytes(step, device=CUDA)
    model.zero_grad(set_to_none=True)
    return peak


def budgeted(make, budget):
    """A model ``make()`` gives, compiled under ``budget``, its first step
    run. A step read over its budget is corrected for (memory/measured.py);
    where that cannot fit, BudgetError names the budget that does, and that
    budget, asked for, must run. Returns (backend, compiled model, budget,
    inputs, loss_fn)."""
    for _ in range(2):
        model, inputs, loss_fn = make()
        be = fxckpt.backend(compiler="eager", budget=budget)
        compiled = torch.compile(model, backend=be)
        try:
            run_step(compiled, inputs, loss_fn)
            return be, compiled, budget, inputs, loss_fn
        except fxckpt.BudgetError as refused:
            print(f"budget {budget} B refused: {refused.floor_bytes} B named")
            budget = refused.floor_bytes
            torch._dynamo.reset()
    raise AssertionError(f"the budget named, {budget} B, was refused in turn")


def current_plan(be):
    """The plan the compiled graph runs now (after any re-plan)."""
    (entry,) = be.ledger.live()
    return entry.plan


def test_cuda_byte_budgets_hold_for_the_measured_step():
    """The floor plan's predicted peak, then halfway to the default plan's,
    as byte budgets: each plan runs bitwise, within its budget."""
    inputs, loss_fn = batch()
    ref = run_step(gpt_on_cuda(), inputs, loss_fn)
    predicted = {}
    for name, budget in (("floor", 0.0), ("default", None)):
        be = fxckpt.backend(compiler="eager", budget=budget)
        run_step(torch.compile(gpt_on_cuda(), backend=be), inputs, loss_fn)
        (plan,) = be.plans
        predicted[name] = plan.peak_bytes
        torch._dynamo.reset()
    assert predicted["floor"] < 0.8 * predicted["default"]
    for budget in (predicted["floor"], (predicted["floor"] + predicted["default"]) // 2):
        be, compiled, budget, _, _ = budgeted(lambda: (gpt_on_cuda(), inputs, loss_fn), budget)
        assert_bitwise_equal(ref, run_step(compiled, inputs, loss_fn))
        peak = measured_step(compiled, inputs, loss_fn)
        plan = current_plan(be)
        expected = plan.peak_bytes + be.unmodelled_bytes
        print(f"budget {budget} B: measured {peak} B, predicted {plan.peak_bytes} B "
              f"+ {be.unmodelled_bytes} B kept aside")
        assert peak <= budget * 1.05, (peak, budget)
        assert peak <= expected * 1.05, (peak, expected)
        torch._dynamo.reset()


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_cuda_zoo_budgets_hold_and_are_predicted(name):
    """Five byte budgets per zoo model, from the floor plan's predicted peak
    to the default plan's: the allocator's measured step peak is within the
    budget (5%) and within 10% of the plan's prediction."""
    predicted = {}
    for plan_name, budget in (("floor", 0.0), ("default", None)):
        model, inputs, loss_fn = on_cuda(ZOO[name])
        be = fxckpt.backend(compiler="eager", budget=budget)
        run_step(torch.compile(model, backend=be), inputs, loss_fn)
        if len(be.plans) != 1:
            pytest.skip(f"{name} compiles to {len(be.plans)} graphs")
        predicted[plan_name] = be.plans[0].peak_bytes
        torch._dynamo.reset()
    low, high = predicted["floor"], predicted["default"]
    for k in range(5):
        be, compiled, budget, inputs, loss_fn = budgeted(lambda: on_cuda(ZOO[name]),
                                                         low + k * (high - low) // 4)
        peak = measured_step(compiled, inputs, loss_fn)
        plan = current_plan(be)
        expected = plan.peak_bytes + be.unmodelled_bytes
        print(f"{name} budget {budget} B: predicted {plan.peak_bytes} B "
              f"+ {be.unmodelled_bytes} B kept aside, measured {peak} B")
        assert peak <= budget * 1.05, (peak, budget)
        assert abs(peak - expected) <= 0.10 * peak, (peak, expected)
        torch._dynamo.reset()


def _hf_at_training_size(kind: str, dtype: torch.dtype):
    """HF Llama or GPT-2 (4 layers, width 512, 8 heads) on a batch of 4 x 512
    tokens: sizes where activations dominate."""
    transformers = pytest.importorskip("transformers")
    try:
        from tests.zoo import HFCausalLM
    except ImportError:
        from zoo import HFCausalLM
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=2048, max_position_embeddings=1024,
            attention_dropout=0.1, use_cache=False)
        model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa",
                                                            torch_dtype=dtype)
    else:
        cfg = transformers.GPT2Config(n_embd=512, n_layer=4, n_head=8, vocab_size=2048,
                                      n_positions=1024, use_cache=False, bos_token_id=0,
                                      eos_token_id=0)
        model = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa",
                                                           torch_dtype=dtype)
        model.loss_type = "ForCausalLM"
    module = HFCausalLM(model).train().to(CUDA)
    ids = torch.randint(0, 2048, (4, 512), device=CUDA)
    return module, (ids, ids.clone()), (lambda out: out.loss)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_hf_budgets_hold_at_training_sizes(kind, dtype):
    """HF Llama and GPT-2 at training sizes, float32 and bfloat16: at the
    floor plan's predicted peak, halfway to the default plan's and at it,
    the allocator's step peak is within the budget (5%). First run (H200,
    torch 2.11, before embedding backward's scratch was counted): within at
    fp32 Llama; 1.8%-2.0% over at bf16 Llama, 1.8% over at the fp32 GPT-2
    floor and 6.7% over at the bf16 GPT-2 floor."""
    predicted = {}
    for name, budget in (("floor", 0.0), ("default", None)):
        model, inputs, loss_fn = _hf_at_training_size(kind, dtype)
        be = fxckpt.backend(compiler="eager", budget=budget)
        run_step(torch.compile(model, backend=be), inputs, loss_fn)
        (plan,) = be.plans
        predicted[name] = plan.peak_bytes
        torch._dynamo.reset()
    low, high = predicted["floor"], predicted["default"]
    for k in range(3):
        be, compiled, budget, inputs, loss_fn = budgeted(
            lambda: _hf_at_training_size(kind, dtype), low + k * (high - low) // 2)
        peak = measured_step(compiled, inputs, loss_fn)
        plan = current_plan(be)
        print(f"{kind} {dtype} budget {budget} B: predicted {plan.peak_bytes} B "
              f"+ {be.unmodelled_bytes} B kept aside, measured {peak} B")
        assert peak <= budget * 1.05, (peak, budget)
        torch._dynamo.reset()

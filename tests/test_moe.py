"""A mixture of experts outside the test zoo: a tiny Mixtral (no weights, 4
experts, 2 per token), routed by top-k, whose experts run under
torch.compile as one custom operator of transformers'
(grouped_mm_fallback), opaque to fxckpt.

torch.compile(backend="aot_eager") is not bitwise equal to eager PyTorch on
it (equal losses, some gradients apart by rounding), so
fxckpt under compiler="eager" is held to torch.compile's step: bitwise equal
to it at the default plan and at the floor a BudgetError names; the floor
is met when asked for, its measured peak within the budget, and no higher
than torch.compile with torch.utils.checkpoint around each decoder layer."""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.errors import BudgetError

try:
    from tests.harness import assert_bitwise_equal, run_step
    from tests.hf_steps import checkpoint_each, compiled_peak
    from tests.zoo import HFCausalLM, _hf_loss, _import_transformers
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step
    from hf_steps import checkpoint_each, compiled_peak
    from zoo import HFCausalLM, _hf_loss, _import_transformers

SEQ = 64


def _mixtral():
    transformers = _import_transformers()
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=128,
        max_position_embeddings=SEQ, attention_dropout=0.1, use_cache=False)
    model = transformers.MixtralForCausalLM._from_config(cfg, attn_implementation="sdpa")
    ids = torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(0))
    return HFCausalLM(model).train(), (ids, ids.clone())


@pytest.mark.slow
def test_mixtral_floor_met_and_bitwise_equal_to_torch_compile(reset_dynamo):
    torch.set_num_threads(1)
    model, inputs = _mixtral()
    _, reference = compiled_peak(model, inputs, "aot_eager")
    expected = run_step(reference, inputs, _hf_loss)

    model, _ = _mixtral()
    default = fxckpt.backend(compiler="eager")
    _, compiled = compiled_peak(model, inputs, default)
    assert_bitwise_equal(expected, run_step(compiled, inputs, _hf_loss))

    model, _ = _mixtral()
    with pytest.raises(BudgetError) as refused:
        fxckpt.explain(model, *inputs, budget=1, compiler="eager")
    floor = refused.value.floor_bytes
    per_block_model = _mixtral()[0]
    checkpoint_each(per_block_model.model.model.layers)
    per_block, _ = compiled_peak(per_block_model, inputs, "aot_eager")
    model, _ = _mixtral()
    backend = fxckpt.backend(compiler="eager", budget=floor)
    measured, compiled = compiled_peak(model, inputs, backend)
    print(f"mixtral seq {SEQ}: floor {floor} B, measured {measured} B, "
          f"torch.compile per-block {per_block} B, default {default.plans[0].peak_bytes} B")
    assert len(backend.plans) == 1, "the step recompiled"
    assert measured <= floor, (measured, floor)
    assert floor < default.plans[0].peak_bytes
    assert measured <= per_block, (measured, per_block)
    assert_bitwise_equal(expected, run_step(compiled, inputs, _hf_loss))

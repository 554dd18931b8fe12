"""The fast solver against the exact programme on Hugging Face
architectures the zoo does not hold (tiny configurations, no weights), at
21 budgets from the exact frontier's floor to the runtime-optimal plan's
peak, as examples/solvers_hf.py measures them: where a fix made the fast
frontier reach the exact programme's plans.

* StableLM (hidden 64, sequence 16): the cut plan next to the one the
  frontier's gaps picked peaks as low for less (the frontier's
  cut walk), and recomputing again from it lowers the step above the
  floor; every budget within 5%, where 11 of 21 were before.
* GPT-NeoX (hidden 32, sequence 16): the plan at the floor recomputes again
  from the third lowest plan, the second giving none below the floor
  (``_AGAIN_TRIES``); the lowest budgets within 5%, where they paid 1.58x
  and 1.70x."""

from __future__ import annotations

import torch

from fxckpt.bench.solvers import capture_joint, frontier
from fxckpt.bench.ways import Step

try:
    from tests.zoo import HFCausalLM, _hf_loss, _import_transformers
except ImportError:  # pragma: no cover
    from zoo import HFCausalLM, _hf_loss, _import_transformers

_BOUND = 0.05


def _model(config_class: str, model_class: str, seq: int, vocab: int, **config):
    transformers = _import_transformers()
    torch.manual_seed(0)
    model = getattr(transformers, model_class)._from_config(
        getattr(transformers, config_class)(vocab_size=vocab, use_cache=False, **config),
        attn_implementation="sdpa")
    model.loss_type = "ForCausalLM"
    ids = torch.randint(vocab, (2, seq), generator=torch.Generator().manual_seed(0))
    return Step(HFCausalLM(model).train(), _hf_loss), (ids, ids.clone())


def _ratios(step, inputs, budgets: int = 21) -> list[tuple[int, float]]:
    """(budget, fast plan's recompute over the exact one's) at ``budgets``
    budgets from the exact frontier's floor to the runtime-optimal peak."""
    joint_call = capture_joint(step, inputs)
    exact, fast = (frontier(joint_call, solver)[0] for solver in ("ilp", "fast"))
    floor, top = exact.plans[0].peak_bytes, exact.runtime_optimal.peak_bytes
    ratios = []
    for k in range(budgets):
        budget = int(floor + k / (budgets - 1) * (top - floor))
        theirs, ours = exact.select(budget), fast.select(budget)
        assert ours is not None and ours.peak_bytes <= budget
        ratios.append((budget, ours.recompute_cost / max(theirs.recompute_cost, 1e-15)))
    return ratios


def test_stablelm_fast_frontier_within_5_percent_of_the_exact_one_at_every_budget():
    step, inputs = _model("StableLmConfig", "StableLmForCausalLM", 16, 128, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=16,
                          hidden_dropout=0.1, attention_dropout=0.1, use_qkv_bias=True,
                          partial_rotary_factor=0.25)
    over = [(budget, round(ratio, 3)) for budget, ratio in _ratios(step, inputs)
            if ratio > 1 + _BOUND]
    assert not over


def test_gpt_neox_fast_floor_within_5_percent_of_the_exact_one():
    step, inputs = _model("GPTNeoXConfig", "GPTNeoXForCausalLM", 16, 64, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          hidden_dropout=0.1, attention_dropout=0.1,
                          max_position_embeddings=16)
    # The lowest budgets: the floor and the step above it, recomputing again.
    over = [(budget, round(ratio, 3)) for budget, ratio in _ratios(step, inputs)[:4]
            if ratio > 1 + _BOUND]
    assert not over

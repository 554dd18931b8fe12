"""fxckpt's floor against torch.compile + torch.utils.checkpoint per block,
measured side by side in one run, on the zoo GPT and tiny HF GPT-2 / Llama
configurations (no weights) at sequence length 256.

    PYTHONPATH=. python examples/floor_vs_per_block.py gpt,hf_gpt2,hf_llama inductor

Under compiler="eager" torch's reference is torch.compile(backend="aot_eager")
with per-block checkpoint, and plain eager per-block checkpoint is measured
too. Prints, per model: the measured peak of torch's per-block checkpoint, of
fxckpt's per_block plan, of fxckpt at its floor (the budget BudgetError
names), the predicted floor, and the predicted floor of single
recomputation (values recomputed at most once).
"""

from __future__ import annotations

import os
import sys

import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.bench.run import floor_bytes
from fxckpt.bench.ways import Step, torch_checkpointed, wrap_each

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import zoo  # noqa: E402

SEQ = 256


def gpt():
    torch.manual_seed(0)
    model = zoo.GPT(block_size=SEQ).train()
    idx = torch.randint(0, 128, (2, SEQ))
    return model, (idx,), zoo._shifted_ce(idx)


def hf(kind):
    def make():
        transformers = zoo._import_transformers()
        torch.manual_seed(0)
        if kind == "hf_gpt2":
            cfg = transformers.GPT2Config(
                n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=SEQ,
                resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
                bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2LMHeadModel._from_config(
                cfg, attn_implementation=zoo.HF_ATTN_IMPLEMENTATION)
            model.loss_type = "ForCausalLM"
        else:
            cfg = transformers.LlamaConfig(
                hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                max_position_embeddings=SEQ, attention_dropout=0.1, use_cache=False)
            model = transformers.LlamaForCausalLM._from_config(
                cfg, attn_implementation=zoo.HF_ATTN_IMPLEMENTATION)
        ids = torch.randint(0, 128, (2, SEQ))
        return zoo.HFCausalLM(model).train(), (ids, ids.clone()), zoo._hf_loss
    return make


def measured(make, backend, *, torch_checkpoint=False) -> int:
    torch._dynamo.reset()
    model, inputs, loss_fn = make()
    if torch_checkpoint:
        blocks = next(m for m in model.modules()
                      if isinstance(m, torch.nn.ModuleList) and len(m) > 1)
        wrap_each(blocks, torch_checkpointed)
    compiled = model if backend is None else torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss_fn(compiled(*inputs)).backward()

    step()
    return measure_peak_bytes(step)


def floor(make, compiler) -> int:
    torch._dynamo.reset()
    model, inputs, _ = make()
    floor = floor_bytes(model, inputs, compiler=compiler)
    if floor is None:
        raise RuntimeError("a budget of one byte was met")
    return floor


def single_recompute_floor(make, compiler) -> int:
    """The lowest frontier plan recomputing each value at most once (plans
    recomputing again join the frontier only below it)."""
    torch._dynamo.reset()
    model, inputs, loss_fn = make()
    sweep = fxckpt.pareto(Step(model, loss_fn), *inputs, budgets=[], compiler=compiler)
    return min(plan.peak_bytes for plan in sweep.frontier if not plan.recomputed_again)


def main(names: str, compiler: str) -> None:
    torch.set_num_threads(1)
    torch.compiler.config.force_disable_caches = True
    for name in names.split(","):
        make = gpt if name == "gpt" else hf(name)
        lowest = floor(make, compiler)
        single = single_recompute_floor(make, compiler)
        torch_backend = "inductor" if compiler == "inductor" else "aot_eager"
        torch_per_block = measured(make, torch_backend, torch_checkpoint=True)
        per_block = measured(make, fxckpt.backend(compiler=compiler, solver="per_block"))
        at_floor = measured(make, fxckpt.backend(compiler=compiler, budget=lowest))
        eager = ""
        if compiler == "eager":
            eager_per_block = measured(make, None, torch_checkpoint=True)
            eager = (f"; eager per-block (no compile) {eager_per_block} B, floor / it "
                     f"{at_floor / eager_per_block:.3f}")
        print(f"{name} {compiler}: torch per-block {torch_per_block} B, fxckpt per_block "
              f"{per_block} B, fxckpt at its floor {at_floor} B (predicted {lowest} B; "
              f"single recomputation's floor {single} B); floor / torch per-block "
              f"{at_floor / torch_per_block:.3f}{eager}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpt", sys.argv[2] if len(sys.argv) > 2 else "inductor")

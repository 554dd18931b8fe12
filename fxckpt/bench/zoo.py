"""The models ``fxckpt bench`` trains: the built-in ones (fxckpt.models)
and, when ``transformers`` is installed, small Hugging Face GPT-2 and Llama
configurations built from their configs (no weights are downloaded).

Each is returned as ``make_model`` returns a built-in model: the model in
training mode (its repeated layers reachable as ``model.blocks``), example
inputs and a loss function of the model's output.
"""

from __future__ import annotations

import torch
from torch import nn

from fxckpt.models import MODEL_NAMES, make_model

HF_MODEL_NAMES = ("hf_gpt2", "hf_llama")
BENCH_MODEL_NAMES = MODEL_NAMES + HF_MODEL_NAMES

# Per size: layers, hidden width, heads, vocabulary, batch, sequence length.
_HF_SIZES = {
    "tiny": (2, 32, 2, 64, 2, 16),
    "small": (2, 64, 4, 128, 2, 256),
    "medium": (4, 128, 4, 512, 4, 256),
    "large": (6, 768, 12, 8192, 8, 1024),
}


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM called with ``(input_ids, labels)``; its
    output's ``loss`` is the step's loss. ``blocks`` are its decoder layers."""

    def __init__(self, model: nn.Module, description: str) -> None:
        super().__init__()
        self.model, self.description = model, description

    @property
    def blocks(self) -> nn.ModuleList:
        inner = getattr(self.model, "transformer", None) or self.model.model
        return inner.h if hasattr(inner, "h") else inner.layers

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False)


def hf_loss(output) -> torch.Tensor:
    return output.loss


def make_bench_model(name: str, *, size: str = "small", seed: int = 0,
                     device: str = "cpu"):
    """``(model, inputs, loss_fn)`` for a built-in or a Hugging Face model,
    on ``device`` (drawn on the CPU, so every device gets the same weights
    and inputs); the global RNG state is left as it was."""
    if name not in HF_MODEL_NAMES:
        return make_model(name, size=size, seed=seed, device=device)
    if size not in _HF_SIZES:
        raise ValueError(f"unknown size {size!r} for model {name!r}; valid sizes: "
                         f"{', '.join(_HF_SIZES)}")
    import transformers

    layers, width, heads, vocab, batch, seq = _HF_SIZES[size]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (_gpt2 if name == "hf_gpt2" else _llama)(transformers, layers, width, heads,
                                                         vocab, seq)
        ids = torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
    description = (f"{type(model).__name__} (transformers {transformers.__version__}, sdpa "
                   f"attention, dropout 0.1), {layers} layers, hidden {width}, {heads} heads, "
                   f"vocab {vocab}; input {batch}x{seq}")
    ids = ids.to(device)
    return (HFCausalLM(model, description).to(device).train(), (ids, ids.clone()),
            hf_loss)


def _gpt2(transformers, layers: int, width: int, heads: int, vocab: int, seq: int):
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=seq,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
        bos_token_id=0, eos_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    # Without a loss type transformers logs a warning inside forward, which
    # Dynamo cannot trace (a graph break).
    model.loss_type = "ForCausalLM"
    return model


def _llama(transformers, layers: int, width: int, heads: int, vocab: int, seq: int):
    config = transformers.LlamaConfig(
        hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), vocab_size=vocab,
        max_position_embeddings=seq, attention_dropout=0.1, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")

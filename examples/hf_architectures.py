"""fxckpt's promises on Hugging Face architectures the test zoo does not
hold, built from tiny configurations (no weights), measured side by side in
one process per model:

    python examples/hf_architectures.py qwen2,mistral,gpt_neox,opt,phi,gemma,gemma2,falcon,bert,t5 eager
    python examples/hf_architectures.py gptj,bloom,gpt_bigcode,stablelm,olmo2,qwen3,starcoder2,gpt_neo,llama_bias,bart eager
    python examples/hf_architectures.py mixtral,qwen2_moe,phi3,cohere,granite,glm eager
    python examples/hf_architectures.py qwen2,falcon,bert inductor
    python examples/hf_architectures.py qwen2,mixtral,t5 checkpointed
    python examples/hf_architectures.py vit,swin,convnext,whisper,deberta_v2,modernbert,gemma3,qwen3_moe,deepseek_v3,gpt_oss,olmoe,clip,mamba eager
    python examples/hf_architectures.py wav2vec2 fallback
    python examples/hf_architectures.py resnet,mobilenet_v2,regnet eager

(the names MODELS holds; GPT-Neo, Gemma2, Bloom and T5 with eager
attention, the others with sdpa; llama_bias: Llama with biases in its
attention and MLP projections; Mixtral and Qwen2-MoE with 4 experts, 2
per token.)

For each model: loss and every gradient of two steps against eager PyTorch
(against torch.compile(inductor) without fxckpt under compiler="inductor"),
for the default plan, budget=0.5, the floor a BudgetError names, and a byte
budget halfway between the floor and the default plan's measured peak; the
measured peak of the second step against each byte budget (the promise);
under compiler="eager" also torch.compile(aot_eager) without fxckpt
against eager (where that differs, each row is read against it too), and
with torch.utils.checkpoint around each block, against fxckpt's floor and
fxckpt's solver="per_block". With "checkpointed": every block wrapped in
torch.utils.checkpoint by the user, fxckpt's default plan (compiler="eager")
against torch.compile(aot_eager) of the same model: measured peaks and the
difference. With "fallback": fxckpt.compile (the parts where Dynamo breaks
the graph run eagerly under fxckpt.checkpoint), the step floor BudgetError
names at a one-byte budget, asked for, measured on the third step.
Sequence length: FXSEQ (default 128).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn as nn

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.bench.run import floor_bytes
from fxckpt.bench.ways import torch_checkpointed, wrap_each

SEQ = int(os.environ.get("FXSEQ", "128"))
V = 128


class HFWrap(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels)


def _causal(config, model_class, attn="sdpa", loss_type="ForCausalLM", **kw):
    def make():
        import transformers as T
        torch.manual_seed(0)
        model = getattr(T, model_class)._from_config(getattr(T, config)(**kw),
                                                      attn_implementation=attn)
        if loss_type:
            model.loss_type = loss_type
        ids = torch.randint(0, V, (2, SEQ))
        return HFWrap(model).train(), (ids, ids.clone()), lambda out: out.loss
    return make


class KeywordWrap(nn.Module):
    """A model whose inputs are not (input_ids, labels): the inputs by name."""

    def __init__(self, model, names, extra=None):
        super().__init__()
        self.model, self.names, self.extra = model, names, dict(extra or {})

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)), **self.extra)


def _other(config, model_class, inputs, names, attn="sdpa", extra=None, loss_type=None, **kw):
    """A model of another family: ``inputs()`` makes its inputs, ``names``
    names them; eager attention where the model has no sdpa."""
    def make():
        import transformers as T
        torch.manual_seed(0)
        cls = getattr(T, model_class)
        try:
            model = cls._from_config(getattr(T, config)(**kw), attn_implementation=attn)
        except ValueError:
            model = cls._from_config(getattr(T, config)(**kw), attn_implementation="eager")
        if loss_type:
            model.loss_type = loss_type
        return KeywordWrap(model, names, extra).train(), inputs(), lambda out: out.loss
    return make


def _ids():
    ids = torch.randint(0, V, (2, SEQ))
    return ids, ids.clone()


def _images():
    return torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))


def blocks_of(model):
    """The ModuleLists whose blocks torch's per-block checkpoint wraps."""
    inner = model.model
    name = type(inner).__name__
    if name.startswith("T5"):
        return [inner.encoder.block, inner.decoder.block]
    if name.startswith("Bert"):
        return [inner.bert.encoder.layer]
    if name.startswith("Bart"):
        return [inner.model.encoder.layers, inner.model.decoder.layers]
    return [next(m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1)]


COMMON = dict(vocab_size=V, use_cache=False)

MODELS = {
    "qwen2": _causal("Qwen2Config", "Qwen2ForCausalLM", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=SEQ, attention_dropout=0.1, **COMMON),
    "mistral": _causal("MistralConfig", "MistralForCausalLM", hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=SEQ, attention_dropout=0.1, sliding_window=64,
                       head_dim=16, **COMMON),
    "gpt_neox": _causal("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=SEQ,
                        attention_dropout=0.1, hidden_dropout=0.1, rotary_pct=0.25, **COMMON),
    "opt": _causal("OPTConfig", "OPTForCausalLM", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=SEQ, dropout=0.1,
                   attention_dropout=0.1, word_embed_proj_dim=64, pad_token_id=1,
                   bos_token_id=2, eos_token_id=2, **COMMON),
    "phi": _causal("PhiConfig", "PhiForCausalLM", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=SEQ,
                   resid_pdrop=0.1, embd_pdrop=0.1, attention_dropout=0.1, partial_rotary_factor=0.5,
                   **COMMON),
    "gemma": _causal("GemmaConfig", "GemmaForCausalLM", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                     max_position_embeddings=SEQ, attention_dropout=0.1, **COMMON),
    "gemma2": _causal("Gemma2Config", "Gemma2ForCausalLM", attn="eager", hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=SEQ,
                      attention_dropout=0.1, sliding_window=64, **COMMON),
    "falcon": _causal("FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, hidden_dropout=0.1, attention_dropout=0.1,
                      new_decoder_architecture=False, multi_query=True, parallel_attn=True,
                      bias=False, alibi=False, max_position_embeddings=SEQ, **COMMON),
    "bert": _causal("BertConfig", "BertForMaskedLM", loss_type=None, hidden_size=64,
                    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=SEQ, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, vocab_size=V),
    "gptj": _causal("GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=2, n_head=4,
                    rotary_dim=8, n_positions=SEQ, resid_pdrop=0.1, embd_pdrop=0.1,
                    attn_pdrop=0.1, **COMMON),
    "bloom": _causal("BloomConfig", "BloomForCausalLM", attn="eager", hidden_size=64, n_layer=2,
                     n_head=4, hidden_dropout=0.1, attention_dropout=0.1, **COMMON),
    "gpt_bigcode": _causal("GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=64, n_layer=2,
                           n_head=4, n_positions=SEQ, multi_query=True, resid_pdrop=0.1,
                           embd_pdrop=0.1, attn_pdrop=0.1, **COMMON),
    "stablelm": _causal("StableLmConfig", "StableLmForCausalLM", hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=SEQ, hidden_dropout=0.1,
                        attention_dropout=0.1, use_qkv_bias=True, partial_rotary_factor=0.25,
                        **COMMON),
    "olmo2": _causal("Olmo2Config", "Olmo2ForCausalLM", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=SEQ, attention_dropout=0.1, **COMMON),
    "qwen3": _causal("Qwen3Config", "Qwen3ForCausalLM", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     max_position_embeddings=SEQ, attention_dropout=0.1, **COMMON),
    "starcoder2": _causal("Starcoder2Config", "Starcoder2ForCausalLM", hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=SEQ, residual_dropout=0.1,
                          embedding_dropout=0.1, attention_dropout=0.1, **COMMON),
    "gpt_neo": _causal("GPTNeoConfig", "GPTNeoForCausalLM", attn="eager", hidden_size=64,
                       num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=32,
                       max_position_embeddings=SEQ, resid_dropout=0.1, embed_dropout=0.1,
                       attention_dropout=0.1, **COMMON),
    "llama_bias": _causal("LlamaConfig", "LlamaForCausalLM", hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=SEQ, attention_dropout=0.1, attention_bias=True,
                          mlp_bias=True, **COMMON),
    "bart": _causal("BartConfig", "BartForConditionalGeneration", loss_type=None, d_model=64,
                    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                    max_position_embeddings=SEQ, dropout=0.1, attention_dropout=0.1,
                    activation_dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                    decoder_start_token_id=2, **COMMON),
    "mixtral": _causal("MixtralConfig", "MixtralForCausalLM", hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       num_local_experts=4, num_experts_per_tok=2, **COMMON),
    "qwen2_moe": _causal("Qwen2MoeConfig", "Qwen2MoeForCausalLM", hidden_size=64,
                         intermediate_size=128, moe_intermediate_size=64,
                         shared_expert_intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                         num_experts_per_tok=2, **COMMON),
    "phi3": _causal("Phi3Config", "Phi3ForCausalLM", hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    resid_pdrop=0.1, embd_pdrop=0.1, attention_dropout=0.1, pad_token_id=0,
                    **COMMON),
    "cohere": _causal("CohereConfig", "CohereForCausalLM", hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      **COMMON),
    "granite": _causal("GraniteConfig", "GraniteForCausalLM", hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, attention_dropout=0.1, **COMMON),
    "glm": _causal("GlmConfig", "GlmForCausalLM", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, pad_token_id=0, **COMMON),
    "t5": _causal("T5Config", "T5ForConditionalGeneration", attn="eager", loss_type=None,
                  d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                  dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, **COMMON),
    # Other families: vision, speech, encoders with other
    # attentions, newer decoders and MoEs, a state-space model.
    "vit": _other("ViTConfig", "ViTForImageClassification", _images, ("pixel_values", "labels"),
                  hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, image_size=32, patch_size=4, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.1, num_labels=10),
    "swin": _other("SwinConfig", "SwinForImageClassification", _images, ("pixel_values", "labels"),
                   image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                   window_size=4, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                   drop_path_rate=0.1, num_labels=10),
    "convnext": _other("ConvNextConfig", "ConvNextForImageClassification", _images,
                       ("pixel_values", "labels"), hidden_sizes=[16, 32], depths=[2, 2],
                       num_stages=2, image_size=32, drop_path_rate=0.1, num_labels=10),
    # Batch norm in training (its running statistics updated in forward).
    "resnet": _other("ResNetConfig", "ResNetForImageClassification", _images,
                     ("pixel_values", "labels"), embedding_size=16, hidden_sizes=[16, 32, 64],
                     depths=[1, 2, 1], layer_type="bottleneck", num_labels=10),
    "mobilenet_v2": _other("MobileNetV2Config", "MobileNetV2ForImageClassification", _images,
                           ("pixel_values", "labels"), depth_multiplier=0.35, image_size=32,
                           classifier_dropout_prob=0.1, num_labels=10),
    "regnet": _other("RegNetConfig", "RegNetForImageClassification", _images,
                     ("pixel_values", "labels"), embedding_size=16, hidden_sizes=[16, 32, 64],
                     depths=[1, 2, 1], groups_width=8, num_labels=10),
    "whisper": _other("WhisperConfig", "WhisperForConditionalGeneration",
                      lambda: (torch.randn(2, 16, 128), torch.randint(2, V, (2, 32))),
                      ("input_features", "labels"), vocab_size=V, num_mel_bins=16,
                      encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, d_model=64, encoder_ffn_dim=128,
                      decoder_ffn_dim=128, max_source_positions=64, max_target_positions=64,
                      dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, pad_token_id=0,
                      bos_token_id=1, eos_token_id=1, decoder_start_token_id=1, use_cache=False),
    "deberta_v2": _other("DebertaV2Config", "DebertaV2ForMaskedLM", _ids, ("input_ids", "labels"),
                         vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=SEQ,
                         relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=32,
                         max_relative_positions=64, hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1),
    "modernbert": _other("ModernBertConfig", "ModernBertForMaskedLM", _ids, ("input_ids", "labels"),
                         vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=SEQ,
                         global_attn_every_n_layers=2, local_attention=32, attention_dropout=0.1,
                         mlp_dropout=0.1, embedding_dropout=0.1, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, cls_token_id=1, sep_token_id=2),
    "gemma3": _other("Gemma3TextConfig", "Gemma3ForCausalLM", _ids, ("input_ids", "labels"),
                     loss_type="ForCausalLM", hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, sliding_window=32, max_position_embeddings=SEQ,
                     attention_dropout=0.1, query_pre_attn_scalar=16, **COMMON),
    "qwen3_moe": _other("Qwen3MoeConfig", "Qwen3MoeForCausalLM", _ids, ("input_ids", "labels"),
                        loss_type="ForCausalLM", hidden_size=64, intermediate_size=128,
                        moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                        attention_dropout=0.1, **COMMON),
    "deepseek_v3": _other("DeepseekV3Config", "DeepseekV3ForCausalLM", _ids, ("input_ids", "labels"),
                          loss_type="ForCausalLM", hidden_size=64, intermediate_size=128,
                          moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                          n_group=1, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
                          kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                          qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=SEQ,
                          attention_dropout=0.1, **COMMON),
    "gpt_oss": _other("GptOssConfig", "GptOssForCausalLM", _ids, ("input_ids", "labels"),
                      attn="eager", loss_type="ForCausalLM", hidden_size=64, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
                      max_position_embeddings=SEQ, attention_dropout=0.1, **COMMON),
    "olmoe": _other("OlmoeConfig", "OlmoeForCausalLM", _ids, ("input_ids", "labels"),
                    loss_type="ForCausalLM", hidden_size=64, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    num_experts=4, num_experts_per_tok=2, max_position_embeddings=SEQ,
                    attention_dropout=0.1, **COMMON),
    "clip": _other("CLIPConfig", "CLIPModel",
                   lambda: (torch.randint(0, V, (2, 16)), torch.randn(2, 3, 32, 32)),
                   ("input_ids", "pixel_values"), extra={"return_loss": True},
                   text_config=dict(vocab_size=V, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    max_position_embeddings=16, attention_dropout=0.1),
                   vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, image_size=32, patch_size=4,
                                      attention_dropout=0.1),
                   projection_dim=32),
    "mamba": _other("MambaConfig", "MambaForCausalLM", _ids, ("input_ids", "labels"),
                    attn="eager", hidden_size=32, state_size=4, num_hidden_layers=2, expand=2,
                    conv_kernel=4, **COMMON),
    # Its whole forward breaks into graphs and eager code (a data-dependent
    # layer-drop branch): see fallback below.
    "wav2vec2": _other("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification",
                       lambda: (torch.randn(2, 4000), torch.randint(0, 4, (2,))),
                       ("input_values", "labels"), conv_dim=(16, 16), conv_stride=(5, 2),
                       conv_kernel=(10, 3), hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128, num_labels=4,
                       hidden_dropout=0.1, attention_dropout=0.1, feat_proj_dropout=0.1,
                       num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                       mask_time_prob=0.0),
}


def run(make, backend, *, torch_checkpoint=False):
    """Two steps of a fresh model; (losses, gradients, measured peak of the second)."""
    torch._dynamo.reset()
    model, inputs, loss_fn = make()
    if torch_checkpoint:
        for blocks in blocks_of(model):
            wrap_each(blocks, torch_checkpointed)
    compiled = model if backend is None else torch.compile(model, backend=backend)
    losses, grads = [], []

    def step():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss = loss_fn(compiled(*inputs))
        loss.backward()
        return loss

    def record(loss):
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])

    record(step())
    # The step measured is the training step alone: the copies of the
    # gradients kept for comparison are made after it (on models whose
    # parameters outweigh their activations, such as Whisper at these
    # sizes, they would be most of the peak).
    kept = []
    peak = measure_peak_bytes(lambda: kept.append(step()))
    record(kept[0])
    return losses, grads, peak


def difference(ref, got) -> float:
    """0.0 where losses and gradients are bitwise equal, else the largest
    absolute difference (inf where the sets of gradients differ)."""
    pairs = list(zip(ref[0], got[0]))
    for a, b in zip(ref[1], got[1]):
        if len(a) != len(b):
            return float("inf")
        pairs += list(zip(a, b))
    if all(torch.equal(a, b) for a, b in pairs):
        return 0.0
    return max(float((a - b).abs().max()) for a, b in pairs)


def check(name: str, compiler: str) -> None:
    make = MODELS[name]
    ref = run(make, None if compiler == "eager" else "inductor")
    torch._dynamo.reset()
    model, inputs, _ = make()
    start = time.perf_counter()
    floor = floor_bytes(model, inputs, compiler=compiler)   # None: one byte was met
    seconds = time.perf_counter() - start
    assert floor is not None, f"{name}: a budget of one byte was met"
    default = run(make, fxckpt.backend(compiler=compiler))
    rows = [("default", None, default), ("budget 0.5", None,
                                         run(make, fxckpt.backend(compiler=compiler, budget=0.5)))]
    for label, budget in (("floor", floor), ("halfway", (floor + default[2]) // 2)):
        rows.append((label, budget, run(make, fxckpt.backend(compiler=compiler, budget=budget))))
    parts = [f"{name} {compiler}: explain(budget=1) {seconds:.1f} s"]
    # torch.compile itself is not bitwise equal to eager on some models
    # (Mixtral, Qwen2-MoE, Cohere, GLM: equal losses, some gradients apart
    # by rounding): there each row is read against torch.compile(aot_eager)
    # without fxckpt too.
    compiled = run(make, "aot_eager") if compiler == "eager" else None
    apart = compiled is not None and difference(ref, compiled) != 0.0
    for label, budget, got in rows:
        kept = "" if budget is None else (f", budget {budget} B, measured/budget "
                                          f"{got[2] / budget:.3f}{'' if got[2] <= budget else ' OVER'}")
        against = f" ({difference(compiled, got):.1e} against torch.compile)" if apart else ""
        parts.append(f"{label}: peak {got[2]} B, difference {difference(ref, got):.1e}"
                     f"{against}{kept}")
    if compiler == "eager":
        parts.append(f"torch.compile(aot_eager) without fxckpt: difference "
                     f"{difference(ref, compiled):.1e}")
        torch_per_block = run(make, "aot_eager", torch_checkpoint=True)[2]
        per_block = run(make, fxckpt.backend(compiler=compiler, solver="per_block"))[2]
        parts.append(f"torch per-block {torch_per_block} B; floor / it "
                     f"{rows[2][2][2] / torch_per_block:.3f}; fxckpt per_block / it "
                     f"{per_block / torch_per_block:.3f}")
    print("\n  ".join(parts), flush=True)


def checkpointed(name: str) -> None:
    """The user's own per-block checkpoint: torch.compile against fxckpt."""
    make = MODELS[name]
    ref = run(make, "aot_eager", torch_checkpoint=True)
    got = run(make, fxckpt.backend(compiler="eager"), torch_checkpoint=True)
    print(f"{name} checkpointed per block: torch.compile {ref[2]} B, fxckpt {got[2]} B "
          f"({got[2] / ref[2]:.3f}), difference {difference(ref, got):.1e}", flush=True)


def fallback(name: str) -> None:
    """fxckpt.compile's step floor, asked for: measured against it."""
    make = MODELS[name]

    def steps(budget):
        torch._dynamo.reset()
        model, inputs, loss_fn = make()
        compiled = fxckpt.compile(model, compiler="eager", budget=budget)

        def step():
            model.zero_grad(set_to_none=True)
            torch.manual_seed(0)
            loss_fn(compiled(*inputs)).backward()

        step()
        step()
        return measure_peak_bytes(step), compiled

    try:
        steps(1)
        print(f"{name} fallback: a budget of one byte was met", flush=True)
        return
    except fxckpt.BudgetError as error:
        floor = error.floor_bytes
    peak, compiled = steps(floor)
    report = compiled.fxckpt_report
    print(f"{name} fallback: {len(report.regions)} region(s); step floor named {floor} B, "
          f"measured {peak} B ({peak / floor:.3f}"
          f"{'' if peak <= floor else ' OVER'})", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.compiler.config.force_disable_caches = True
    names = sys.argv[1] if len(sys.argv) > 1 else "qwen2"
    mode = sys.argv[2] if len(sys.argv) > 2 else "eager"
    for name in names.split(","):
        if mode == "checkpointed":
            checkpointed(name)
        elif mode == "fallback":
            fallback(name)
        else:
            check(name, mode)

"""A zoo of small models for checking fxckpt against plain eager PyTorch.

Every entry is a :class:`ZooCase`; ``case.make()`` returns
``(module, inputs, loss_fn)`` where ``inputs`` is a tuple of positional
arguments for ``module`` and ``loss_fn(output)`` returns a scalar tensor.
Construction is seeded, so two calls to ``make()`` give identical weights
and inputs.  Modules are returned in train mode (dropout active, BatchNorm
updating its running statistics).

All models are small enough that one forward + backward on CPU takes well
under half a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

MakeResult = tuple[nn.Module, tuple, Callable[[Any], torch.Tensor]]


@dataclass(frozen=True)
class ZooCase:
    name: str
    make: Callable[[], MakeResult] = field(repr=False)
    # True when torch.compile(backend="aot_eager") reproduces eager's loss and
    # gradients bit for bit.  Cases where it does not must say why in
    # ``note`` and later tests should compare them with a tolerance.
    aot_eager_bitwise: bool = True
    # Integer (token) inputs rather than float inputs.
    integer_input: bool = False
    # The model has dropout / other RNG use in its forward.
    uses_rng: bool = False
    # The module mutates buffers in forward (BatchNorm in train mode).
    mutates_buffers: bool = False
    # The module ties (shares) parameters between submodules.
    tied_weights: bool = False
    # The case needs an optional third-party package (``transformers``).
    needs: str | None = None
    note: str = ""


# ---------------------------------------------------------------------------
# mlp
# ---------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 128, d_out: int = 10,
                 p: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


def make_mlp() -> MakeResult:
    torch.manual_seed(0)
    m = MLP().train()
    x = torch.randn(16, 32)
    target = torch.randint(0, 10, (16,))

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    return m, (x,), loss_fn


# ---------------------------------------------------------------------------
# cnn_bn
# ---------------------------------------------------------------------------


class CNNBN(nn.Module):
    def __init__(self, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.gap(x).flatten(1)
        return self.fc(x)


def make_cnn_bn() -> MakeResult:
    torch.manual_seed(0)
    m = CNNBN().train()
    x = torch.randn(4, 3, 16, 16)
    target = torch.randint(0, 10, (4,))

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    return m, (x,), loss_fn


# ---------------------------------------------------------------------------
# gpt
# ---------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, p: float) -> None:
        super().__init__()
        assert n_embd % n_head == 0
        self.n_head = n_head
        self.p = p
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.p if self.training else 0.0,
            is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class GPTMLP(nn.Module):
    def __init__(self, n_embd: int, p: float) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class GPTBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, p: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, p)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = GPTMLP(n_embd, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab: int = 128, block_size: int = 32,
                 n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                 p: float = 0.1, tied: bool = True) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(
            GPTBlock(n_embd, n_head, p) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(mod: nn.Module) -> None:
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            nn.init.normal_(mod.weight, mean=0.0, std=0.02)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def _shifted_ce(idx: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)),
            idx[:, 1:].reshape(-1))
    return loss_fn


def make_gpt() -> MakeResult:
    torch.manual_seed(0)
    # Batch and sequence large enough that activations, not parameters and
    # their gradients, dominate memory: budgets then have room to act.
    m = GPT(block_size=64).train()
    idx = torch.randint(0, 128, (8, 64))
    return m, (idx,), _shifted_ce(idx)


# ---------------------------------------------------------------------------
# resnet_inplace
# ---------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return out


class ResNetInplace(nn.Module):
    def __init__(self, c: int = 16, n_blocks: int = 2,
                 n_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.blocks = nn.Sequential(*(BasicBlock(c) for _ in range(n_blocks)))
        self.fc = nn.Linear(c, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        x = x.mean(dim=(2, 3))
        return self.fc(x)


def make_resnet_inplace() -> MakeResult:
    torch.manual_seed(0)
    m = ResNetInplace().train()
    x = torch.randn(4, 3, 16, 16)
    target = torch.randint(0, 10, (4,))

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    return m, (x,), loss_fn


# ---------------------------------------------------------------------------
# multi_out_embed
# ---------------------------------------------------------------------------


class MultiOutEmbed(nn.Module):
    def __init__(self, vocab: int = 100, d: int = 32,
                 n_classes: int = 5) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.Tanh(),
                                 nn.Linear(64, d))
        self.cls = nn.Linear(d, n_classes)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.enc(self.emb(idx))
        pooled = h.mean(dim=1)
        logits = self.cls(pooled)
        return pooled, logits


def make_multi_out_embed() -> MakeResult:
    torch.manual_seed(0)
    m = MultiOutEmbed().train()
    idx = torch.randint(0, 100, (8, 12))
    target = torch.randint(0, 5, (8,))

    def loss_fn(out: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        pooled, logits = out
        return F.cross_entropy(logits, target) + 0.1 * pooled.pow(2).mean()

    return m, (idx,), loss_fn


# ---------------------------------------------------------------------------
# user_checkpoint
# ---------------------------------------------------------------------------


class CkptBlock(nn.Module):
    def __init__(self, d: int, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(self.act(self.fc1(self.ln(x)))))


class UserCheckpoint(nn.Module):
    """Calls ``torch.utils.checkpoint.checkpoint`` itself on each block."""

    def __init__(self, d: int = 32, n_classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList(CkptBlock(d) for _ in range(2))
        self.out = nn.Linear(d, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for blk in self.blocks:
            h = torch.utils.checkpoint.checkpoint(blk, h, use_reentrant=False)
        return self.out(h)


def make_user_checkpoint() -> MakeResult:
    torch.manual_seed(0)
    m = UserCheckpoint().train()
    x = torch.randn(8, 16)
    target = torch.randint(0, 10, (8,))

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    return m, (x,), loss_fn


# ---------------------------------------------------------------------------
# Hugging Face transformers
# ---------------------------------------------------------------------------


class HFCausalLM(nn.Module):
    """Calls a Hugging Face causal LM with keyword arguments, so that the
    zoo's positional-input convention works; returns the model output (a
    ``ModelOutput`` with ``.loss`` and ``.logits``).  Parameter names get a
    ``model.`` prefix."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False)


def _hf_loss(out) -> torch.Tensor:
    return out.loss


def _import_transformers():
    import pytest
    return pytest.importorskip("transformers")


HF_ATTN_IMPLEMENTATION = "sdpa"


def make_hf_gpt2() -> MakeResult:
    transformers = _import_transformers()
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False,
        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(
        cfg, attn_implementation=HF_ATTN_IMPLEMENTATION)
    # GPT2LMHeadModel's class name does not map to a loss type, so without
    # this transformers calls logger.warning_once inside forward, which is a
    # dynamo graph break (logging.Logger methods are unsupported).
    model.loss_type = "ForCausalLM"
    m = HFCausalLM(model).train()
    ids = torch.randint(0, 128, (2, 32))
    return m, (ids, ids.clone()), _hf_loss


def make_hf_llama() -> MakeResult:
    transformers = _import_transformers()
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=64, attention_dropout=0.1, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(
        cfg, attn_implementation=HF_ATTN_IMPLEMENTATION)
    m = HFCausalLM(model).train()
    ids = torch.randint(0, 128, (2, 32))
    return m, (ids, ids.clone()), _hf_loss


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

_CASES = [
    ZooCase("mlp", make_mlp, uses_rng=True),
    ZooCase("cnn_bn", make_cnn_bn, mutates_buffers=True),
    ZooCase("gpt", make_gpt, integer_input=True, uses_rng=True,
            tied_weights=True),
    ZooCase("resnet_inplace", make_resnet_inplace, mutates_buffers=True),
    ZooCase("multi_out_embed", make_multi_out_embed, integer_input=True),
    ZooCase("user_checkpoint", make_user_checkpoint, uses_rng=True,
            note="dynamo turns each checkpoint call into the "
                 "tag_activation_checkpoint HOP; in the AOT joint graph its "
                 "nodes carry meta['recompute'] (PREFER_RECOMPUTE / "
                 "MUST_SAVE) and meta['ac_graph_id'], and its dropout runs "
                 "as run_and_save_rng_state / run_with_rng_state HOPs."),
    ZooCase("hf_gpt2", make_hf_gpt2, integer_input=True, uses_rng=True,
            tied_weights=True, needs="transformers",
            note="loss_type set explicitly to avoid a logging graph break."),
    ZooCase("hf_llama", make_hf_llama, integer_input=True, uses_rng=True,
            needs="transformers"),
]

ZOO: dict[str, ZooCase] = {c.name: c for c in _CASES}
ZOO_NAMES: list[str] = list(ZOO)

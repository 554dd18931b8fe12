"""Small built-in models for the demo, the tests and the benchmarks.

Every model keeps its repeated layers in an ``nn.ModuleList`` named
``blocks``, so a per-block checkpointing baseline can wrap them one by one.
``make_model`` builds a model, its example inputs and a loss function, all
determined by ``seed``; the global RNG state is left as it was.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[[torch.Tensor], torch.Tensor]


# --- GPT ---------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 512
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} must be a multiple of "
                f"n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, seq, width) -> (batch, head, seq, head_width)
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head)
                   .transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0,
            is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """One pre-norm transformer block: attention then MLP, each residual."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.n_embd)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    """A decoder-only transformer: token ids (batch, seq) -> logits
    (batch, seq, vocab_size)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_out = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # Residual projections start small so the residual stream does not
        # grow with depth.
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0,
                                std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.config.block_size:
            raise ValueError(
                f"GPT: sequence length {seq} exceeds block_size "
                f"{self.config.block_size}; pass shorter inputs or raise "
                f"GPTConfig.block_size")
        pos = torch.arange(seq, device=idx.device)
        x = self.emb_dropout(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_out(x))


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of logits (batch, seq, vocab) against
    targets (batch, seq)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           targets.reshape(-1))


# --- ConvNet -----------------------------------------------------------------

class ConvBlock(nn.Module):
    """conv 3x3 -> batch norm -> relu, then 2x2 max pooling."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1,
                              bias=False)
        self.norm = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.relu(self.norm(self.conv(x))), 2)


class ConvNet(nn.Module):
    """Images (batch, in_channels, H, W) -> class logits (batch, n_classes).
    Each block halves H and W."""

    def __init__(self, *, in_channels: int = 3, widths: tuple[int, ...] = (16, 32),
                 n_classes: int = 10) -> None:
        super().__init__()
        channels = (in_channels, *widths)
        self.blocks = nn.ModuleList(
            ConvBlock(c_in, c_out) for c_in, c_out in zip(channels, channels[1:]))
        self.head = nn.Linear(widths[-1], n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


# --- MLP ---------------------------------------------------------------------

class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class MLP(nn.Module):
    """Features (batch, in_features) -> logits (batch, n_classes) through
    ``depth`` hidden layers of ``width``."""

    def __init__(self, *, in_features: int = 64, width: int = 256,
                 depth: int = 4, n_classes: int = 10) -> None:
        super().__init__()
        self.input = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(MLPBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.input(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# --- make_model --------------------------------------------------------------

# Per model and size: the constructor's settings and the batch shape.
_GPT_SIZES = {
    "tiny": (GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                       n_embd=32), 2),
    "small": (GPTConfig(vocab_size=512, block_size=128, n_layer=4, n_head=4,
                        n_embd=128), 4),
    "medium": (GPTConfig(vocab_size=2048, block_size=256, n_layer=8, n_head=8,
                         n_embd=256), 8),
    # GPT-2 small's shape: for a GPU (about 15 GiB of activations saved).
    "large": (GPTConfig(vocab_size=8192, block_size=1024, n_layer=12, n_head=12,
                        n_embd=768), 8),
}
_CNN_SIZES = {  # widths, batch, image side
    "tiny": ((4, 8), 2, 8),
    "small": ((16, 32, 64), 8, 32),
    "medium": ((32, 64, 128, 256), 16, 64),
    "large": ((64, 128, 256, 512), 64, 128),
}
_MLP_SIZES = {  # in_features, width, depth, batch
    "tiny": (8, 16, 2, 4),
    "small": (64, 256, 4, 32),
    "medium": (256, 1024, 8, 128),
    "large": (1024, 4096, 8, 4096),
}
_N_CLASSES = 10


def _make_gpt(size: str, generator: torch.Generator, device: str):
    config, batch = _GPT_SIZES[size]
    model = GPT(config)
    shape = (batch, config.block_size)
    idx = torch.randint(config.vocab_size, shape, generator=generator).to(device)
    targets = torch.randint(config.vocab_size, shape, generator=generator).to(device)
    return model, (idx,), functools.partial(gpt_loss, targets=targets)


def _make_cnn(size: str, generator: torch.Generator, device: str):
    widths, batch, side = _CNN_SIZES[size]
    model = ConvNet(widths=widths, n_classes=_N_CLASSES)
    images = torch.randn(batch, 3, side, side, generator=generator).to(device)
    labels = torch.randint(_N_CLASSES, (batch,), generator=generator).to(device)
    return model, (images,), functools.partial(F.cross_entropy, target=labels)


def _make_mlp(size: str, generator: torch.Generator, device: str):
    in_features, width, depth, batch = _MLP_SIZES[size]
    model = MLP(in_features=in_features, width=width, depth=depth,
                n_classes=_N_CLASSES)
    features = torch.randn(batch, in_features, generator=generator).to(device)
    labels = torch.randint(_N_CLASSES, (batch,), generator=generator).to(device)
    return model, (features,), functools.partial(F.cross_entropy, target=labels)


_MAKERS = {"gpt": (_make_gpt, _GPT_SIZES), "cnn": (_make_cnn, _CNN_SIZES),
           "mlp": (_make_mlp, _MLP_SIZES)}
MODEL_NAMES = tuple(_MAKERS)


def make_model(name: str, *, size: str = "small", seed: int = 0, device: str = "cpu"
               ) -> tuple[nn.Module, tuple[torch.Tensor, ...], LossFn]:
    """Build a built-in model in training mode, with example inputs and a
    loss function ``loss_fn(output) -> scalar`` (the targets are bound in).

    One training step is ``loss_fn(model(*inputs)).backward()``. The same
    name, size and seed give the same weights, inputs and targets, drawn on
    the host and then moved to ``device`` with the model.
    """
    if name not in _MAKERS:
        raise ValueError(f"unknown model {name!r}; valid names: "
                         f"{', '.join(MODEL_NAMES)}")
    maker, sizes = _MAKERS[name]
    if size not in sizes:
        raise ValueError(f"unknown size {size!r} for model {name!r}; valid "
                         f"sizes: {', '.join(sizes)}")
    # Weights come from the global RNG (nn.Module initialisers use it); fork
    # it so that building a model does not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        model, inputs, loss_fn = maker(size, generator, device)
    model.to(device).train()
    return model, inputs, loss_fn

"""Three tiny graphs whose plans are pinned: a chain, a diamond, and an
attention block. Sizes are chosen so bytes read in whole KiB."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)).sin()).tanh().sum()


class Diamond(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        a = self.fc(x)
        return (a.sin() * a.cos()).exp().sum()


class Attention(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        y = F.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d)).square().mean()


def graphs():
    torch.manual_seed(0)
    return {
        "chain": (Chain(), (torch.randn(32, 64),)),
        "diamond": (Diamond(), (torch.randn(32, 64),)),
        "attention": (Attention(), (torch.randn(2, 16, 64),)),
    }

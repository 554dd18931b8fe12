"""The host dropout's two halves as operators of their own (the pass that
uses them: fxckpt/passes/dropout.py):

* ``fxckpt::dropout_mask(x, p)``: the draw, a bool mask (random);
* ``fxckpt::apply_dropout_mask(x, mask, scale)``: ``x`` times the mask
  times ``scale`` (pointwise, deterministic).

They draw and compute exactly what ``native_dropout`` does on the host.
"""

from __future__ import annotations

import torch

_lib = torch.library.Library("fxckpt", "FRAGMENT")
_lib.define("dropout_mask(Tensor x, float p) -> Tensor",
            tags=(torch.Tag.nondeterministic_seeded,))
_lib.define("apply_dropout_mask(Tensor x, Tensor mask, float scale) -> Tensor",
            tags=(torch.Tag.pointwise,))


def _dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    # native_dropout's own draw on the host: bernoulli_ on a tensor like x.
    return torch.empty_like(x).bernoulli_(1.0 - p).to(torch.bool)


def _apply_dropout_mask(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    # The mask scaled in x's dtype, then the product: native_dropout's
    # rounding in every dtype (half and bfloat16 included).
    return x.mul(mask.to(x.dtype).mul_(scale))


_lib.impl("dropout_mask", _dropout_mask, "CPU")
_lib.impl("apply_dropout_mask", _apply_dropout_mask, "CPU")
torch.library.register_fake("fxckpt::dropout_mask", _dropout_mask, lib=_lib)
torch.library.register_fake("fxckpt::apply_dropout_mask", _apply_dropout_mask, lib=_lib)

DROPOUT_MASK = torch.ops.fxckpt.dropout_mask.default
APPLY_DROPOUT_MASK = torch.ops.fxckpt.apply_dropout_mask.default

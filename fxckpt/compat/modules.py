"""nn.Module internals fxckpt reads (see fxckpt/compat/__init__.py)."""

from __future__ import annotations

import torch.nn as nn

# The code object of nn.Module's call machinery: a frame running it is a
# module being called (its hooks, then its forward).
CALL_IMPL_CODE = nn.Module._call_impl.__code__


def own_buffers(module: nn.Module) -> dict:
    """The module's own buffers by name, as it holds them (a value may be
    None); writing to the mapping sets them."""
    return module._buffers

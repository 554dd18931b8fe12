"""``budget="fit"``: plan the step to the memory a CUDA device has free.

At the first graph's compile, the budget becomes

    (free + cached) x (1 - FIT_MARGIN) - FIT_SLACK

where ``free`` is what the driver reports free on the graph's device
(``torch.cuda.mem_get_info``) and ``cached`` what PyTorch's caching
allocator holds reserved but unallocated (``memory_reserved -
memory_allocated``), which the step can use too. What the model, the
optimizer and the batch already allocate is in neither, so it is left out
as every byte budget leaves it out. The margin (10%) covers what the memory
model does not see (library workspaces, another process's growth), and the
slack (64 MiB) the caching allocator's rounding: blocks of 1 to 10 MiB come
out of 20 MiB segments, and on a nearly full device what is reserved but
unallocated is in pieces too small for the next block. Measured on an H200:
with 0.6x a GPT step's save-all peak left free, 10% alone ran out of memory
(a 16 MiB block asked for with 13 MiB free and 22 MiB reserved in pieces),
and the same step reserved 17 to 32% more than it allocated. The bytes are
read once and kept: the budget does not follow the device's free memory
afterwards. Each plan made under it says so in its notes.

Only CUDA devices report free memory: elsewhere ``"fit"`` is an error that
names the alternatives, raised when the budget is read if the machine has
no CUDA device, otherwise at the first compile, off the graph's device.
"""

from __future__ import annotations

from typing import Any

import torch

from fxckpt.errors import FxckptError
from fxckpt.options import FIT_ALTERNATIVES, FIT_MARGIN, FIT_SLACK, Budget


def fit_bytes(free: int, cached: int) -> int:
    """The budget ``"fit"`` gives on a device with ``free`` bytes free and
    ``cached`` bytes reserved by PyTorch but unallocated."""
    return max(0, int((free + cached) * (1.0 - FIT_MARGIN)) - FIT_SLACK)


def fit_budget(device: torch.device) -> Budget:
    """``budget="fit"`` read off ``device`` now."""
    if device.type != "cuda":
        raise FxckptError(
            f"budget='fit' plans to the free memory of a CUDA device, and this graph runs "
            f"on {device}, which does not report free memory; {FIT_ALTERNATIVES}")
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return Budget(bytes=fit_bytes(free, max(0, cached)), fit=True)


def fitted_budget(budget: Budget, example_inputs: list[Any]) -> Budget:
    """``budget`` (``"fit"``) read off the device of the graph's tensors."""
    devices = [x.device for x in example_inputs if isinstance(x, torch.Tensor)]
    device = next((d for d in devices if d.type == "cuda"),
                  devices[0] if devices else torch.device("cpu"))
    return fit_budget(device)

"""Moving saved values to host memory and back.

``fxckpt::offload`` copies a device tensor into pinned host memory on a side
stream, so the copy overlaps the forward's compute; the device tensor's
memory is not reused before the copy has read it. ``fxckpt::reload`` copies
it back on the same side stream (so after the offload) and makes the compute
stream wait for it. Both are custom ops, so the rewritten graphs keep them
through Inductor as opaque calls. For host tensors (tests on CPU), both are
plain copies.
"""

from __future__ import annotations

import torch

_streams: dict[torch.device, "torch.cuda.Stream"] = {}


def _side_stream(device: torch.device):
    if device not in _streams:
        _streams[device] = torch.cuda.Stream(device=device)
    return _streams[device]


@torch.library.custom_op("fxckpt::offload", mutates_args=())
def offload(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cuda":
        return x.clone()
    stream = _side_stream(x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    with torch.cuda.stream(stream):
        host.copy_(x, non_blocking=True)
    x.record_stream(stream)
    return host


@offload.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.custom_op("fxckpt::reload", mutates_args=())
def reload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.clone()
    stream = _side_stream(device)
    with torch.cuda.stream(stream):
        value = host.to(device, non_blocking=True)
    torch.cuda.current_stream(device).wait_stream(stream)
    value.record_stream(torch.cuda.current_stream(device))
    return value


@reload.register_fake
def _(host, device):
    return torch.empty(host.shape, dtype=host.dtype, device=device)

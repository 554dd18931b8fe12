"""How fast values move between a device and host memory: the price of offload.

Measured once per device and kept for the process: on CUDA, a 64 MiB copy
each way between the device and pinned host memory, timed with CUDA events
(best of three, after a warm-up), and the slower direction is the figure; on
any other device a plain copy of the same size (a stand-in, since offload
there degrades to save). ``Options.offload_bandwidth`` overrides it.
"""

from __future__ import annotations

import time
from functools import lru_cache

import torch

_PROBE_BYTES = 64 * 2**20
_REPEATS = 3


def offload_bandwidth(device: str, setting: float | None) -> float:
    """Bytes per second one way: ``setting`` if given, else measured."""
    if setting is not None:
        return float(setting)
    return measured_bandwidth(device)


@lru_cache(maxsize=None)
def measured_bandwidth(device: str) -> float:
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return _cuda_bandwidth(torch.device(device))
    return _host_copy_bandwidth()


def _cuda_bandwidth(device: torch.device) -> float:
    host = torch.empty(_PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device=device)
    slowest = 0.0
    for copy in (lambda: on_device.copy_(host, non_blocking=True),
                 lambda: host.copy_(on_device, non_blocking=True)):
        copy()
        best = float("inf")
        for _ in range(_REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        slowest = max(slowest, best)
    return _PROBE_BYTES / slowest


def _host_copy_bandwidth() -> float:
    source = torch.ones(_PROBE_BYTES, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(_REPEATS):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return _PROBE_BYTES / max(best, 1e-9)

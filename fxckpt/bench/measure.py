"""Real measurements of a training step: peak memory, saved activations, time.

Nothing here depends on the fxckpt pipeline, so these numbers can check its
predictions.

Peak memory on CPU comes from the PyTorch profiler's allocator events: with
``profile_memory`` on, c10's CPU allocator reports every allocation and
free with its address and exact size. Summing the sizes of the blocks the
step allocated, less those it freed again, in order, gives the bytes
allocated above the level at entry at every moment; the peak is their
running maximum. Blocks allocated before the step are not counted, and
neither are their frees, so a step that frees older tensors is measured as
if it kept them. Memory that bypasses c10's allocator (oneDNN scratch
space, NumPy arrays) is not seen.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch



StepFn = Callable[[], Any]


@contextlib.contextmanager
def using_threads(threads: int):
    """torch's intra-op thread count set to ``threads`` inside, as it was after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --- peak memory -------------------------------------------------------------

def measure_peak_bytes(step_fn: StepFn, *, device: str | torch.device | None = None
                       ) -> int:
    """Run ``step_fn()`` once and return the peak number of bytes allocated
    above the level at entry while it ran.

    ``device`` is where the step allocates: ``None`` or ``"cpu"`` for the
    CPU, a CUDA device for the GPU. To measure one training step, set the
    gradients to ``None`` first, so the step allocates them afresh.
    """
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        return _cuda_peak_bytes(step_fn, device)
    if device.type == "cpu":
        return peak_of(cpu_memory_deltas(step_fn))
    raise ValueError(f"measure_peak_bytes: device {device} is not supported; "
                     f"use 'cpu' or a CUDA device")


def _cuda_peak_bytes(step_fn: StepFn, device: torch.device) -> int:
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step_fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - baseline)


def peak_of(deltas: Iterable[int]) -> int:
    """The largest running total of a sequence of allocation (+) and free (-)
    sizes, starting from zero."""
    level = peak = 0
    for delta in deltas:
        level += delta
        peak = max(peak, level)
    return peak


def cpu_memory_deltas(step_fn: StepFn) -> list[int]:
    """Run ``step_fn()`` once and return, in the order they happened, the
    sizes of the CPU blocks it allocated (positive) and of those it freed
    again (negative).

    Frees of blocks allocated before the step are left out, so the running
    total is the bytes allocated during the step and still alive.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step_fn()
    return block_deltas(prof.profiler.kineto_results.experimental_event_tree())


def block_deltas(roots) -> list[int]:
    """From a profile's event tree (``kineto_results.experimental_event_tree()``),
    in the order they happened, the sizes of the CPU blocks allocated
    (positive) and of those freed again (negative); frees of blocks
    allocated before the profile are left out."""
    # The event kind is read by name: this instrument imports nothing of
    # fxckpt (not even its compat layer), so that it checks the memory model
    # without sharing code with it.
    events, stack = [], list(roots)
    while stack:
        event = stack.pop()
        if getattr(event.tag, "name", None) == "Allocation":
            events.append(event)
        stack.extend(event.children)
    events.sort(key=lambda event: event.start_time_ns)  # stable for ties
    alive: dict[int, int] = {}  # address -> size, of blocks allocated meanwhile
    deltas = []
    for event in events:
        block = event.extra_fields
        if block.device.type != "cpu":
            continue
        if block.alloc_size > 0:
            alive[block.ptr] = block.alloc_size
            deltas.append(block.alloc_size)
        elif block.ptr in alive:
            deltas.append(-alive.pop(block.ptr))
    return deltas


# --- saved activations -------------------------------------------------------

@dataclass(frozen=True)
class SavedReport:
    """The tensors a forward saved for backward, each storage counted once.

    ``total_bytes`` is the sum of the saved storages' sizes (a saved view
    keeps its whole storage alive); ``count`` is the number of distinct
    non-empty storages; ``output`` is what the forward returned, for the caller to run
    backward on.
    """

    total_bytes: int
    count: int
    output: Any = field(default=None, repr=False, compare=False)


def measure_saved_bytes(step_fn_forward: StepFn, *,
                        exclude: Iterable[torch.Tensor] = ()) -> SavedReport:
    """Run ``step_fn_forward()`` and measure what it saves for backward.

    Tensors whose storage is shared with one in ``exclude`` (pass the
    parameters and buffers) are not counted: they live anyway. The tensors
    are saved unchanged, so backward on ``SavedReport.output`` still works.
    """
    excluded = {_storage_key(tensor) for tensor in exclude}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        # Empty storages all share the null pointer and cost nothing.
        if storage.nbytes() and _storage_key(tensor) not in excluded:
            saved.setdefault(_storage_key(tensor), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = step_fn_forward()
    return SavedReport(total_bytes=sum(saved.values()), count=len(saved),
                       output=output)



# --- time --------------------------------------------------------------------

def synchronize(device: str | torch.device) -> None:
    """Wait for ``device`` to finish its queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step_fn: StepFn, *, repeat: int, warmup: int = 1,
               device: str | torch.device | None = None, min_seconds: float = 0.0,
               cpu_seconds: list[float] | None = None) -> list[float]:
    """Run ``step_fn()`` ``warmup`` times untimed, then ``repeat`` times (and
    more, up to 20 times as many, until ``min_seconds`` have passed, so short
    steps get enough samples), and return each timed run's wall-clock
    seconds. On a CUDA device, the clock stops only after the device has
    finished the step's work. ``cpu_seconds``, if given, gets each timed
    run's calling-thread CPU seconds: on the CPU with one torch thread,
    forward and backward both run on the calling thread, so that is the
    step's work without the time other processes on a shared machine take."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"time_steps: need repeat >= 1 and warmup >= 0, got "
                         f"repeat={repeat}, warmup={warmup}")
    device = torch.device("cpu" if device is None else device)
    sync = functools.partial(synchronize, device)
    for _ in range(warmup):
        step_fn()
    sync()
    times: list[float] = []
    while len(times) < repeat or (sum(times) < min_seconds and len(times) < 20 * repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step_fn()
        sync()
        times.append(time.perf_counter() - start)
        if cpu_seconds is not None:
            cpu_seconds.append(time.thread_time() - start_cpu)
    return times


def _storage_key(tensor: torch.Tensor) -> int:
    # Kept apart from fxckpt.memory.model's on purpose: this module imports nothing
    # of the pipeline whose predictions it checks.
    return tensor.untyped_storage().data_ptr()

"""A training step's measured peak on a CUDA device, against the budget.

The memory model predicts what the plans hold; tensors made outside the
compiled graphs (a loss or an output layer computed eagerly, with each
block compiled on its own), a kernel holding scratch the model does not
know, or the allocator handing out more than asked can take the real step
over a byte budget. On CUDA the allocator's own counters say so.

The allocator's peak counter cannot be reset without changing what the
user reads from it, so it is read, not reset: its value at the end of a
watched step's backward, if above its value when the step began, is the
step's peak (less what was allocated when the step began). If the process
had peaked higher before, the step's own peak is not known; a step in which
a graph was compiled (a graph break) is not read either, as compiling can
allocate on the device, and the next step is watched instead.

A step read over its budget is corrected for (``Backend._on_new_step``):
what it held beyond the memory model's reading is kept aside from then on,
and the step's graphs are planned again for the rest, or BudgetError names
the smallest budget that fits with it. The CPU keeps no such counters, and
a profiler cannot watch the step from the library: started on the caller's
thread, it cannot be stopped where the backward ends (the autograd engine
restores the caller's thread state after it), and left running it would
refuse the user's own.
"""

from __future__ import annotations

import warnings

import torch


class StepPeakWatch:
    """The allocator's peak over one step on ``device``, from ``start()`` to
    ``peak()``; ``reader`` has torch.cuda's ``memory_allocated`` and
    ``max_memory_allocated``."""

    def __init__(self, device: torch.device, reader=None) -> None:
        # None: torch.cuda, looked up when read (a module does not deep-copy).
        self.device, self._reader = device, reader
        self.allocated_at_start = self.peak_before = 0
        self.queued = False      # its reading is queued for the end of backward
        self.compiled_meanwhile = False   # a graph compiled inside the step: not read

    @property
    def reader(self):
        return self._reader if self._reader is not None else torch.cuda

    def start(self) -> None:
        self.allocated_at_start = self.reader.memory_allocated(self.device)
        self.peak_before = self.reader.max_memory_allocated(self.device)

    def peak(self) -> int | None:
        """Bytes the step allocated at its peak above what was allocated
        when it began; None when the process's peak did not move (its own
        peak is then unknown, and no higher than the earlier one). A block
        made once and kept (cuBLAS's workspace at the process's first
        matmul) counts in the step that made it: it cannot be told from the
        gradients of parameters outside the graphs, which the step does
        make, so it is kept aside too, on the safe side."""
        after = self.reader.max_memory_allocated(self.device)
        if after <= self.peak_before:
            return None
        return after - self.allocated_at_start


class StepPeakReader:
    """The watch of a byte budget's steps: each step's peak on a CUDA
    device read from its first graph's run to the end of its backward,
    until a step is read within the budget, the counters can no longer
    tell (the process peaked higher before), or ``limit`` corrections were
    made. A step read over the budget is left ``pending`` for the step's
    end to correct for.

    ``step_peaks``: the peaks read, in order; ``unwatched``: no step can be
    read (the CPU)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current: StepPeakWatch | None = None
        self.settled = False
        self.unwatched = False
        self.step_peaks: list[int] = []
        self.corrections = 0
        self.pending: tuple[int, torch.device] | None = None

    @property
    def first_step_peak_bytes(self) -> int | None:
        return self.step_peaks[0] if self.step_peaks else None

    def step_begins(self, inputs) -> None:
        """The step's first graph is about to run with ``inputs``."""
        if self.settled:
            return
        device = cuda_device(inputs)
        if device is None:
            self.settled = self.unwatched = True
            return
        self.current = StepPeakWatch(device)
        self.current.start()

    def compiling(self) -> None:
        """A graph compiles inside the watched step (a graph break): what
        compiling allocates is not the step's, so this step is not read."""
        if self.current is not None:
            self.current.compiled_meanwhile = True

    def to_queue(self) -> bool:
        """Whether a backward of the watched step began whose end should
        read it (once per step)."""
        if self.current is None or self.current.queued:
            return False
        self.current.queued = True
        return True

    def read(self, budget: int, format_bytes) -> bool:
        """The watched step's backward ended: True where it measured over
        ``budget`` and is to be corrected for (``pending``)."""
        watch, self.current = self.current, None
        if watch is None or watch.compiled_meanwhile:   # the next step is read instead
            return False
        peak = watch.peak()
        if peak is None:                # unknown, and no later step can be read
            self.settled = True
            return False
        self.step_peaks.append(peak)
        if peak <= budget:
            self.settled = True
            return False
        if self.corrections >= self.limit:
            self.settled = True
            warnings.warn(still_over_warning(peak, budget, watch.device, format_bytes),
                          stacklevel=3)
            return False
        self.pending = (peak, watch.device)
        return True

    def take_pending(self) -> tuple[int, torch.device] | None:
        pending, self.pending = self.pending, None
        return pending


def cuda_device(tensors) -> torch.device | None:
    """The CUDA device of the first CUDA tensor among ``tensors``."""
    for value in tensors:
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return None


def over_budget_warning(peak: int, budget: int, predicted: int, kept: int,
                        device: torch.device, format_bytes) -> str:
    """A watched step peaked over the budget; ``kept`` bytes are now set aside
    for what the memory model did not see (``predicted``: its own reading
    of that step's plans)."""
    return (f"fxckpt: a training step on {device} measured a peak of {format_bytes(peak)} "
            f"({peak} bytes) above what was allocated when its first graph ran, over the "
            f"byte budget of {format_bytes(budget)} by {format_bytes(peak - budget)}; the "
            f"memory model predicted {format_bytes(predicted)} for its plans. It does not "
            f"see tensors made outside the compiled graphs (a loss or an output layer "
            f"computed eagerly), scratch of a kernel it does not know (`fxckpt bench "
            f"--suite scratch --device cuda` lists them), or the allocator's rounding: "
            f"{format_bytes(kept)} ({kept} bytes) are kept aside for that from now on, and "
            f"the step's graphs are planned again for the rest of the budget")


def still_over_warning(peak: int, budget: int, device: torch.device, format_bytes) -> str:
    excess = peak - budget
    return (f"fxckpt: a training step on {device} still measured a peak of "
            f"{format_bytes(peak)} ({peak} bytes), over the byte budget of "
            f"{format_bytes(budget)} by {format_bytes(excess)}, after its plans were "
            f"corrected for what the memory model does not see; no more corrections are "
            f"made. Lower the budget by {excess} bytes to keep the step within "
            f"{format_bytes(budget)}.")


def made_after_the_graphs(grad) -> bool:
    """Whether the gradient reaching a step's first backward was made by
    autograd code after the compiled graphs (an output layer or loss left
    eager): not a loss's seed (a scalar), not the zeros of an output the
    loss does not use."""
    # A meta tensor holds no values to read (and no memory to count).
    return isinstance(grad, torch.Tensor) and grad.dim() > 0 and grad.device.type != "meta" \
        and bool(grad.any())


def uncounted_outside_warning(budget: int, format_bytes) -> str:
    """On the CPU, where no step's peak can be read: code after the graphs
    holds memory the budget does not count."""
    return (f"fxckpt: this step runs autograd code after its compiled graphs (an output "
            f"layer or loss left outside torch.compile, or code between graph breaks): "
            f"what it holds is not counted in the budget of {format_bytes(budget)}, and on "
            f"the CPU no step's peak can be read to correct for it, so the step may exceed "
            f"the budget by that much. Compile that code too, or leave it room in the "
            f"budget (on a CUDA device the step's measured peak is corrected for)")

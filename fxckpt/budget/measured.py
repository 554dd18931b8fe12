"""The first training step's measured peak on a CUDA device, against the budget.

The memory model predicts what the plans hold; a kernel holding scratch the
model does not know, or the allocator handing out more than asked, can take
the real step over a byte budget. On CUDA the allocator's own counters say
so, and a step over its budget is then reported instead of passing
silently.

The allocator's peak counter cannot be reset without changing what the
user reads from it, so it is read, not reset: its value at the end of the
first backward, if above its value when the step began, is the step's peak
(less what was allocated when the step began). If the process had peaked
higher before, the step's own peak is not known and nothing is said; nor
where a graph was compiled inside the step (a graph break), as compiling
can allocate on the device.
"""

from __future__ import annotations

import torch


class StepPeakWatch:
    """The allocator's peak over one step on ``device``, from ``start()`` to
    ``peak()``; ``reader`` has torch.cuda's ``memory_allocated`` and
    ``max_memory_allocated``."""

    def __init__(self, device: torch.device, reader=torch.cuda) -> None:
        self.device, self.reader = device, reader
        self.allocated_at_start = self.peak_before = 0
        self.queued = False      # its reading is queued for the end of backward
        self.compiled_meanwhile = False   # a graph compiled inside the step: not read

    def start(self) -> None:
        self.allocated_at_start = self.reader.memory_allocated(self.device)
        self.peak_before = self.reader.max_memory_allocated(self.device)

    def peak(self) -> int | None:
        """Bytes the step allocated at its peak above what was allocated
        when it began; None when the process's peak did not move (its own
        peak is then unknown, and no higher than the earlier one)."""
        after = self.reader.max_memory_allocated(self.device)
        if after <= self.peak_before:
            return None
        return after - self.allocated_at_start


def cuda_device(tensors) -> torch.device | None:
    """The CUDA device of the first CUDA tensor among ``tensors``."""
    for value in tensors:
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return value.device
    return None


def over_budget_warning(peak: int, budget: int, device: torch.device, format_bytes) -> str:
    excess = peak - budget
    return (f"fxckpt: the first training step on {device} measured a peak of "
            f"{format_bytes(peak)} ({peak} bytes) above what was allocated when it began, "
            f"over the byte budget of {format_bytes(budget)} by {format_bytes(excess)}: "
            f"the memory model missed memory this step allocates (scratch of a kernel it "
            f"does not know, the allocator's rounding of large blocks, or tensors made "
            f"outside the compiled graphs). Lower the budget by {excess} bytes to keep "
            f"the step within {format_bytes(budget)}, and `fxckpt bench --suite scratch "
            f"--device cuda` lists the kernels whose scratch the model does not count.")

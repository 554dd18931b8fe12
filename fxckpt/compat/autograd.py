"""autograd's engine and saved tensors, and the profiler's allocation
events, as fxckpt reads them (see fxckpt/compat/__init__.py)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["TorchDispatchMode", "no_dispatch_modes", "queue_at_backward_end",
           "current_backward", "saved_tensor", "unpacked", "top_saved_tensors_hooks",
           "version", "profiler_enabled", "exclude_inplace_or_view", "host_allocations"]

no_dispatch_modes = _disable_current_modes


def queue_at_backward_end(callback: Callable[[], Any]) -> None:
    """Run ``callback`` when the backward running now ends."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def current_backward() -> Any:
    """What identifies the backward running now (its graph task or the
    group of tasks ``torch.autograd.grad`` runs together), or None outside
    backward."""
    group = torch._C._get_graph_exec_group()
    if group is not None:
        return group
    task = torch._C._current_graph_task_id()
    return None if task == -1 else task


def top_saved_tensors_hooks():
    """(pack, unpack) of the innermost saved-tensor hooks, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


class _Kept(torch.autograd.Function):
    """A node that saves one tensor for a backward it never runs."""

    @staticmethod
    def forward(dummy, tensor):
        return dummy.detach()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, *grads):
        raise AssertionError("fxckpt's saved-tensor node is never run backward")


class _Packed:
    """A tensor saved through the hooks around it, where torch has no
    ``_make_saved_tensor`` (torch 2.11): as torch 2.11's own checkpoint keeps
    its inputs, saved by an autograd node of its own, so that the innermost
    saved-tensor hooks pack it and unpacking gives back its autograd history
    and checks it was not written in place since."""

    __slots__ = ("kept",)
    # The node's one input that requires grad (so that it is made), shared:
    # an empty leaf no gradient ever reaches.
    _DUMMY = torch.empty((0,), requires_grad=True)

    def __init__(self, tensor: torch.Tensor) -> None:
        with torch.enable_grad():
            self.kept = _Kept.apply(self._DUMMY, tensor)

    def value(self) -> torch.Tensor:
        return self.kept.grad_fn.saved_tensors[0]


try:
    from torch._C._autograd import SavedTensor, _make_saved_tensor
except ImportError:     # torch 2.11
    SavedTensor, _make_saved_tensor = None, None


def saved_tensor(tensor: torch.Tensor):
    """``tensor`` saved as autograd saves what a backward needs: through the
    saved-tensor hooks active now; ``unpacked`` gives it back."""
    if _make_saved_tensor is not None:
        return _make_saved_tensor(tensor, is_output=False)
    return _Packed(tensor)


def unpacked(value):
    """A value ``saved_tensor`` made, given back; anything else as it is."""
    if SavedTensor is not None and isinstance(value, SavedTensor):
        return value.unpack()
    if isinstance(value, _Packed):
        return value.value()
    return value


def version(tensor: torch.Tensor) -> int:
    """The tensor's version counter: how often it was written in place."""
    return tensor._version


def profiler_enabled() -> bool:
    return torch._C._autograd._profiler_enabled()


def host_allocations(profile) -> list[tuple[int, int, int]]:
    """The CPU allocator's events in a finished ``torch.autograd.profiler``
    profile (``profile_memory=True``), as (time in ns, address, bytes:
    positive allocated, negative freed), in the order they happened."""
    found, pending = [], list(profile.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if getattr(event.tag, "name", None) != "Allocation":
            continue
        block = event.extra_fields
        if block.device.type == "cpu":
            found.append((event.start_time_ns, block.ptr, block.alloc_size))
    return sorted(found, key=lambda e: e[0])


def exclude_inplace_or_view():
    """A guard under which ``detach`` makes an alias without autograd's
    view bookkeeping (it still shares the version counter)."""
    return torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False)


def selective_context(*, is_recompute: bool, op_output):
    """torch.utils.checkpoint's SelectiveCheckpointContext for a policy
    function's call, with the op's output (``op_output``, a field from torch
    2.12 on; set on the context for 2.11 too)."""
    from torch.utils.checkpoint import SelectiveCheckpointContext

    try:
        return SelectiveCheckpointContext(is_recompute=is_recompute, op_output=op_output)
    except TypeError:       # torch 2.11
        ctx = SelectiveCheckpointContext(is_recompute=is_recompute)
        ctx.op_output = op_output
        return ctx

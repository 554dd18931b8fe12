"""What a recomputation must see as its forward did, and where an op came from.

``RecomputeState`` captures, when a checkpointed forward starts, the global
state that decides what the function computes: the random number generators
(CPU and accelerator), autocast and the default device. The recomputation in
backward runs under that state, and the generators are put back afterwards,
so that the global RNG after backward is as if nothing had been recomputed.

``ModuleScope`` and ``user_frame`` tell a policy (and an error message) which
module and which line of user code an op belongs to.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn as nn

from fxckpt.compat.modules import CALL_IMPL_CODE
from fxckpt.compat.ops import current_device_context
from fxckpt.errors import FxckptError


# ---------------------------------------------------------------------------
# Random number generators
# ---------------------------------------------------------------------------


def _accelerator() -> tuple[str, Any] | None:
    """The accelerator's device type and module, when it has been initialised.

    An accelerator that was never initialised has no generator state that a
    forward could have consumed, and reading one would initialise it."""
    acc = torch.accelerator.current_accelerator(check_available=True)
    if acc is None:
        return None
    module = getattr(torch, acc.type, None)
    if module is None or not getattr(module, "is_initialized", lambda: False)():
        return None
    return acc.type, module


@dataclass(frozen=True)
class RngSnapshot:
    """The CPU generator's state and the states of the accelerator generators
    of the devices in ``devices`` (indices), all taken at one moment."""

    cpu: torch.Tensor
    device_type: str = ""
    devices: tuple[int, ...] = ()
    device_states: tuple[torch.Tensor, ...] = ()

    @classmethod
    def take(cls, devices: tuple[int, ...] = ()) -> RngSnapshot:
        acc = _accelerator()
        if acc is None or not devices:
            return cls(torch.get_rng_state())
        device_type, module = acc
        return cls(torch.get_rng_state(), device_type, devices,
                   tuple(module.get_rng_state(d) for d in devices))

    def again(self) -> RngSnapshot:
        """A snapshot of the same generators, now."""
        return RngSnapshot.take(self.devices)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.devices:
            module = getattr(torch, self.device_type)
            for device, state in zip(self.devices, self.device_states):
                module.set_rng_state(state, device)

    @contextlib.contextmanager
    def forked(self) -> Iterator[None]:
        """Run the body from this snapshot; the generators' states from before
        are put back afterwards, whatever the body consumed or raised."""
        with torch.random.fork_rng(devices=list(self.devices),
                                   device_type=self.device_type or "cuda"):
            self.restore()
            yield


def _rng_devices(tensors: list[torch.Tensor]) -> tuple[int, ...]:
    """Accelerator devices whose generators the function may draw from: those
    of its tensor inputs and the current device (parameters captured by the
    function usually live there)."""
    acc = _accelerator()
    if acc is None:
        return ()
    device_type, module = acc
    devices = {t.device.index for t in tensors
               if t.device.type == device_type and t.device.index is not None}
    devices.add(module.current_device())
    return tuple(sorted(devices))


# ---------------------------------------------------------------------------
# Autocast and default device
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AutocastState:
    # (device_type, enabled, dtype) for every device type autocast knows here.
    devices: tuple[tuple[str, bool, torch.dtype], ...]
    cache_enabled: bool

    @classmethod
    def capture(cls) -> AutocastState:
        device_types = ["cpu"]
        acc = torch.accelerator.current_accelerator(check_available=True)
        if acc is not None and acc.type != "cpu":
            device_types.append(acc.type)
        devices = tuple(
            (dt, torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt))
            for dt in device_types if torch.amp.is_autocast_available(dt))
        return cls(devices, torch.is_autocast_cache_enabled())

    def entered(self, stack: contextlib.ExitStack) -> None:
        for device_type, enabled, dtype in self.devices:
            stack.enter_context(torch.amp.autocast(
                device_type, enabled=enabled, dtype=dtype,
                cache_enabled=self.cache_enabled))


def _device_context() -> Any:
    """The innermost ``with torch.device(...)`` active now, if any: factory
    functions in the recomputation must allocate where the forward's did."""
    return current_device_context()


# ---------------------------------------------------------------------------
# Everything together
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RecomputeState:
    rng: Optional[RngSnapshot]          # None: preserve_rng_state=False
    autocast: AutocastState
    device_context: Any
    accelerator_was_initialised: bool

    @classmethod
    def capture(cls, tensors: list[torch.Tensor], *,
                preserve_rng_state: bool) -> RecomputeState:
        rng = RngSnapshot.take(_rng_devices(tensors)) if preserve_rng_state else None
        return cls(rng, AutocastState.capture(), _device_context(),
                   _accelerator() is not None)

    def check_after_forward(self) -> None:
        if self.rng is not None and not self.accelerator_was_initialised \
                and _accelerator() is not None:
            raise FxckptError(
                "fxckpt.checkpoint: the checkpointed function initialised the "
                "accelerator, so its random number generator state could not be "
                "recorded before the forward and random ops would not replay. "
                "Initialise it before the checkpointed call (for example with "
                "torch.cuda.init()), or pass preserve_rng_state=False.")

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """The forward's state for the duration of a recomputation."""
        with contextlib.ExitStack() as stack:
            if self.rng is not None:
                stack.enter_context(self.rng.forked())
            self.autocast.entered(stack)
            if self.device_context is not None:
                stack.enter_context(self.device_context)
            yield


# ---------------------------------------------------------------------------
# Where an op comes from
# ---------------------------------------------------------------------------

_INTERNAL_DIRS = (os.path.dirname(torch.__file__) + os.sep,
                  os.path.dirname(os.path.abspath(__file__)) + os.sep)
_INTERNAL_FILES = frozenset({contextlib.__file__, functools.__file__})
_internal_code: dict[types.CodeType, bool] = {}


def _is_internal(code: types.CodeType) -> bool:
    known = _internal_code.get(code)
    if known is None:
        name = code.co_filename
        known = (name.startswith(_INTERNAL_DIRS) or name in _INTERNAL_FILES
                 or name.startswith("<eval_with_key>"))
        _internal_code[code] = known
    return known


def user_frame() -> tuple[str, int] | None:
    """(file, line) of the innermost caller outside torch and fxckpt."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_internal(frame.f_code):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=4096)
def format_where(where: tuple[str, int] | None) -> str:
    """``file.py:12 code``, as ``OpCall.source`` and error messages show it."""
    if where is None:
        return ""
    filename, line = where
    code = linecache.getline(filename, line).strip()
    return f"{os.path.basename(filename)}:{line} {code}".rstrip()


class ModuleScope:
    """The dotted path of the module running now ("blocks.0.attn").

    Read from the Python stack (the module calls between the frame that
    called ``checkpoint`` and the op) rather than kept by global module
    hooks, which torch.compile would trace into. Paths are
    relative to ``root`` (the checkpointed function when it is a module or a
    bound method of one); a module not under the root is named relative to
    the module that called it, or "" when no module called it."""

    def __init__(self, root: nn.Module | None, stop: types.FrameType | None) -> None:
        # By id: a reference to the caller's frame would be a cycle through its
        # locals. The frame outlives every question asked of this scope.
        self.stop = id(stop)
        self._paths: dict[int, str] = {}
        if root is not None:
            self._paths = {id(m): name for name, m in root.named_modules()}

    @staticmethod
    def root_of(fn: Callable) -> nn.Module | None:
        if isinstance(fn, nn.Module):
            return fn
        owner = getattr(fn, "__self__", None)
        return owner if isinstance(owner, nn.Module) else None

    def current(self) -> str:
        path = ""
        parent = None
        for module in reversed(self._running_modules()):
            path = self._path_of(module, parent, path)
            parent = module
        return path

    def _running_modules(self) -> list[nn.Module]:
        """Modules being called now, innermost first: every module call runs
        a frame of ``nn.Module._call_impl``."""
        modules: list[nn.Module] = []
        frame = sys._getframe(2)
        while frame is not None and id(frame) != self.stop:
            if frame.f_code is CALL_IMPL_CODE:
                modules.append(frame.f_locals["self"])
            frame = frame.f_back
        return modules

    def _path_of(self, module: nn.Module, parent: nn.Module | None, parent_path: str) -> str:
        path = self._paths.get(id(module))
        if path is not None:
            return path
        path = parent_path
        if parent is not None:
            for name, sub in parent.named_modules():
                if sub is module:
                    path = ".".join(p for p in (parent_path, name) if p)
                    break
        self._paths[id(module)] = path
        return path

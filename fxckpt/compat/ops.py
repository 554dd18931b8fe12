"""torch's operator objects, tensor subclasses and pytree, as fxckpt reads
them (see fxckpt/compat/__init__.py for the table)."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch._library.utils import is_impure
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
from torch._subclasses import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

__all__ = [
    "HigherOrderOperator", "OpOverload", "OpOverloadPacket", "FakeTensor", "pytree",
    "detect_fake_mode", "is_impure", "run_and_save_rng_state", "run_with_rng_state",
    "is_fake", "storage_id", "schema", "overload_name", "qualified_name", "is_mutable", "dispatch_op_names",
    "mutable_args", "unwrapped_functional", "current_device_context",
    "FunctionalTensor",
]


def storage_id(tensor: torch.Tensor) -> int:
    """What identifies the storage ``tensor`` lives in while it is alive
    (RuntimeError or NotImplementedError for tensors without one)."""
    return tensor.untyped_storage()._cdata


def is_fake(value) -> bool:
    return isinstance(value, FakeTensor)


def schema(op: OpOverload):
    """The op's schema (arguments, returns, alias information)."""
    return op._schema


def overload_name(op: OpOverload) -> str:
    return op._overloadname


def qualified_name(op) -> str | None:
    """``ns::name`` of an op overload packet (None for other targets)."""
    return getattr(op, "_qualified_op_name", None)


def is_mutable(op: OpOverload) -> bool:
    return op._schema.is_mutable


def dispatch_op_names() -> list[str]:
    """Every operator name registered with the dispatcher, "ns::name"."""
    return torch._C._dispatch_get_all_op_names()


def mutable_args(op: OpOverload) -> list[str]:
    """The names of the arguments ``op`` mutates (what ``auto_functionalized``
    passes as the buffers it writes)."""
    from torch._higher_order_ops.auto_functionalize import get_mutable_args

    return get_mutable_args(op)[0]


def unwrapped_functional(tensor):
    """The tensor a FunctionalTensor wraps (itself for any other tensor)."""
    if isinstance(tensor, FunctionalTensor):
        return torch._from_functional_tensor(tensor.elem)
    return tensor


def current_device_context():
    """The innermost ``with torch.device(...)`` active now, or None."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return mode
    return None

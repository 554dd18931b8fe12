"""Sizes of a graph's values, as the memory models read them: a size that
may be symbolic made concrete (at given sizes, or at its hint), a value's
tensors, bytes and device.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.fx as fx

from fxckpt.compat.ops import pytree, run_and_save_rng_state, storage_id


def leaves(val) -> list:
    """``val``'s leaves (a tensor is its own: the common case, without pytree)."""
    return [val] if isinstance(val, torch.Tensor) else pytree.tree_leaves(val)


def device_type(node: fx.Node) -> str:
    """The device type of the first tensor ``node`` makes ("" for none)."""
    for v in leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            return v.device.type
    return ""


# PyTorch's CUDA caching allocator hands out blocks in multiples of 512 bytes,
# and its allocated-bytes count (what a step's peak is measured by) counts
# the blocks.
CUDA_BLOCK_BYTES = 512


def has_symbolic_sizes(tensor: torch.Tensor) -> bool:
    """Whether a tensor's sizes, strides or offset hold a symbol."""
    sizes = (*tensor.shape, *tensor.stride(), tensor.storage_offset())
    return any(isinstance(s, torch.SymInt) for s in sizes)


def concrete(x) -> int:
    """An int from a size that may be symbolic: under ``at_sizes`` its value
    at those sizes, else its hint (0 when it has none)."""
    if isinstance(x, torch.SymInt):
        bindings = _sizes.get()
        if bindings:
            env = x.node.shape_env
            known = {**(getattr(env, "backed_var_to_val", None) or env.var_to_val), **bindings}
            value = x.node.expr
            value = value.xreplace(known) if hasattr(value, "xreplace") else value
            if isinstance(value, int) or value.is_number:
                return int(value)
        return int(x.node.hint or 0)
    return int(x)


_sizes: contextvars.ContextVar[dict | None] = contextvars.ContextVar("sizes", default=None)


@contextlib.contextmanager
def at_sizes(bindings: dict):
    """Read symbolic sizes at ``bindings`` (sympy symbol -> int) inside."""
    token = _sizes.set(bindings)
    try:
        yield
    finally:
        _sizes.reset(token)


def tensor_bytes(val) -> int:
    """Bytes of the tensors in ``val`` (a tensor or a structure of them)."""
    return sum(concrete(v.numel()) * v.element_size() for v in leaves(val)
               if isinstance(v, torch.Tensor))


def storage_key(t: torch.Tensor) -> int | None:
    """What identifies the storage a tensor lives in (views share it), while
    it is alive; None for tensors without one (sparse, some subclasses)."""
    try:
        return storage_id(t)
    except (RuntimeError, NotImplementedError):
        return None


def node_bytes(node) -> int:
    return tensor_bytes(node.meta.get("val")) if isinstance(node, fx.Node) else 0


def output_bytes(node: fx.Node) -> int:
    """Bytes of an op's result (for an RNG wrapper: the wrapped op's result)."""
    val = node.meta.get("val")
    if node.target is run_and_save_rng_state and isinstance(val, tuple):
        val = val[1]
    return tensor_bytes(val)


def element_size(node: fx.Node) -> int:
    value = node.meta.get("val")
    return value.element_size() if isinstance(value, torch.Tensor) else 0

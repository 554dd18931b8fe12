"""What an op holds inside its own call besides its output: its workspace
and the CPU kernels' scratch buffers, by rule, or measured by running the
op once (memory/cpu_conv.py), and the storages losses reduce into.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fxckpt.compat.ops import run_and_save_rng_state, run_with_rng_state
from fxckpt.kernels.dropout import APPLY_DROPOUT_MASK, DROPOUT_MASK
from fxckpt.memory.cpu_conv import MEASURED_OPS, measured_scratch
from fxckpt.memory.cuda_scratch import cuda_scratch
from fxckpt.memory.values import (concrete, device_type, element_size, has_symbolic_sizes,
                                  node_bytes, output_bytes)

_aten = torch.ops.aten


def workspace_bytes(node: fx.Node) -> int:
    """Scratch memory an op allocates and frees inside its own call.

    Measured on torch 2.13's CPU kernels (fxckpt's memory tests check it):
    CPU dropout draws a float mask before narrowing it to bool, and its
    backward widens the mask back; a convolution's scratch is measured by
    running it (memory/cpu_conv.py), and where it cannot be, oneDNN's is
    counted: its forward writes the output through a temporary of the
    same size, and its backward holds copies of its three tensor operands
    (channels-last convolutions hold far more); batch-norm backward holds
    one input-sized buffer; addmm copies its bias; dropout's backward also wraps its scale
    as two scalar tensors; an elementwise op given a Python number (``x *
    0.5``, ``x != 0``) wraps it as a tensor (8 bytes) and converts it, and
    each tensor operand of another dtype, to the dtype it computes in. CUDA
    kernels of these ops are fused or take scalars as arguments: counted as
    0; CUDA's attention kernels and embedding backward hold buffers
    (``cuda_scratch``). Layer norm's CPU backward holds a float row per
    parameter gradient per thread, cumsum converts its input to the
    output's dtype, and functional batch norm holds two float rows
    (``_CPU_BUFFERS``; ``fxckpt bench --suite scratch`` checks each planned
    op against all of this).
    ``_safe_softmax`` (the attention softmax of a row that may be all
    -inf) is ATen's own composite code on every device: besides its output
    it holds a bool mask of its input, the mask reduced over ``dim`` and a
    scalar (torch 2.13's profiler on CPU).
    """
    if node.target is _aten._safe_softmax.default:
        return _safe_softmax_scratch(node)
    target, args, extra = node.target, node.args, 0
    if target is run_with_rng_state:
        # Holds the generator state it replaces while the op runs (a host
        # tensor on CUDA).
        target, args, extra = args[1], args[2:], node_bytes(args[0])
    elif target is run_and_save_rng_state:
        target, args = args[0], args[1:]
    device = device_type(node)
    if device == "cuda":
        return cuda_scratch(target, args, concrete)
    if device != "cpu":
        return 0
    packet = getattr(target, "overloadpacket", None)
    if packet in MEASURED_OPS or _measured_here(packet, args):
        measured = measured_scratch(target, args, concrete)
        if measured is not None:
            return extra + measured
    operand = _WORKSPACE.get(packet, ())
    if packet is _aten.native_dropout_backward:
        # Its scale, wrapped as tensors: a double, then one of the output's dtype.
        extra += 8 + element_size(node)
    elif packet in _WRAPS_NUMBERS:
        extra += _promotion_bytes(packet, args)
    elif packet in _CPU_BUFFERS:
        extra += _CPU_BUFFERS[packet](node, args)
    return extra + sum(node_bytes(args[i]) if i >= 0 else output_bytes(node) for i in operand)


def _measured_here(packet, args) -> bool:
    """CPU calls whose scratch depends on more than a rule of a few lines
    reads, measured as convolutions are: a matmul with an operand in neither
    row- nor column-major order (the real part of a complex tensor: mm copies
    it), abs and angle of a complex tensor (a complex temporary), and a mean
    in reduced precision (its input widened to float)."""
    kinds = _MEASURED_WHEN.get(packet)
    if kinds is None:
        return False
    tensors = [a.meta.get("val") for a in args if isinstance(a, fx.Node)]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.layout == torch.strided
               and not has_symbolic_sizes(t)]
    return any(kinds(t) for t in tensors)


def _blas_layout(t: torch.Tensor) -> bool:
    """Whether a matmul operand's last two dimensions are in row- or
    column-major order (dimensions of size 1 take any stride)."""
    if t.dim() < 2:
        return True
    rows, cols = t.shape[-2], t.shape[-1]
    row_stride, col_stride = t.stride()[-2], t.stride()[-1]
    row_major = (cols == 1 or col_stride == 1) and (rows == 1 or row_stride >= cols)
    column_major = (rows == 1 or row_stride == 1) and (cols == 1 or col_stride >= rows)
    return row_major or column_major


def _mean_buffers(node: fx.Node, args) -> int:
    """The count it divides by, wrapped as a double and converted to the
    result's dtype (measured: 12 bytes for float32, 16 for float64; reduced
    precision is measured instead)."""
    return 8 + element_size(node)


def _layer_norm_backward_buffers(node: fx.Node, args) -> int:
    """Per thread, a float row of the weight's and of the bias's gradient
    (those asked for), summed after (torch 2.13's CPU kernel; fxckpt bench
    --suite scratch measured 2 x 64 x 4 bytes at one thread, twice that at
    two)."""
    mask = args[7] if len(args) > 7 and isinstance(args[7], (list, tuple)) else (True,) * 3
    width = 1
    for size in (args[2] if len(args) > 2 and isinstance(args[2], (list, tuple)) else ()):
        width *= concrete(size)
    return torch.get_num_threads() * width * 4 * (bool(mask[1]) + bool(mask[2]))


def _cumsum_buffers(node: fx.Node, args) -> int:
    """A copy of the input in the output's dtype, where they differ (a bool
    mask summed into int64: 8 bytes an element)."""
    value, out = _tensor_of(args[0]), node.meta.get("val")
    if value is None or not isinstance(out, torch.Tensor) or value.dtype == out.dtype:
        return 0
    return concrete(value.numel()) * out.element_size()


def _batch_norm_buffers(node: fx.Node, args) -> int:
    """Two float rows of the channels (the batch's mean and variance)."""
    value = _tensor_of(args[0])
    if value is None or value.dim() < 2:
        return 0
    return 2 * concrete(value.shape[1]) * 4


def _tensor_of(arg) -> torch.Tensor | None:
    """The tensor a graph argument holds (its fake value), else None."""
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _promotion_bytes(packet, args) -> int:
    """Scratch of an elementwise op (``_WRAPS_NUMBERS``, ``where``) from type
    promotion on the CPU: a Python number operand is wrapped as a 0-dim tensor
    (a double, a long or a bool) and converted to the dtype the op computes
    in where that differs, and so is each tensor operand of another dtype, at
    its own size (measured on torch 2.13's CPU kernels: x * 0.5 holds 12
    bytes for float32 x, 16 for a float64 x times an int; float32 times
    complex64 converts the float32 operand, 8 bytes an element)."""
    operands = args[1:3] if packet is _aten.where else args[:2]
    values = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in operands]
    if len(values) < 2 or not all(isinstance(v, (torch.Tensor, bool, int, float))
                                  for v in values):
        return 0
    if not any(isinstance(v, torch.Tensor) for v in values):
        return 0
    try:
        common = torch.result_type(*values)
    except (RuntimeError, TypeError):
        return 0
    scratch = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.dtype != common:
                scratch += concrete(value.numel()) * common.itemsize
            continue
        wrapped = (torch.bool if isinstance(value, bool) else
                   torch.int64 if isinstance(value, int) else torch.float64)
        scratch += wrapped.itemsize + (common.itemsize if common != wrapped else 0)
    return scratch


def _safe_softmax_scratch(node: fx.Node) -> int:
    value, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0
    numel = concrete(value.numel())
    width = concrete(value.shape[node.args[1]]) if value.dim() else 1
    return numel + numel // max(width, 1) + out.element_size()


# Elementwise ops that wrap a Python number operand as a tensor on CPU.
_WRAPS_NUMBERS = frozenset({
    _aten.add, _aten.sub, _aten.rsub, _aten.mul, _aten.div, _aten.remainder, _aten.fmod,
    _aten.floor_divide, _aten.eq, _aten.ne, _aten.lt, _aten.le, _aten.gt, _aten.ge,
    _aten.bitwise_and, _aten.bitwise_or, _aten.bitwise_xor, _aten.xlogy, _aten.copysign,
    _aten.where})


# CPU ops that hold buffers of their own, by rule (fxckpt bench --suite scratch).
_CPU_BUFFERS = {
    _aten.mean: _mean_buffers,
    _aten.native_layer_norm_backward: _layer_norm_backward_buffers,
    _aten.cumsum: _cumsum_buffers,
    _aten._native_batch_norm_legit_functional: _batch_norm_buffers,
}


# Ops measured by running them (_measured_here), when an operand is such.
_MEASURED_WHEN = {
    **dict.fromkeys((_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm),
                    lambda t: not _blas_layout(t)),
    **dict.fromkeys((_aten.abs, _aten.angle), lambda t: t.is_complex()),
    _aten.mean: lambda t: t.dtype in (torch.bfloat16, torch.float16),
}


# op -> which tensors' bytes the scratch equals (-1: the op's output).
_WORKSPACE = {
    _aten.native_dropout: (0,),
    # A host dropout split for planning (passes/dropout.py): the draw fills
    # a tensor like its input before the bool mask; the product scales the
    # mask in the input's dtype first.
    DROPOUT_MASK.overloadpacket: (0,),
    APPLY_DROPOUT_MASK.overloadpacket: (0,),
    _aten.convolution: (-1,),
    _aten.convolution_backward: (0, 1, 2),
    _aten.native_batch_norm_backward: (1,),
    _aten.native_dropout_backward: (-1,),
    _aten.addmm: (0,),
}


# Losses whose kernels reduce into the buffer of the unreduced loss, by the
# index of their reduction argument: the 0-dim result keeps a buffer the
# size of the input (a U-Net's plans measured 98,300 B over, an image less
# 4 B). Re-measured by tests/test_memory_model.py::test_losses_reduced_in_place.
_REDUCED_IN_PLACE = {
    _aten.mse_loss.default: 2, _aten.smooth_l1_loss.default: 2,
    _aten.soft_margin_loss.default: 2, _aten.binary_cross_entropy.default: 3,
}


def storage_nbytes(node: fx.Node, val: torch.Tensor) -> int:
    """Bytes of the storage ``val`` (a value of ``node``) lives in, as the
    op allocates it."""
    nbytes = concrete(val.untyped_storage().nbytes())
    reduction = _REDUCED_IN_PLACE.get(node.target)
    if reduction is not None and val.dim() == 0 and isinstance(node.args[0], fx.Node):
        if (node.args[reduction] if len(node.args) > reduction
                else node.kwargs.get("reduction", 1)) != 0:
            source = node.args[0].meta.get("val")
            if isinstance(source, torch.Tensor):
                nbytes = max(nbytes, concrete(source.numel()) * val.element_size())
    return nbytes

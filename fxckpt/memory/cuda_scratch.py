"""Scratch memory of CUDA kernels: what they allocate and free inside their
own call, besides their outputs. Attention's kernels (measured), the
embedding's backward (read from its source), and sum and mean's partial
results (cuda_reduce.py: read from ATen's source, measured on an H100).

Measured on an H200 (132 SMs, torch 2.11) with PyTorch's CUDA allocator,
over batch 1-16, heads 1-32, sequences 32-4096, head dims 16-256, float32 and
bfloat16, with and without dropout, masks and causality, in both layouts.
The rules below match within 32 KiB, except that the allocator itself can
count up to 1 MiB more for an allocation over 1 MiB (it hands out the whole
rest of a cached segment when less than 1 MiB would be left):

- memory-efficient attention's backward accumulates the query's gradient in
  float32, over query rows padded to 64 (head dim <= 64) or 128 and head dims
  padded to 64, and holds two float rows per query; it pads a mask whose last
  dimension is not a multiple of 8, and copies ``grad_out`` unless it is
  contiguous in the kernel's (batch, seq, head, dim) layout. On 16-bit
  values with head dims over 128 it also accumulates the key's and value's
  gradients in float32, and its forward the output; otherwise its forward
  holds nothing.
- flash attention's backward accumulates the query's gradient in float32 over
  rows padded to 128 and head dims padded to 32 (64 above 128), with a float
  per padded row and one per row, and copies ``grad_out`` twice when it is
  not in the kernel's layout. Its forward, without dropout, splits the keys
  across blocks when the batch and heads do not fill the device, and
  accumulates each split's output and row statistics in float32 (the split
  count is flash attention's own rule, from the number of SMs).
- cuDNN attention's backward holds a float32 copy of the query's gradient and
  two float rows per query.

Each kernel also allocates a few small tensors (philox state, row sums):
up to 28 KiB at the largest shapes measured, counted as 32 KiB.

The embedding's dense backward (ATen's EmbeddingBackwardKernel.cu) sums
each looked-up row's gradient into a buffer of one row per index, in
float32 for 16-bit gradients, besides sorting the indices and holding four
more index-sized arrays; counted as that buffer and eight index arrays (the
sort's own scratch included). Not measured on a device yet.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.fx as fx

from fxckpt.memory.cuda_reduce import reduce_scratch

_aten = torch.ops.aten
_BLOCK = 512      # the CUDA allocator's block
_SMALL = 32768    # the kernels' small tensors, in whole blocks
# The SM count assumed where the graph's device cannot be asked (planning on
# a machine without it): an H100's and H200's, which most large runs use.
_DEFAULT_SMS = 132
_DEFAULT_THREADS_PER_SM = 2048


def cuda_scratch(target, args: tuple, size: Callable[[object], int]) -> int:
    """Scratch bytes of the CUDA kernel ``target(*args)`` (graph nodes as
    arguments): 0 for kernels without any. ``size`` turns a (possibly
    symbolic) size into an int."""
    rule = _RULES.get(target)
    return rule(args, size) if rule is not None else 0


def _blocks(nbytes: int) -> int:
    return -(-nbytes // _BLOCK) * _BLOCK


def _pad(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _val(arg):
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _shape(args: tuple, first: int, size) -> tuple[int, int, int, int, int] | None:
    """(batch, heads, query rows, key rows, head dim) of an attention call
    whose query is argument ``first`` and key the next."""
    if len(args) < first + 2:
        return None
    query, key = _val(args[first]), _val(args[first + 1])
    if query is None or key is None or query.dim() != 4:
        return None
    b, h, m, d = (size(s) for s in query.shape)
    return b, h, m, size(key.shape[-2]), d


def _in_kernel_layout(tensor: torch.Tensor | None, size) -> bool:
    """Whether a (batch, head, seq, dim) tensor is contiguous as (batch, seq,
    head, dim), the layout the kernels read without a copy."""
    if tensor is None or tensor.dim() != 4:
        return True
    b, h, m, d = (size(s) for s in tensor.shape)
    strides = [size(s) for s in tensor.stride()]
    expected = {0: h * m * d, 2: h * d, 1: d, 3: 1}
    return all(strides[i] == expected[i] for i in range(4) if (b, h, m, d)[i] > 1)


def _copy_bytes(tensor: torch.Tensor | None, size) -> int:
    return 0 if tensor is None else _blocks(size(tensor.numel()) * tensor.element_size())


def _efficient_backward(args: tuple, size) -> int:
    shape = _shape(args, 1, size)
    if shape is None:
        return 0
    b, h, m, n, d = shape
    rows = 64 if d <= 64 else 128
    scratch = _blocks(b * h * _pad(m, rows) * _pad(d, 64) * 4) + 2 * _blocks(b * h * m * 4)
    mask = _val(args[4]) if len(args) > 4 else None
    if mask is not None and mask.dim() and size(mask.shape[-1]) % 8:
        padded = math.prod(size(s) for s in mask.shape[:-1]) * _pad(size(mask.shape[-1]), 8)
        scratch += _blocks(padded * mask.element_size())
    grad_out = _val(args[0])
    if not _in_kernel_layout(grad_out, size):
        scratch += _copy_bytes(grad_out, size)
    if _accumulates_in_float(args[1], d):
        scratch += 2 * _blocks(b * h * n * d * 4)   # the key's and value's gradients
    return scratch + _SMALL


def _efficient_forward(args: tuple, size) -> int:
    shape = _shape(args, 0, size)
    if shape is None or not _accumulates_in_float(args[0], shape[4]):
        return 0
    b, h, m, n, d = shape
    return _blocks(b * h * m * d * 4)


def _accumulates_in_float(query, head_dim: int) -> bool:
    """Memory-efficient attention on 16-bit values with head dims over 128
    accumulates its output (forward) and the key's and value's gradients
    (backward) in float32 buffers."""
    value = _val(query)
    return value is not None and value.element_size() < 4 and head_dim > 128


def _flash_dim(d: int) -> int:
    return _pad(d, 32 if d <= 128 else 64)


def _flash_backward(args: tuple, size) -> int:
    shape = _shape(args, 1, size)
    if shape is None:
        return 0
    b, h, m, n, d = shape
    rows = _pad(m, 128)
    scratch = (_blocks(b * h * rows * _flash_dim(d) * 4) + _blocks(b * h * rows * 4)
               + _blocks(b * h * m * 4))
    grad_out = _val(args[0])
    if not _in_kernel_layout(grad_out, size):
        scratch += 2 * _copy_bytes(grad_out, size)
    return scratch + _SMALL


def _flash_forward(args: tuple, size) -> int:
    shape = _shape(args, 0, size)
    dropout = args[3] if len(args) > 3 else 0.0
    if shape is None or not isinstance(dropout, (int, float)) or dropout > 0:
        return 0   # with dropout the keys are never split
    b, h, m, n, d = shape
    key_block = 256 if d <= 64 else 128 if d <= 128 else 64
    splits = flash_splits(b * h * -(-m // 64), 2 * _sm_count(_val(args[0])),
                          -(-n // key_block), 128)
    if splits <= 1:
        return 0
    return _blocks(splits * b * h * m * 4) + _blocks(splits * b * h * m * _flash_dim(d) * 4)


def flash_splits(blocks: int, sms: int, key_blocks: int, most: int) -> int:
    """How many parts flash attention's forward splits the keys into: 1 when
    ``blocks`` (batch x heads x query blocks) nearly fill ``sms``, else the
    fewest parts whose waves of blocks fill the SMs within 85% of the best."""
    if blocks >= 0.8 * sms:
        return 1
    most = min(most, sms, key_blocks)

    def eligible(k: int) -> bool:
        return k == 1 or -(-key_blocks // k) != -(-key_blocks // (k - 1))

    efficiency = {}
    for k in range(1, most + 1):
        if eligible(k):
            waves = blocks * k / sms
            efficiency[k] = waves / math.ceil(waves)
    best = max(efficiency.values(), default=0.0)
    return next((k for k, e in efficiency.items() if e >= 0.85 * best), 1)


def _cudnn_backward(args: tuple, size) -> int:
    shape = _shape(args, 1, size)
    if shape is None:
        return 0
    b, h, m, n, d = shape
    return _blocks(b * h * m * d * 4) + 2 * _blocks(b * h * m * 4) + _SMALL


def _embedding_backward(args: tuple, size) -> int:
    """embedding_dense_backward(grad_output, indices, num_weights, ...)."""
    grad, indices = (_val(args[0]), _val(args[1])) if len(args) > 1 else (None, None)
    if grad is None or indices is None or grad.dim() == 0:
        return 0
    count, width = size(indices.numel()), size(grad.shape[-1])
    partial = 4 if grad.element_size() < 4 else grad.element_size()
    return _blocks(count * width * partial) + 8 * _blocks(count * indices.element_size())


def _sm_count(tensor: torch.Tensor | None) -> int:
    if tensor is None or tensor.device.type != "cuda" or not torch.cuda.is_available():
        return _DEFAULT_SMS
    return _device_sms(tensor.device.index or 0)


@functools.lru_cache(maxsize=None)
def _device_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _threads_per_sm(tensor: torch.Tensor) -> int:
    if tensor.device.type != "cuda" or not torch.cuda.is_available():
        return _DEFAULT_THREADS_PER_SM
    props = torch.cuda.get_device_properties(tensor.device.index or 0)
    return getattr(props, "max_threads_per_multi_processor", _DEFAULT_THREADS_PER_SM)


def _reduction(over_all: bool) -> Callable:
    """The rule of sum or mean (``over_all``: the overload without dims):
    the reduction kernel's partial-result buffer (cuda_reduce.py)."""
    def rule(args: tuple, size) -> int:
        x = _val(args[0]) if args else None
        if x is None or x.dim() == 0:
            return 0
        dims = None if over_all or len(args) < 2 else args[1]
        dims = {d % x.dim() for d in dims} if dims else set(range(x.dim()))
        accumulator = 4 if x.is_floating_point() and x.element_size() <= 4 else 8
        return reduce_scratch(tuple(size(s) for s in x.shape),
                              tuple(size(s) for s in x.stride()), dims, x.element_size(),
                              accumulator, _sm_count(x), _threads_per_sm(x))
    return rule


# Each kernel's rule, by its ATen overload.
_RULES = {
    _aten._scaled_dot_product_efficient_attention_backward.default: _efficient_backward,
    _aten._scaled_dot_product_efficient_attention.default: _efficient_forward,
    _aten._scaled_dot_product_flash_attention_backward.default: _flash_backward,
    _aten._scaled_dot_product_flash_attention.default: _flash_forward,
    _aten._scaled_dot_product_cudnn_attention_backward.default: _cudnn_backward,
    _aten.embedding_dense_backward.default: _embedding_backward,
    _aten.sum.dim_IntList: _reduction(over_all=False),
    _aten.sum.default: _reduction(over_all=True),
    _aten.mean.dim: _reduction(over_all=False),
    _aten.mean.default: _reduction(over_all=True),
}

"""Scratch of ATen's CUDA reduction kernel (``gpu_reduce_kernel``, which
``sum`` and ``mean`` run): where it splits each output's inputs across
thread blocks, it allocates a buffer for the blocks' partial results and a
semaphore per column of blocks, and frees them when it returns.

Sized as ATen's ``setReduceConfig`` (ATen/native/cuda/Reduce.cuh) sizes
them: the reduction seen as ``outputs`` results of ``inputs`` values each,
a block of at most 512 threads laid out over the fastest-moving dimension,
and the inputs split across ``ctas`` blocks per output when each thread
would still sum at least 256 values and the grid does not fill the device.
The buffer then holds ``outputs x ctas`` accumulators (float32 for 16- and
32-bit values), times the block's width and the output vector size when the
block is laid over outputs rather than inputs. That case, a bias's gradient
(a column sum of a tall matrix), is where it is large: on an H100 (132 SMs),
the column sums of a 2048 x 2048 bfloat16 gradient held 32 MiB, more than
the gradient itself; a 1024 x 128 float32 one held 1 MiB. Those and every
other sum seen on the device matched this rule to the byte.
"""

from __future__ import annotations

import math

_MAX_THREADS = 512       # threads per block (256 for complex double: not modeled)
_WARP = 32
_MIN_VALUES, _MAX_VALUES = 16, 256    # per thread, before splitting across blocks
_BLOCK = 512             # the CUDA caching allocator's block


def reduce_scratch(sizes: tuple[int, ...], strides: tuple[int, ...], dims: set[int],
                   itemsize: int, accumulator: int, sms: int, threads_per_sm: int) -> int:
    """Bytes the reduction of a tensor (``sizes``, ``strides`` in elements,
    ``itemsize`` bytes a value, summed in ``accumulator``-byte values) over
    ``dims`` allocates besides its output, on a device with ``sms``
    multiprocessors of ``threads_per_sm`` threads each."""
    axes = [(size, stride, d in dims) for d, (size, stride) in enumerate(zip(sizes, strides))
            if size != 1]
    outputs = math.prod(size for size, _, reduced in axes if not reduced)
    inputs = math.prod(size for size, _, reduced in axes if reduced)
    if inputs <= 1 or outputs == 0:
        return 0
    kept = [(size, stride) for size, stride, reduced in axes if not reduced]
    fastest = min(axes, key=lambda axis: axis[1])
    over_inputs = not kept or fastest[2]       # block.x along the reduced values
    dim0, dim1 = (inputs, outputs) if over_inputs else (outputs, inputs)
    vector = 1
    if fastest[1] == 1:
        if over_inputs and dim0 >= 128 and _groups([a for a in axes if a[2]]) == 1:
            dim0 //= max(1, 16 // itemsize)    # loads vectorized along the input
        elif not over_inputs:
            vector = _output_vector(kept, [a for a in axes if a[2]])
            dim0 //= vector
    width, height = _block(dim0, dim1, _MAX_THREADS // vector)
    step_in, step_out = (width, 1) if over_inputs else (1, width)
    split_warps = _ceil(inputs, step_in) >= min(height * 16, _MAX_VALUES)
    if split_warps:
        step_in *= height
    else:
        step_out *= height
    per_thread = _ceil(inputs, step_in)
    target = sms * (threads_per_sm // (width * height))
    grid = _ceil(outputs // vector, step_out)
    if not (split_warps and per_thread >= _MAX_VALUES and grid <= target):
        return 0
    ctas = max(min(_ceil(target, grid), _ceil(per_thread, _MIN_VALUES)),
               _ceil(per_thread, _MAX_VALUES))
    if ctas <= 1:
        return 0
    buffer = accumulator * outputs * ctas * (1 if over_inputs else width * vector)
    return _blocks(buffer) + _blocks(4 * grid)


def _block(dim0: int, dim1: int, most: int) -> tuple[int, int]:
    """The block's (width, height): width over dim0, up to a warp first."""
    pow0 = _last_pow2(dim0) if dim0 < most else most
    pow1 = _last_pow2(dim1) if dim1 < most else most
    width = min(pow0, _WARP)
    height = min(pow1, most // width)
    return min(pow0, most // height), height


def _output_vector(kept, reduced) -> int:
    """Outputs per vector load (4, 2 or 1): what divides the innermost kept
    size and every other dimension's stride (buffers are block-aligned)."""
    vector = 4
    innermost = min(kept, key=lambda axis: axis[1])
    for n in [innermost[0], *(stride for _, stride, *_ in reduced),
              *(stride for size, stride in kept if (size, stride) != innermost)]:
        while n % vector:
            vector //= 2
    return vector


def _groups(reduced) -> int:
    """Reduced dimensions left once adjacent ones (in memory) coalesce."""
    ordered = sorted(reduced, key=lambda axis: axis[1])
    groups = 1
    for (size, stride, _), (_, outer, _) in zip(ordered, ordered[1:]):
        groups += outer != size * stride
    return groups


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(nbytes: int) -> int:
    return _ceil(nbytes, _BLOCK) * _BLOCK

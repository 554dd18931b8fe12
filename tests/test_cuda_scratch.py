"""The memory model's scratch for CUDA's attention kernels against what an
H200 measured (torch 2.11, CUDA allocator: the peak inside the call above
what was allocated after it). Runs on the CPU with fake CUDA tensors.

Rows were measured by running each kernel through
``F.scaled_dot_product_attention`` under ``sdpa_kernel`` and
``torch.autograd.grad``; layout "bmhd" is (batch, seq, head, dim) memory
viewed as (batch, head, seq, dim), as transformer models make it; "bhmd" is
(batch, head, seq, dim) memory.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from fxckpt.memory.cuda_reduce import reduce_scratch
from fxckpt.memory.cuda_scratch import cuda_scratch, flash_splits
from fxckpt.memory.scratch import workspace_bytes
from fxckpt.memory.values import concrete

aten = torch.ops.aten
BACKWARD = {
    "efficient": aten._scaled_dot_product_efficient_attention_backward.default,
    "flash": aten._scaled_dot_product_flash_attention_backward.default,
    "cudnn": aten._scaled_dot_product_cudnn_attention_backward.default,
}
FORWARD = {
    "efficient": aten._scaled_dot_product_efficient_attention.default,
    "flash": aten._scaled_dot_product_flash_attention.default,
}

# (kernel, dtype, batch, heads, seq, head dim, dropout, layout, mask, pass, measured bytes)
MEASURED = [
    ("efficient", torch.float32, 1, 1, 1000, 16, 0.0, "bhmd", False, "backward", 270848),
    ("efficient", torch.bfloat16, 2, 1, 256, 128, 0.1, "bhmd", False, "backward", 266752),
    ("efficient", torch.float32, 2, 1, 100, 64, 0.0, "bhmd", True, "backward", 151552),
    ("efficient", torch.bfloat16, 2, 4, 256, 64, 0.0, "bhmd", False, "backward", 803328),
    ("efficient", torch.bfloat16, 8, 16, 1024, 64, 0.1, "bmhd", False, "backward", 34635776),
    ("efficient", torch.bfloat16, 4, 32, 2048, 128, 0.0, "bhmd", False, "backward", 203456512),
    ("efficient", torch.bfloat16, 2, 8, 512, 256, 0.0, "bmhd", False, "backward", 25235456),
    ("efficient", torch.bfloat16, 2, 8, 512, 256, 0.0, "bmhd", False, "forward", 8388608),
    ("efficient", torch.float32, 2, 8, 512, 256, 0.0, "bmhd", False, "backward", 8486912),
    ("efficient", torch.float32, 2, 8, 512, 256, 0.0, "bmhd", False, "forward", 0),
    ("flash", torch.bfloat16, 3, 1, 1000, 80, 0.0, "bhmd", False, "backward", 1205248),
    ("flash", torch.bfloat16, 4, 32, 2048, 128, 0.1, "bmhd", False, "backward", 136315904),
    ("flash", torch.bfloat16, 2, 8, 512, 96, 0.1, "bhmd", False, "backward", 6358016),
    ("flash", torch.bfloat16, 1, 1, 1000, 16, 0.0, "bhmd", False, "forward", 528384),
    ("flash", torch.bfloat16, 1, 1, 256, 80, 0.0, "bhmd", False, "forward", 198656),
    ("flash", torch.bfloat16, 2, 8, 512, 256, 0.0, "bmhd", False, "forward", 16842752),
    ("flash", torch.bfloat16, 2, 8, 512, 96, 0.0, "bmhd", False, "forward", 6356992),
    ("flash", torch.bfloat16, 1, 1, 1000, 16, 0.1, "bhmd", False, "forward", 512),
    ("flash", torch.bfloat16, 8, 16, 1024, 64, 0.0, "bmhd", False, "forward", 0),
    ("cudnn", torch.bfloat16, 2, 1, 1000, 128, 0.0, "bhmd", False, "backward", 1041920),
]


def _graph_node(graph: fx.Graph, name: str, value: torch.Tensor | None):
    if value is None:
        return None
    node = graph.placeholder(name)
    node.meta["val"] = value
    return node


def _call(kernel, dtype, b, h, m, d, dropout, layout, mask, which):
    """An attention call as a graph node, on fake CUDA tensors."""
    with FakeTensorMode():
        def make():
            if layout == "bmhd":
                return torch.empty(b, m, h, d, dtype=dtype, device="cuda").transpose(1, 2)
            return torch.empty(b, h, m, d, dtype=dtype, device="cuda")
        q, k, v, grad = make(), make(), make(), make()
        bias = torch.empty(b, 1, m, m, dtype=dtype, device="cuda") if mask else None
    graph = fx.Graph()
    nq, nk, nv, ng = (_graph_node(graph, n, t) for n, t in
                      (("q", q), ("k", k), ("v", v), ("grad", grad)))
    nb = _graph_node(graph, "bias", bias)
    if which == "forward":
        if kernel == "efficient":
            target, args = FORWARD[kernel], (nq, nk, nv, nb, True, dropout, True)
        else:
            target, args = FORWARD[kernel], (nq, nk, nv, dropout, True)
        out = q
    else:
        target = BACKWARD[kernel]
        args = ((ng, nq, nk, nv, nb, None, None, None, None, dropout) if kernel == "efficient"
                else (ng, nq, nk, nv))
        out = (q, k, v)
    node = graph.call_function(target, args)
    node.meta["val"] = out
    return node


@pytest.mark.parametrize("row", MEASURED, ids=lambda r: "-".join(map(str, r[:10])))
def test_attention_scratch_matches_the_h200(row):
    """Never below by more than 4 KiB, above by at most 5% and 32 KiB (the
    kernels' small tensors, counted as 32 KiB)."""
    *call, measured = row
    node = _call(*call)
    predicted = cuda_scratch(node.target, node.args, concrete)
    assert predicted >= measured - 4096, (predicted, measured)
    assert predicted <= measured * 1.05 + 32768, (predicted, measured)
    # The memory model counts it for the node.
    assert workspace_bytes(node) == predicted


def test_attention_on_the_cpu_holds_no_cuda_scratch():
    node = _call("efficient", torch.float32, 2, 4, 256, 64, 0.0, "bhmd", False, "backward")
    with FakeTensorMode():
        cpu = torch.empty(2, 4, 256, 64)
    for arg in node.args:
        if isinstance(arg, fx.Node):
            arg.meta["val"] = cpu
    node.meta["val"] = (cpu, cpu, cpu)
    assert workspace_bytes(node) == 0


@pytest.mark.parametrize("blocks,sms,key_blocks,expected", [
    (4, 264, 2, 2), (16, 264, 4, 4), (512, 264, 4, 1), (212, 264, 8, 1), (1, 264, 1, 1)])
def test_flash_splits(blocks, sms, key_blocks, expected):
    """Flash attention's rule for splitting keys: none when the blocks fill
    80% of the SMs or there is one key block; else the first split count
    whose waves fill the SMs within 85% of the best."""
    assert flash_splits(blocks, sms, key_blocks, 128) == expected
    assert 1 <= flash_splits(blocks, sms, key_blocks, 128) <= max(1, key_blocks)


def test_embedding_backward_holds_a_row_per_index():
    """CUDA embedding backward sums into one row per index (float32 for
    16-bit gradients) and holds eight index-sized arrays: 2,048 tokens of
    width 512 take 4 MiB of partial sums whether the gradient is float32 or
    bfloat16, and 8 x 16 KiB of indices; none on the CPU."""
    op = aten.embedding_dense_backward.default
    found = {}
    for device, dtype in (("cuda", torch.float32), ("cuda", torch.bfloat16), ("cpu", torch.float32)):
        with FakeTensorMode():
            grad = torch.empty(4, 512, 512, dtype=dtype, device=device)
            ids = torch.empty(4, 512, dtype=torch.int64, device=device)
        graph = fx.Graph()
        g, i = _graph_node(graph, "grad", grad), _graph_node(graph, "ids", ids)
        node = graph.call_function(op, (g, i, 2048, -1, False))
        with FakeTensorMode():
            node.meta["val"] = torch.empty(2048, 512, dtype=dtype, device=device)
        found[device, dtype] = workspace_bytes(node)
    expected = 2048 * 512 * 4 + 8 * 2048 * 8
    assert found["cuda", torch.float32] == found["cuda", torch.bfloat16] == expected
    assert found["cpu", torch.float32] == 0


def test_the_peak_breakdown_names_kernel_scratch():
    """Where the peak is an attention backward's call, what the peak is made
    of includes its scratch ("kernel scratch"), and the parts add up to the
    peak the memory model gives."""
    from fxckpt.memory.model import breakdown, simulate

    node = _call("efficient", torch.bfloat16, 2, 8, 512, 64, 0.0, "bmhd", False, "backward")
    graph = node.graph
    graph.output((node,))
    timeline = simulate(graph)
    assert timeline.peak_at == f"forward:{node.name}"
    parts, _, _ = breakdown(graph, None, timeline.peak_at)
    assert parts["kernel scratch"] == workspace_bytes(node) > 0
    assert sum(parts.values()) == timeline.peak_bytes


# Column sums (a bias's gradient) measured on an H100 (132 SMs, torch 2.11):
# (rows, columns, dtype, the kernel's buffer, its semaphores), bytes asked of
# the allocator inside the call.
REDUCTIONS = [
    (1024, 128, torch.float32, 1048576, 4),
    (1024, 384, torch.float32, 3145728, 12),
    (1024, 512, torch.float32, 4194304, 16),
    (2048, 512, torch.bfloat16, 8388608, 16),
    (2048, 1536, torch.bfloat16, 25165824, 48),
    (2048, 2048, torch.bfloat16, 33554432, 64),
]


def _sum_node(shape, dims, dtype, device="cuda", target=aten.sum.dim_IntList):
    with FakeTensorMode():
        x = torch.empty(*shape, dtype=dtype, device=device)
        out = x.sum(dims) if dims is not None else x.sum()
    graph = fx.Graph()
    args = (_graph_node(graph, "x", x),) + ((dims,) if dims is not None else ())
    node = graph.call_function(target, args)
    node.meta["val"] = out
    return node


@pytest.mark.parametrize("rows,cols,dtype,buffer,semaphores", REDUCTIONS)
def test_column_sum_scratch_matches_the_h100(rows, cols, dtype, buffer, semaphores):
    """Both allocations in whole 512-byte blocks, to the byte; the same
    whether the rows come as one dimension or as (batch, sequence)."""
    blocks = lambda n: -(-n // 512) * 512  # noqa: E731
    assert workspace_bytes(_sum_node((rows, cols), [0], dtype)) == \
        blocks(buffer) + blocks(semaphores)
    assert workspace_bytes(_sum_node((4, rows // 4, cols), [0, 1], dtype)) == \
        blocks(buffer) + blocks(semaphores)


def test_reductions_that_fit_one_block_per_output_hold_nothing():
    """Row sums (over the fastest dimension) of a few values per output, a
    short column sum, and any sum on the CPU: no partial-result buffer. A
    full sum of 4 Mi floats splits across blocks: a small buffer and a
    semaphore (2,048 + 512 B, ATen's rule at 132 SMs)."""
    assert workspace_bytes(_sum_node((8, 64, 128), [2], torch.float32)) == 0
    assert workspace_bytes(_sum_node((512, 64), [0], torch.float32)) == 0
    assert workspace_bytes(_sum_node((1024, 512), [0], torch.float32, device="cpu")) == 0
    assert workspace_bytes(_sum_node((4 << 20,), None, torch.float32,
                                     target=aten.sum.default)) == 2048 + 512
    assert workspace_bytes(_sum_node((1024, 512), [0], torch.float32,
                                     target=aten.mean.dim)) == 4194304 + 512


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 1 << 14), cols=st.integers(1, 4096), split=st.sampled_from([1, 2, 4, 8]),
       over_rows=st.booleans(), itemsize=st.sampled_from([2, 4]),
       sms=st.sampled_from([80, 108, 132]))
def test_reduction_scratch_follows_memory_not_how_dims_are_split(rows, cols, split, over_rows,
                                                                 itemsize, sms):
    """ATen coalesces adjacent dimensions before it lays out a reduction, so
    splitting the reduced rows of a contiguous matrix into (split, rows /
    split) leaves the scratch as it was; and it is whole 512-byte blocks."""
    rows *= split
    if over_rows:      # column sums: (rows, cols) over dim 0
        whole = reduce_scratch((rows, cols), (cols, 1), {0}, itemsize, 4, sms, 2048)
        parts = reduce_scratch((split, rows // split, cols), (rows // split * cols, cols, 1),
                               {0, 1}, itemsize, 4, sms, 2048)
    else:              # row sums: (cols, rows) over its last dim
        whole = reduce_scratch((cols, rows), (rows, 1), {1}, itemsize, 4, sms, 2048)
        parts = reduce_scratch((cols, split, rows // split), (rows, rows // split, 1),
                               {1, 2}, itemsize, 4, sms, 2048)
    assert whole == parts
    assert whole % 512 == 0 and whole >= 0

"""Reading a step's peak off Inductor's wrapper code (fxckpt/memory/compiled_peak.py)."""

import pytest

from fxckpt.compat.wrapper_code import UnreadableCode
from fxckpt.memory.compiled_peak import step_peak

pytestmark = pytest.mark.releases

_FORWARD = """
class Runner:
    def call(self, args):
        primals_1, = args
        args.clear()
        buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
        buf1 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
        kernel(primals_1, buf0, buf1)
        buf2 = buf1; del buf1  # reuse
        buf3 = empty_strided_cpu((16, ), (1, ), torch.int64)
        del buf3
        return (buf2, primals_1, reinterpret_tensor(buf0, (32, ), (1, ), 0), )
"""

_BACKWARD = """
class Runner:
    def call(self, args):
        primals_1, view, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float64)
        kernel(view, tangents_1, buf0)
        del view
        buf1 = empty_strided_cpu((2, ), (1, ), torch.bool)
        return (buf0, )
"""


def test_forward_keeps_what_it_returns_and_backward_frees_saved_values():
    peak = step_peak(_FORWARD, _BACKWARD)
    # Forward: 128 + 128 live, then 128 B of int64 on top: 384 B; it keeps
    # both float buffers (one returned as output, one as a saved view).
    assert peak.forward_peak_bytes == 384
    assert peak.held_bytes == 256
    # Backward: 256 held + 256 (float64) = 512, then the saved view is freed
    # (-128) before 2 bool bytes are allocated.
    assert peak.peak_bytes == 512


def test_what_backward_takes_of_the_forwards_buffers_is_read_as_saved():
    """The forward returns buf2 (an output) and a view of buf0 and
    primals_1 (saved); backward takes the last two. Saved: buf0's 128 B,
    the parameter not (the forward did not make it). Where the forward
    saves a copy it made in place of the parameter (Inductor's
    channels-last convolution weight), the copy counts."""
    assert step_peak(_FORWARD, _BACKWARD).saved_bytes == 128
    assert step_peak(_FORWARD, None).saved_bytes is None
    copied = _FORWARD.replace("return (buf2, primals_1,", "return (buf2, buf4,").replace(
        "        del buf3\n", "        del buf3\n"
        "        buf4 = empty_strided_cpu((3, 3), (1, 3), torch.float32)\n")
    assert step_peak(copied, _BACKWARD).saved_bytes == 128 + 36


def test_code_with_a_symbolic_size_is_not_read():
    code = _FORWARD.replace("(16, ), (1, )", "(s0, ), (1, )")
    with pytest.raises(UnreadableCode) as unread:
        step_peak(code, _BACKWARD)
    assert unread.value.expected


def test_tangents_are_allocated_for_the_backward():
    code = _BACKWARD.replace("args.clear()", "args.clear()\n"
                             "        assert_size_stride(tangents_1, (4, 8), (8, 1), 'input')")
    assert step_peak(_FORWARD, code).peak_bytes == 512 + 128


_CONV_BACKWARD = """
class Runner:
    def call(self, args):
        primals_1, view, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
        buf1 = torch.ops.aten.convolution_backward.default(buf0, view, primals_1, [0])
        del buf0
        buf2 = buf1[0]
        assert_size_stride(buf2, (2, 8), (8, 1), 'torch.ops.aten.convolution_backward.default')
        buf3 = buf1[1]
        assert_size_stride(buf3, (4, 8), (8, 1), 'torch.ops.aten.convolution_backward.default')
        del buf1
        return (buf2, buf3, )
"""


def test_fallback_outputs_and_convolution_scratch_are_counted():
    peak = step_peak(_FORWARD, _CONV_BACKWARD)
    # 256 held + 128 (buf0); while convolution_backward runs it copies
    # buf0 and the saved view (128 + 128): 640. Its outputs, 64 + 128, are
    # made while its inputs are live: 576.
    assert peak.peak_bytes == 640
    code = _CONV_BACKWARD.replace("buf2, (2, 8), (8, 1)", "buf2, (16, 8), (8, 1)")
    # Outputs of 512 + 128 on the 384 live when it ran.
    assert step_peak(_FORWARD, code).peak_bytes == 384 + 16 * 8 * 4 + 128


_CONV_FORWARD = """
class Runner:
    def call(self, args):
        primals_1, primals_2 = args
        args.clear()
        assert_size_stride(primals_1, (2, 16, 8, 8), (1024, 1, 128, 16), 'input')
        assert_size_stride(primals_2, (16, 1, 7, 7), (49, 49, 7, 1), 'input')
        buf0 = extern_kernels.convolution(primals_1, primals_2, None, stride=(1, 1), padding=(3, 3), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=16)
        assert_size_stride(buf0, (2, 16, 8, 8), (1024, 1, 128, 16), 'torch.ops.aten.convolution.default')
        return (buf0, primals_1, primals_2, )
"""

_DEPTHWISE_BACKWARD = """
class Runner:
    def call(self, args):
        primals_1, primals_2, tangents_1 = args
        args.clear()
        assert_size_stride(primals_1, (2, 16, 8, 8), (1024, 1, 128, 16), 'input')
        assert_size_stride(primals_2, (16, 1, 7, 7), (49, 49, 7, 1), 'input')
        assert_size_stride(tangents_1, (2, 16, 8, 8), (1024, 1, 128, 16), 'input')
        buf0 = empty_strided_cpu((2, 16, 8, 8), (1024, 1, 128, 16), torch.float32)
        kernel(tangents_1, buf0)
        buf1 = torch.ops.aten.convolution_backward.default(reinterpret_tensor(buf0, (2, 16, 8, 8), (1024, 1, 128, 16), 0), primals_1, primals_2, [16], (1, 1), (3, 3), (1, 1), False, (0, 0), 16, [True, True, False])
        del buf0
        buf2 = buf1[0]
        assert_size_stride(buf2, (2, 16, 8, 8), (1024, 1, 128, 16), 'torch.ops.aten.convolution_backward.default')
        buf3 = buf1[1]
        assert_size_stride(buf3, (16, 1, 7, 7), (49, 49, 7, 1), 'torch.ops.aten.convolution_backward.default')
        del buf1
        return (buf2, buf3, )
"""


def test_a_cpu_convolutions_scratch_is_measured_at_the_calls_layouts():
    """A channels-last depthwise 7x7 convolution's backward holds scratch
    many times its operands inside its call (2 x 16 x 8 x 8, one thread:
    the bytes depend on the CPU's kernels: 806,016 on one machine, 203,840
    on another; tests/test_cpu_conv.py),
    read at the sizes and strides the wrapper code states; the rule it
    replaces counted copies of its operands (19,520 bytes)."""
    import torch
    from fxckpt.memory.cpu_conv import call_scratch
    torch.set_num_threads(1)
    peak = step_peak(_CONV_FORWARD, _DEPTHWISE_BACKWARD)
    cl = ("tensor", (2, 16, 8, 8), (1024, 1, 128, 16), "float32")
    scratch = call_scratch("convolution_backward", (
        cl, cl, ("tensor", (16, 1, 7, 7), (49, 49, 7, 1), "float32"), ("list", (16,)),
        ("list", (1, 1)), ("list", (3, 3)), ("list", (1, 1)), ("const", False),
        ("list", (0, 0)), ("const", 16), ("list", (True, True, False))))
    assert scratch > 8 * 8192
    # Held from the forward: its output (8,192 B; the inputs were there
    # before); the tangent arrives (8,192), the kernel's buffer (8,192), then
    # the call: its two outputs (8,192 + 3,136) and its scratch.
    assert peak.peak_bytes == 3 * 8192 + 8192 + 3136 + scratch


def test_a_reused_buffers_layout_is_read_where_it_is_reused():
    """Inductor hands a freed buffer on under a new name: a plain alias
    where the two layouts are the same, reinterpret_tensor with the new
    sizes and strides where they differ. A convolution given such a buffer
    is measured at that layout (HF ConvNeXt under Inductor: four of its six
    convolution backwards; read by the rule they measured 43,072 B where
    29,184 were counted, and a floor named 320,656 B measured 329,392)."""
    import torch
    torch.set_num_threads(1)
    direct = step_peak(_CONV_FORWARD, _DEPTHWISE_BACKWARD).peak_bytes
    call = "buf1 = torch.ops.aten.convolution_backward.default(reinterpret_tensor(buf0, "
    assert call in _DEPTHWISE_BACKWARD
    reinterpreted = _DEPTHWISE_BACKWARD.replace(
        "(2, 16, 8, 8), (1024, 1, 128, 16), torch.float32)",
        "(2, 16, 8, 8), (1024, 64, 8, 1), torch.float32)"
    ).replace(
        "        " + call,
        "        buf9 = reinterpret_tensor(buf0, (2, 16, 8, 8), (1024, 1, 128, 16), 0); "
        "del buf0  # reuse\n        " + call.replace("reinterpret_tensor(buf0, ", "reinterpret_tensor(buf9, "))
    aliased = _DEPTHWISE_BACKWARD.replace(
        "        " + call,
        "        buf9 = buf0; del buf0  # reuse\n        " + call.replace("reinterpret_tensor(buf0, ", "reinterpret_tensor(buf9, "))
    for code in (reinterpreted, aliased):
        code = code.replace("(reinterpret_tensor(buf9, (2, 16, 8, 8), (1024, 1, 128, 16), 0), ", "(buf9, ")
        code = code.replace("del buf0\n        buf2", "del buf9\n        buf2")
        assert "default(buf9, primals_1" in code and "# reuse" in code
        assert step_peak(_CONV_FORWARD, code).peak_bytes == direct


_CUDA_FORWARD = _FORWARD.replace("empty_strided_cpu", "empty_strided_cuda")
_CUDA_ATTENTION_BACKWARD = """
class Runner:
    def call(self, args):
        primals_1, view, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cuda((4, 8), (8, 1), torch.float32)
        buf1 = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default(buf0, view, view, view, None, view, view, view, view, 0.0, [True, True, True, False])
        del buf0
        buf2 = buf1[0]
        assert_size_stride(buf2, (4, 8), (8, 1), 'torch.ops.aten._scaled_dot_product_efficient_attention_backward.default')
        del buf1
        return (buf2, )
"""


def test_cuda_attention_scratch_is_counted_where_the_kernel_runs():
    """On CUDA every buffer takes whole 512-byte blocks (the caching
    allocator's): the forward's three 128-byte buffers 512 each, two of them
    kept (1,024 held), backward's buf0 512. A CUDA attention fallback holds
    its outputs and its scratch (as the planned graph's nodes give them) on
    top of what is live at the call: 1,024 + 512 + 10,000."""
    name = "_scaled_dot_product_efficient_attention_backward"
    without = step_peak(_CUDA_FORWARD, _CUDA_ATTENTION_BACKWARD)
    assert (without.forward_peak_bytes, without.held_bytes) == (1536, 1024)
    # Its output (512) is made while buf0 is live, whatever is deleted
    # before the assert that places it.
    assert without.peak_bytes == 1024 + 512 + 512
    held = step_peak(_CUDA_FORWARD, _CUDA_ATTENTION_BACKWARD, {name: 10_000})
    assert held.peak_bytes == 1024 + 512 + 10_000
    # On the CPU: exact bytes, and that kernel holds no such scratch (its
    # output made while buf0 is live).
    cpu = step_peak(_FORWARD, _CUDA_ATTENTION_BACKWARD.replace("empty_strided_cuda",
                                                               "empty_strided_cpu"),
                    {name: 10_000})
    assert cpu.peak_bytes == 256 + 128 + 128


# What a generated module binds before its code, on every device (seen in
# torch 2.11's CUDA output): the device is read from the call's allocations.
_PREAMBLE = """
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
"""


def test_the_device_is_read_from_the_call_not_the_preamble():
    peak = step_peak(_PREAMBLE + _CUDA_FORWARD, _PREAMBLE + _CUDA_ATTENTION_BACKWARD,
                     {"_scaled_dot_product_efficient_attention_backward": 10_000})
    assert peak.peak_bytes == 1024 + 512 + 10_000
    assert step_peak(_PREAMBLE + _FORWARD, _PREAMBLE + _BACKWARD).peak_bytes == 512


# A random op under fxckpt's RNG replay, as Inductor wraps it on CUDA (torch
# 2.11's output for the zoo GPT's attention with dropout): the forward's
# run_and_save_rng_state returns (state, outputs), so an output is an item of
# an item; backward's run_with_rng_state names the op it runs inside.
_RNG_FORWARD = """
class Runner:
    def call(self, args):
        primals_1, = args
        args.clear()
        buf8 = empty_strided_cuda((8, 4, 64, 16), (4096, 16, 64, 1), torch.float32)
        buf9 = torch.ops.higher_order.run_and_save_rng_state(torch.ops.aten._scaled_dot_product_efficient_attention.default, buf8, buf8, buf8, None, True, 0.1)
        del buf8
        buf10 = buf9[0]
        assert_size_stride(buf10, (16, ), (1, ), 'torch.ops.run_and_save_rng_state')
        buf11 = buf9[1][0]
        assert_size_stride(buf11, (8, 4, 64, 16), (4096, 16, 64, 1), 'torch.ops.run_and_save_rng_state')
        del buf9
        buf23 = reinterpret_tensor(buf11, (8, 64, 64), (4096, 64, 1), 0); del buf11  # reuse
        return (buf23, buf10, )
"""

_RNG_BACKWARD = """
class Runner:
    def call(self, args):
        buf23, rng_state, tangents_1 = args
        args.clear()
        buf35 = empty_strided_cuda((8, 4, 64, 16), (4096, 16, 64, 1), torch.float32)
        buf36 = torch.ops.higher_order.run_with_rng_state(rng_state, torch.ops.aten._scaled_dot_product_efficient_attention.default, buf35, buf35, buf35, None, True, 0.1)
        del rng_state
        buf37 = buf36[0]
        assert_size_stride(buf37, (8, 4, 64, 16), (4096, 16, 64, 1), 'torch.ops.run_with_rng_state')
        del buf36
        return (buf37, )
"""


def test_outputs_of_a_replayed_random_op_are_counted():
    """The forward keeps the attention's output (131,072 B) and the 16-byte
    state (a block); backward recomputes it under the saved state, the
    kernel's own scratch counted under the op it runs."""
    peak = step_peak(_RNG_FORWARD, _RNG_BACKWARD)
    assert peak.held_bytes == 131_072 + 512
    # A fallback makes its outputs while its inputs are live: buf8 and
    # both outputs, though buf8 is deleted before the asserts place them.
    assert peak.forward_peak_bytes == 2 * 131_072 + 512
    # Backward: the saved output and state, buf35 and the recomputed
    # output.
    assert peak.peak_bytes == 3 * 131_072 + 512
    scratch = {"_scaled_dot_product_efficient_attention": 200_000}
    assert step_peak(_RNG_FORWARD, _RNG_BACKWARD, scratch).peak_bytes == \
        2 * 131_072 + 512 + 200_000



# A custom operator's output is named again before the assert that sizes
# it, as Inductor writes a call of transformers' grouped_mm_fallback (tiny
# HF Mixtral): that output was never counted, the 2-layer model's compiled
# floor read 1,995,272 B where the step measured 2,540,680 B.
_CUSTOM_FORWARD = """
class Runner:
    def call(self, args):
        primals_1, = args
        args.clear()
        buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
        kernel(primals_1, buf0)
        buf1 = torch.ops.mylib.grouped.default(buf0, primals_1)
        buf2 = buf1
        assert_size_stride(buf2, (16, 8), (8, 1), 'torch.ops.mylib.grouped.default')
        del buf1
        del buf0
        return (buf2, primals_1, )
"""


def test_a_fallback_output_named_again_before_its_assert_is_counted():
    """buf0 (128 B), then the operator's output (512 B) on top: 640 B, and
    the forward keeps the output, under either of its names."""
    peak = step_peak(_CUSTOM_FORWARD, None)
    assert peak.forward_peak_bytes == 128 + 512
    assert peak.held_bytes == 512
    first_named = _CUSTOM_FORWARD.replace("assert_size_stride(buf2", "assert_size_stride(buf1")
    peak = step_peak(first_named, None)
    assert (peak.forward_peak_bytes, peak.held_bytes) == (640, 512)
    # Freed under the other name: nothing is left once both are gone.
    freed = _CUSTOM_FORWARD.replace("return (buf2, primals_1, )",
                                    "del buf2\n        return (primals_1, )")
    assert step_peak(freed, None).held_bytes == 0


# sort's outputs, as Inductor calls it: values, then int64 indices, the
# asserts naming no dtype; the first call's indices never taken out.
_SORT_FORWARD = """
class Runner:
    def call(self, args):
        primals_1, = args
        args.clear()
        buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float32)
        kernel(primals_1, buf0)
        buf1 = torch.ops.aten.sort.stable(buf0, stable=False, dim=1, descending=False)
        del buf0
        buf2 = buf1[0]
        assert_size_stride(buf2, (4, 8), (8, 1), 'torch.ops.aten.sort.default')
        buf3 = buf1[1]
        assert_size_stride(buf3, (4, 8), (8, 1), 'torch.ops.aten.sort.default')
        del buf1
        return (buf2, buf3, )
"""


def test_fallback_outputs_take_their_ops_bytes_per_element():
    """Values 128 B and indices 256 B (int64) on the 128 B input live at
    the call; without the op's outputs the indices read 128 B."""
    sort = {"sort": ((4, 128), (8, 256))}
    peak = step_peak(_SORT_FORWARD, None, {}, sort)
    assert (peak.forward_peak_bytes, peak.held_bytes) == (128 + 128 + 256, 128 + 256)
    assert step_peak(_SORT_FORWARD, None).held_bytes == 128 + 128
    # Only the values taken out: the indices were made all the same, on
    # the input and the values, until the call's results are deleted.
    values_only = _SORT_FORWARD.replace(
        "        buf3 = buf1[1]\n"
        "        assert_size_stride(buf3, (4, 8), (8, 1), 'torch.ops.aten.sort.default')\n", ""
    ).replace("return (buf2, buf3, )", "return (buf2, )")
    peak = step_peak(values_only, None, {}, sort)
    assert (peak.forward_peak_bytes, peak.held_bytes) == (128 + 128 + 256, 128)
    assert step_peak(values_only, None).forward_peak_bytes == 128 + 128


def test_fallback_outputs_read_the_planned_graphs():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxckpt.memory.compiled_peak import fallback_outputs

    graph = make_fx(lambda x: torch.sort(x, dim=-1)[1].float() + x.topk(2)[0].sum())(
        torch.randn(4, 8)).graph
    found = fallback_outputs([graph])
    assert found["sort"] == ((4, 128), (8, 256))
    assert found["topk"] == ((4, 32), (8, 64))
    assert found["add"] == ((4, 128),)

def test_fallback_scratch_reads_the_planned_graphs():
    """fallback_scratch gives a CUDA attention backward its outputs plus the
    scratch memory.workspace_bytes counts; CPU nodes give nothing."""
    import torch
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxckpt.memory.compiled_peak import fallback_scratch
    from fxckpt.memory.scratch import workspace_bytes

    op = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    found = {}
    for device in ("cuda", "cpu"):
        with FakeTensorMode():
            q = torch.empty(2, 32, 4, 16, device=device).transpose(1, 2)
        graph = fx.Graph()
        args = []
        for name in ("grad", "q", "k", "v"):
            args.append(graph.placeholder(name))
            args[-1].meta["val"] = q
        node = graph.call_function(op, (*args, None, None, None, None, None, 0.0))
        node.meta["val"] = (q, q, q)
        found[device] = (fallback_scratch([graph]), workspace_bytes(node))
    scratch, workspace = found["cuda"]
    assert workspace > 0
    assert scratch == {"_scaled_dot_product_efficient_attention_backward":
                       workspace + 3 * 2 * 4 * 32 * 16 * 4}
    assert found["cpu"] == ({}, 0)


# The forms torch 2.14 and newer write: a fallback output's assert with its
# dtype, and input asserts grouped (deferred to the first kernel reading them).
_CUSTOM_FORWARD_DTYPE = _CUSTOM_FORWARD.replace(
    "assert_size_stride(buf2, (16, 8), (8, 1), 'torch.ops.mylib.grouped.default')",
    "assert_tensor_metadata(buf2, (16, 8), (8, 1), torch.float64, "
    "'torch.ops.mylib.grouped.default')")


def test_an_output_sized_by_assert_tensor_metadata_takes_its_dtype():
    """The output is 16 x 8 float64 (1,024 B) on buf0's 128 B: read as
    float32, or left out as torch 2.14's code once was, the peak would be
    640 or 128 B."""
    peak = step_peak(_CUSTOM_FORWARD_DTYPE, None)
    assert (peak.forward_peak_bytes, peak.held_bytes) == (128 + 1024, 1024)


def test_grouped_input_asserts_give_each_input_its_layout():
    """A grouped assert states each input's sizes; the tangent it names is
    sized from it where the planned graph's sizes are not given."""
    grouped = _BACKWARD.replace(
        "args.clear()", "args.clear()\n        assert_size_stride_grouped((tangents_1, view), "
        "((4, 8), (32, )), ((8, 1), (1, )), 'input')")
    assert step_peak(_FORWARD, grouped).peak_bytes == 512 + 128
    # Sized from the planned backward graph (tangent_bytes), the assert's
    # form does not matter, nor whether there is one.
    assert step_peak(_FORWARD, _BACKWARD, tangents={"tangents_1": 128}).peak_bytes == 512 + 128


@pytest.mark.parametrize("line, why", [
    ("buf9 = new_buffer_api((4, 8), torch.float32)", "a statement of a form not known"),
    ("assert_buffer_layout(buf0, (4, 8), (8, 1), torch.float32)", "an assert of a form not known"),
    ("buf9 = alloc_from_pool(pool0, 0, torch.float32, (4, 8), (8, 1))", "a memory pool"),
])
def test_a_statement_of_an_unknown_form_stops_the_reading(line, why):
    code = _FORWARD.replace("        del buf3\n", f"        del buf3\n        {line}\n")
    with pytest.raises(UnreadableCode) as unread:
        step_peak(code, _BACKWARD)
    assert unread.value.why == why and not unread.value.expected
    assert unread.value.line == line


def test_a_fallback_output_no_assert_sizes_stops_the_reading():
    """Returned or deleted without an assert sizing it (the form of the
    assert changed, or size asserts are off), the output's bytes are not
    known: no figure rather than none of them."""
    unsized = _CUSTOM_FORWARD.replace(
        "        assert_size_stride(buf2, (16, 8), (8, 1), 'torch.ops.mylib.grouped.default')\n",
        "")
    with pytest.raises(UnreadableCode, match="no assert sized"):
        step_peak(unsized, None)
    deleted = unsized.replace("return (buf2, primals_1, )", "del buf2\n        return (primals_1, )")
    with pytest.raises(UnreadableCode, match="deleted before any assert sized it"):
        step_peak(deleted, None)

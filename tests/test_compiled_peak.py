"""Reading a step's peak off Inductor's wrapper code (fxckpt/compiled_peak.py)."""

from fxckpt.compiled_peak import step_peak

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


def test_code_with_a_symbolic_size_is_not_read():
    code = _FORWARD.replace("(16, ), (1, )", "(s0, ), (1, )")
    assert step_peak(code, _BACKWARD) is None


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
    # buf0 and the saved view (128 + 128): 640. Its outputs then take
    # 64 + 128 on top of the 256 held once buf0 is gone.
    assert peak.peak_bytes == 640
    code = _CONV_BACKWARD.replace("buf2, (2, 8), (8, 1)", "buf2, (16, 8), (8, 1)")
    assert step_peak(_FORWARD, code).peak_bytes == 256 + 16 * 8 * 4 + 128

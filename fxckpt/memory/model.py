"""The memory model: forward and backward schedules in, a peak and a timeline out.

Allocations are storages, so views cost nothing and share their base's
lifetime. A storage is allocated when the node producing it runs and freed
after the last node that reads it, unless it outlives the graph: forward
outputs (saved values and what the caller receives) and backward outputs
(gradients) stay alive to the end of the step. Graph inputs (parameters,
buffers, the batch) exist before the step and are not counted, matching a
measurement taken above the memory in use when the step starts.

``fused=True`` models Inductor: a pointwise op whose one reader is another
pointwise op or a reduction is inlined into that reader's kernel and never
allocated (Inductor realizes a pointwise buffer when an extern kernel such as
a matmul reads it, when it leaves the graph, or when several ops read it and
its code is dear to repeat: ``inlined_by_inductor``).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from fxckpt.compat.inductor import realize_thresholds
from fxckpt.compat.ops import (OpOverload, pytree, run_and_save_rng_state, run_with_rng_state,
                               storage_id)
from fxckpt.memory.cpu_conv import MEASURED_OPS, measured_scratch
from fxckpt.memory.cuda_scratch import cuda_scratch
from fxckpt.passes import offload as _registers_offload_ops  # noqa: F401
from fxckpt.passes.dropout import APPLY_DROPOUT_MASK, DROPOUT_MASK
from fxckpt.types import BACKWARD, is_recomputed_name, point, split_point

# What fxckpt::offload returns lives in host memory, never on the device (on
# a CPU stand-in device too, where tests let host values "offload").
_HOST_COPY = torch.ops.fxckpt.offload.default


@dataclass(frozen=True)
class MemoryTimeline:
    peak_bytes: int
    peak_at: str                                  # "forward:<node>" or "backward:<node>"
    points: tuple[tuple[str, str, int], ...]      # (phase, node, live bytes after it ran)
    fused: bool = False                           # simulated with Inductor's inlining


def simulate(forward: fx.Graph, backward: fx.Graph | None = None, *,
             fused: bool = False) -> MemoryTimeline:
    walk = _walk(forward, backward, fused=fused)
    return MemoryTimeline(walk.peak, walk.peak_at, tuple(walk.points), fused)


def breakdown(forward: fx.Graph, backward: fx.Graph | None, at: str, *,
              fused: bool = False) -> tuple[dict[str, int], str, int]:
    """What the memory live while node ``at`` ("phase:name") runs is made of:
    bytes per kind (the node's own scratch as "kernel scratch"), and the
    largest single value with its bytes."""
    walk = _walk(forward, backward, stop_at=at, fused=fused)
    saved = _output_storages(forward, walk.storages)
    grads = _output_storages(backward, walk.storages) if backward is not None else set()
    parts: dict[str, int] = {}
    largest = max(walk.live.items(), key=lambda kv: kv[1], default=(None, 0))
    for ref, nbytes in walk.live.items():
        phase, producer = split_point(walk.producer.get(ref, "forward:"))
        if ref in grads:
            kind = "gradients"
        elif ref in saved and phase != BACKWARD:
            kind = "saved activations"
        elif is_recomputed_name(producer):
            kind = "recomputed values"
        elif phase == BACKWARD:
            kind = "backward temporaries"
        else:
            kind = "forward temporaries"
        parts[kind] = parts.get(kind, 0) + nbytes
    if walk.stop_scratch:
        parts["kernel scratch"] = walk.stop_scratch
    return parts, walk.producer.get(largest[0], "?"), largest[1]


def _walk(forward: fx.Graph, backward: fx.Graph | None, stop_at: str | None = None,
          fused: bool = False):
    storages = StorageMemo()
    not_counted = {ref for node in forward.find_nodes(op="placeholder")
                   for ref, _ in storages(node)}
    state = _Walk({}, not_counted, stop_at, device=_compute_device(forward), storages=storages)
    state.run(forward, "forward", keep=_output_storages(forward, storages),
              inlined=inlined_by_inductor(forward) if fused else set())
    if backward is not None and not state.stopped:
        for node in backward.find_nodes(op="placeholder"):
            state.allocate(node, "backward")  # saved values are live already; tangents are new
        state.run(backward, "backward",
                  keep=_output_storages(backward, storages) | _tangent_storages(backward, storages),
                  inlined=inlined_by_inductor(backward) if fused else set())
    return state


def inlined_by_inductor(graph: fx.Graph) -> set[fx.Node]:
    """Pointwise nodes Inductor computes inside their readers' kernels.

    A pointwise node read only by pointwise ops and reductions is inlined
    into them. With several readers Inductor still inlines it unless
    recomputing it per reader looks dear (``StorageBox.should_realize_on_reuse``):
    on CPU when its inlined code holds a transcendental op, or when that
    code reads more than ``realize_reads_threshold`` buffers or holds more
    than ``realize_opcount_threshold`` ops; and a value a reduction reads
    beside other readers is stored.

    Not modelled: the kernels and realized buffers Inductor's lowering and
    scheduler make of the planned graphs, which can make values live
    earlier or longer than here (the zoo GPT's runtime-optimal plan: 0.88
    of the measured peak; its floor plan 0.59). Under Inductor a plan's
    peak is therefore read from the code Inductor generated for it
    (fxckpt/inductor/compiled_peak.py); this model ranks candidate plans."""
    outputs = set(graph.output_node().all_input_nodes)
    nodes = [n for n in graph.nodes if n.op != "output"]
    return inlined_keys(
        nodes, inputs=lambda n: n.all_input_nodes,
        users=lambda n: [u for u in n.users if u.op != "output"], outputs=outputs,
        fuses=fuses, reduction=is_reduction, op=lambda n: n.target.__name__,
        cpu=lambda n: device_type(n) == "cpu")


def inlined_keys(order, *, inputs, users, outputs, fuses, reduction, op, cpu) -> set:
    """``inlined_by_inductor``'s rule over any graph: ``order`` its nodes
    (any hashable keys) in order, ``inputs(k)`` the distinct nodes k reads,
    ``users(k)`` the distinct nodes reading k (not the output), ``outputs``
    what the graph returns, ``fuses(k)``/``reduction(k)`` as ``fuses`` and
    ``is_reduction`` say of k's op, ``op(k)`` its op's name, ``cpu(k)``
    whether it runs on the CPU. The schedule model (passes/schedule.py)
    calls it on the node sequences it replays, so both models inline
    alike."""
    inlined: set = set()
    # What each pointwise node's inlined code is made of: op names and the
    # buffers it reads.
    code: dict = {}
    for node in order:
        if not fuses(node):
            continue
        ops, reads = {op(node)}, set()
        for arg in inputs(node):
            if arg in inlined:
                ops |= code[arg][0]
                reads |= code[arg][1]
            else:
                reads.add(arg)
        code[node] = (frozenset(ops), frozenset(reads))
        readers = users(node)
        if node in outputs or not readers \
                or not all(fuses(user) or reduction(user) for user in readers):
            continue
        if len(readers) == 1 or not _realized_on_reuse(
                any(reduction(user) for user in readers), cpu(node), *code[node]):
            inlined.add(node)
    return inlined


def _realized_on_reuse(read_by_reduction: bool, on_cpu: bool, ops: frozenset,
                       reads: frozenset) -> bool:
    if read_by_reduction:
        # A reduction and a pointwise reader loop differently: Inductor
        # stores the value once for both (seen in its CPU kernels for
        # layer norm's input).
        return True
    if on_cpu and any(op.split(".")[0] in _HEAVY_ON_CPU for op in ops):
        return True
    opcount, reads_threshold = realize_thresholds()
    return len(ops) > opcount or len(reads) > reads_threshold


# Ops Inductor will not recompute per reader on CPU (ir.StorageBox).
_HEAVY_ON_CPU = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})


def fuses(node: fx.Node) -> bool:
    """Inductor lowers the op to pointwise code it can inline."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return False
    return torch.Tag.pointwise in target.tags or target.__name__ in _INDUCTOR_POINTWISE


def is_reduction(node: fx.Node) -> bool:
    return getattr(node.target, "overloadpacket", None) in _REDUCTIONS


# Inductor's random prims and constant fills lower to pointwise code.
_INDUCTOR_POINTWISE = frozenset({"inductor_random.default", "inductor_randint.default",
                                 "full.default", "scalar_tensor.default"})


class _Walk:
    def __init__(self, live, not_counted, stop_at=None, device="cpu", storages=None):
        self.storages = storages or StorageMemo()
        self.device = device    # host copies of a device graph are not device memory
        self.live = live
        self.live_bytes = sum(live.values())  # kept as ``live`` changes: read per node
        self.not_counted = not_counted
        self.stop_at, self.stopped = stop_at, False
        self.stop_scratch = 0   # the scratch the node stopped at holds while it runs
        self.producer: dict[StorageWeakRef, str] = {}
        self.peak, self.peak_at, self.points = 0, "", []

    def allocate(self, node: fx.Node, phase: str) -> None:
        if node.target is _HOST_COPY:
            # Host memory, here and where backward reads it as an input.
            self.not_counted.update(ref for ref, _ in self.storages(node))
            return
        if device_type(node) not in (self.device, ""):
            return
        for ref, nbytes in self.storages(node):
            if ref not in self.live and ref not in self.not_counted:
                self.live[ref] = nbytes
                self.live_bytes += nbytes
                self.producer[ref] = point(phase, node.name)

    def run(self, graph: fx.Graph, phase: str, *, keep: set, inlined=frozenset()) -> None:
        frees: dict[int, list[StorageWeakRef]] = {}
        for ref, last in _last_uses(graph, self.storages).items():
            frees.setdefault(last, []).append(ref)
        for index, node in enumerate(graph.nodes):
            if node.op == "output":
                break
            if node not in inlined:
                self.allocate(node, phase)
            total = self.live_bytes + workspace_bytes(node)
            if total > self.peak:
                self.peak, self.peak_at = total, point(phase, node.name)
            if self.stop_at is not None and self.stop_at == point(phase, node.name):
                self.stopped, self.stop_scratch = True, workspace_bytes(node)
                return
            for ref in frees.get(index, ()):
                if ref not in keep:
                    self.live_bytes -= self.live.pop(ref, 0)
            self.points.append((phase, node.name, self.live_bytes))


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
        target, args, extra = args[1], args[2:], _nbytes(args[0])
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
        extra += 8 + _element_size(node)
    elif packet in _WRAPS_NUMBERS:
        extra += _promotion_bytes(packet, args)
    elif packet in _CPU_BUFFERS:
        extra += _CPU_BUFFERS[packet](node, args)
    return extra + sum(_nbytes(args[i]) if i >= 0 else _output_bytes(node) for i in operand)


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
    return 8 + _element_size(node)


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


def _element_size(node: fx.Node) -> int:
    value = node.meta.get("val")
    return value.element_size() if isinstance(value, torch.Tensor) else 0


def _safe_softmax_scratch(node: fx.Node) -> int:
    value, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0
    numel = concrete(value.numel())
    width = concrete(value.shape[node.args[1]]) if value.dim() else 1
    return numel + numel // max(width, 1) + out.element_size()


_aten = torch.ops.aten
_REDUCTIONS = frozenset({_aten.sum, _aten.mean, _aten.amax, _aten.amin, _aten.prod,
                         _aten.var_mean, _aten.var, _aten.max, _aten.min,
                         _aten.argmax, _aten.argmin, _aten.any, _aten.all})
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


def grows_memory(node: fx.Node, storages=None) -> bool:
    """Whether running ``node`` allocates more bytes than all its tensor
    inputs hold together: new storages (not views of an input) larger than
    the inputs' storages. Run later, such a node never raises the memory
    live in between (what it would free is smaller than what it allocates).
    ``storages``: a StorageMemo to read nodes' storages through."""
    if node.op != "call_function":
        return False
    made, held = allocation(node, storages)
    return made > held


def allocated_bytes(node: fx.Node, storages=None) -> int:
    """Bytes of the storages ``node`` makes: not those of its inputs (a view
    makes none)."""
    return allocation(node, storages)[0]


def allocation(node: fx.Node, storages=None) -> tuple[int, int]:
    """(``allocated_bytes(node)``, bytes of its inputs' storages), read
    together: ``storages`` (a StorageMemo, or none) reads each storage once."""
    storages = storages or _storages
    return storage_allocation(storages(node), [storages(a) for a in node.all_input_nodes])


def storage_allocation(own, inputs) -> tuple[int, int]:
    """``allocation`` from storages already read: ``own`` a node's (storage,
    bytes) pairs, ``inputs`` its inputs'. Storages may be any keys that are
    equal where the storages are (the schedule model numbers them)."""
    held = {ref: nbytes for found in inputs for ref, nbytes in found}
    made = sum(nbytes for ref, nbytes in dict(own).items() if ref not in held)
    return made, sum(held.values())


def _nbytes(node) -> int:
    return tensor_bytes(node.meta.get("val")) if isinstance(node, fx.Node) else 0


def storage_key(t: torch.Tensor) -> int | None:
    """What identifies the storage a tensor lives in (views share it), while
    it is alive; None for tensors without one (sparse, some subclasses)."""
    try:
        return storage_id(t)
    except (RuntimeError, NotImplementedError):
        return None


def tensor_bytes(val) -> int:
    """Bytes of the tensors in ``val`` (a tensor or a structure of them)."""
    return sum(concrete(v.numel()) * v.element_size() for v in _leaves(val)
               if isinstance(v, torch.Tensor))


def _compute_device(graph: fx.Graph) -> str:
    """The accelerator a graph runs on, or "cpu"."""
    for node in graph.nodes:
        device = device_type(node)
        if device not in ("", "cpu"):
            return device
    return "cpu"


def _output_bytes(node: fx.Node) -> int:
    """Bytes of an op's result (for an RNG wrapper: the wrapped op's result)."""
    val = node.meta.get("val")
    if node.target is run_and_save_rng_state and isinstance(val, tuple):
        val = val[1]
    return tensor_bytes(val)


def _leaves(val) -> list:
    """``val``'s leaves (a tensor is its own: the common case, without pytree)."""
    return [val] if isinstance(val, torch.Tensor) else pytree.tree_leaves(val)


def device_type(node: fx.Node) -> str:
    """The device type of the first tensor ``node`` makes ("" for none)."""
    for v in _leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            return v.device.type
    return ""


# PyTorch's CUDA caching allocator hands out blocks in multiples of 512 bytes,
# and its allocated-bytes count (what a step's peak is measured by) counts
# the blocks.
CUDA_BLOCK_BYTES = 512


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


def _storages(node: fx.Node) -> list[tuple[StorageWeakRef, int]]:
    found = []
    for val in _leaves(node.meta.get("val")):
        if isinstance(val, torch.Tensor):
            storage = val.untyped_storage()
            nbytes = storage_nbytes(node, val)
            if val.device.type == "cuda":
                nbytes = -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
            found.append((StorageWeakRef(storage), nbytes))
    return found


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


def _last_uses(graph: fx.Graph, storages) -> dict[StorageWeakRef, int]:
    """Index of the last node reading each storage (its producer if none does)."""
    last: dict[StorageWeakRef, int] = {}
    for index, node in enumerate(graph.nodes):
        for ref, _ in storages(node):
            last.setdefault(ref, index)
        for arg in node.all_input_nodes:
            for ref, _ in storages(arg):
                last[ref] = index
    return last


def _tangent_storages(graph: fx.Graph, storages) -> set[StorageWeakRef]:
    """Storages of backward's incoming gradients: autograd holds them until
    the compiled backward returns (its grad_outputs), whatever reads them."""
    return {ref for node in graph.find_nodes(op="placeholder")
            if node.name.startswith("tangents") for ref, _ in storages(node)}


def _output_storages(graph: fx.Graph, storages) -> set[StorageWeakRef]:
    output = graph.output_node()
    return {ref for arg in output.all_input_nodes for ref, _ in storages(arg)}


class StorageMemo:
    """``_storages`` of nodes, each value's read once per simulation: the
    forward and backward graphs (and clones) share their ``meta["val"]``
    objects, and sizes cannot change while one simulation runs."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, list]] = {}

    def __call__(self, node: fx.Node) -> list[tuple[StorageWeakRef, int]]:
        val = node.meta.get("val")
        hit = self._seen.get(id(val))
        if hit is None or hit[0] is not val:
            hit = (val, _storages(node))
            self._seen[id(val)] = hit
        return hit[1]

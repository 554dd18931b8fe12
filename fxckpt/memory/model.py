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

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from fxckpt.compat.inductor import realize_thresholds
from fxckpt.compat.ops import OpOverload
from fxckpt.kernels import offload as _registers_offload_ops  # noqa: F401
from fxckpt.memory.scratch import storage_nbytes, workspace_bytes
from fxckpt.memory.values import CUDA_BLOCK_BYTES, device_type, leaves
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
    (fxckpt/memory/compiled_peak.py); this model ranks candidate plans."""
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
    whether it runs on the CPU. The schedule model (memory/schedule.py)
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


_aten = torch.ops.aten
_REDUCTIONS = frozenset({_aten.sum, _aten.mean, _aten.amax, _aten.amin, _aten.prod,
                         _aten.var_mean, _aten.var, _aten.max, _aten.min,
                         _aten.argmax, _aten.argmin, _aten.any, _aten.all})


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


def _compute_device(graph: fx.Graph) -> str:
    """The accelerator a graph runs on, or "cpu"."""
    for node in graph.nodes:
        device = device_type(node)
        if device not in ("", "cpu"):
            return device
    return "cpu"


def _storages(node: fx.Node) -> list[tuple[StorageWeakRef, int]]:
    found = []
    for val in leaves(node.meta.get("val")):
        if isinstance(val, torch.Tensor):
            storage = val.untyped_storage()
            nbytes = storage_nbytes(node, val)
            if val.device.type == "cuda":
                nbytes = -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
            found.append((StorageWeakRef(storage), nbytes))
    return found


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

"""A step's peak read from the code Inductor generated for it.

Under Inductor the memory model (memory/model.py) predicts from the planned FX
graphs, but Inductor decides the real allocation order after the partition:
its scheduler fuses kernels, and a fused kernel runs where its earliest part
was, so values recomputed for late in backward can be made in the first
backward kernel; it realizes or inlines pointwise values by its own rules;
and its wrapper reuses freed buffers. None of that is in the FX graphs.

The wrapper code Inductor emits is the allocation order itself: each buffer
is made by ``empty_strided_<device>(size, stride, dtype)`` (or returned by a
fallback kernel, whose size the assert after it states, under that name or
another it is bound to first, as a custom operator's output is; it is made
while the kernel's inputs are live, though the lines before the assert
delete them), is handed on by ``# reuse`` lines without a new allocation,
and is freed by ``del``. fxckpt/compat/wrapper_code.py reads the
statements; a statement of a form it does not know, or a fallback output
no assert sizes, stops the reading (UnreadableCode), never read as no
memory. Walking the forward's code,
keeping what it returns (saved values and outputs), then the backward's
code, with its inputs bound to the forward's saved values, gives the live
bytes after every line and their maximum: the step's peak as the allocator
sees it. Scratch memory that
CPU convolution kernels and CUDA attention kernels allocate and free inside
themselves is added as memory.workspace_bytes counts it; other scratch is
not seen. A fallback kernel's outputs take their op's bytes per element
from the planned graphs where their asserts name no dtype (float32 where
the op is not there), and outputs of a call the code never takes out its
op's largest (``fallback_outputs``); the backward's tangents are sized
from the planned backward graph (``tangent_bytes``).

Why read the code rather than model Inductor or constrain it: the gap
between the FX-level model and the compiled code is not one mechanism.
On the zoo GPT, refusing horizontal fusion of kernels holding recomputed
ops (an InductorChoices override) left the measured peak unchanged; the
extra memory comes from buffers Inductor realizes that the model inlines
and from the order its lowering gives kernels, and both change with
Inductor's heuristics and version. Reading the generated code follows them
all, and constraining the scheduler would cost fusions. So the compiled
plan's real peak is checked against a byte budget, and planning/capture.py plans
again below the budget by the excess where it is over, or refuses the
budget naming the lowest compiled peak it saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fxckpt.compat import wrapper_code as code
from fxckpt.compat.wrapper_code import UnreadableCode
from fxckpt.memory.cpu_conv import call_scratch
from fxckpt.memory.scratch import workspace_bytes
from fxckpt.memory.values import CUDA_BLOCK_BYTES, device_type, tensor_bytes


@dataclass(frozen=True)
class CompiledPeak:
    peak_bytes: int           # forward and backward, above the memory in use at entry
    forward_peak_bytes: int
    held_bytes: int           # what the forward leaves for backward (saved values, outputs)
    # What the forward made and backward takes, each storage once (None: no
    # backward code). It can differ from the planned graphs' saved values:
    # Inductor may save a copy it made (a CPU convolution's weight in the
    # channels-last layout it picked) where the graph saves the parameter.
    saved_bytes: int | None = None


def step_peak(forward_code: str, backward_code: str | None,
              kernel_scratch: dict[str, int] | None = None,
              outputs: dict[str, tuple[tuple[int, int], ...]] | None = None,
              tangents: dict[str, int] | None = None) -> CompiledPeak:
    """The step's peak from Inductor's forward and backward wrapper code;
    UnreadableCode where the code holds a statement this reading does not
    know or cannot size (``expected`` for symbolic sizes), so no figure is
    better than a wrong one. ``kernel_scratch``: for fallback kernels on
    CUDA that hold scratch memory (attention), op name -> the most bytes
    one call holds, its outputs included (``fallback_scratch``);
    ``outputs``: op name -> (bytes per element, most bytes) of each of its
    outputs (``fallback_outputs``; an output not known there is taken as
    float32 where its assert names no dtype, and one the code never takes
    out of a call's results as nothing); ``tangents``: the backward's
    tangents' bytes by input name (``tangent_bytes``; else sized by the
    code's input asserts, as float32)."""
    forward = code.call_body(forward_code)
    walk = _Walk()
    walk.cpu = _on_cpu(forward)
    walk.kernel_scratch = dict(kernel_scratch or {})
    walk.outputs = dict(outputs or {})
    returned = walk.run(forward)
    kept = {walk.names[name] for name in returned if name in walk.names}
    walk.keep_only(kept)
    forward_peak, held = walk.peak, walk.level
    saved_bytes = None
    if backward_code is not None:
        backward = code.call_body(backward_code)
        inputs = _inputs(backward)
        saved_count = sum(not name.startswith("tangents") for name in inputs)
        saved = returned[len(returned) - saved_count:] if saved_count else []
        old = walk.names
        walk.names = {arg: old[ret] for arg, ret in zip(inputs, saved) if ret in old}
        saved_bytes = sum(walk.sizes.get(storage, 0) for storage in set(walk.names.values()))
        # The backward's names are its own (its input asserts state them).
        walk.layouts = {}
        walk.inputs = set(inputs)
        # Tangents are made by autograd for the backward and held by it
        # until the backward returns, whatever the code deletes.
        for name in inputs:
            if not name.startswith("tangents"):
                continue
            if tangents is not None and name in tangents:
                walk.allocate(name, tangents[name])
            else:
                walk.expect(name, None, None)
        walk.run(backward)
    return CompiledPeak(walk.peak, forward_peak, held, saved_bytes)


def _inputs(body: list[str]) -> list[str]:
    for statement in code.statements(body[:1]):
        if isinstance(statement, code.Inputs):
            return list(statement.names)
    raise UnreadableCode("a call whose first statement does not unpack its args", body[0])


def _on_cpu(body: list[str]) -> bool:
    """Whether the call allocates on the CPU only. Read from the call's own
    allocations: the module's preamble binds every device's allocator
    (``empty_strided_cpu = ...``), whatever device the code runs on."""
    return not any(line.split(" = ", 1)[-1].startswith("empty_strided_")
                   and " = empty_strided_cpu(" not in line for line in body)


@dataclass
class _Call:
    """A fallback kernel's call: the bytes live when it ran (its inputs are
    live while it makes its outputs, whatever the lines after it delete
    before the asserts place them), its outputs placed so far, its op's
    outputs' (bytes per element, most bytes) where known
    (``fallback_outputs``), and which of them the code took out."""

    name: str
    held: int
    outputs: tuple = ()
    placed: int = 0
    taken: set = field(default_factory=set)


@dataclass
class _Output:
    """A fallback's output its assert has not sized yet: the call it is
    from (None for a tangent, which autograd makes), its bytes per element
    where known, and every name bound to it (a custom operator's output is
    named again before the assert, which may name either)."""

    call: _Call | None
    itemsize: int | None
    names: set
    has_items: bool = False   # a call's results of which items were taken


class _Walk:
    """Live storages while the wrapper's statements run, by the names bound to them."""

    def __init__(self) -> None:
        self.names: dict[str, object] = {}
        self.sizes: dict[object, int] = {}
        self.level = self.peak = 0
        self.pending: dict[str, _Output] = {}   # fallback outputs not yet sized
        self.calls: dict[str, _Call] = {}       # by the name of a call's results
        self.outputs: dict[str, tuple[tuple[int, int], ...]] = {}
        self.scratch_of: dict[str, int] = {}   # a CPU convolution's output -> its scratch
        # name -> (sizes, strides, dtype or None) where the code states them
        # (allocations, asserts): what a CPU convolution's scratch is measured at.
        self.layouts: dict[str, tuple] = {}
        self.inputs: set[str] = set()
        self.cpu = True
        self.kernel_scratch: dict[str, int] = {}

    def allocate(self, name: str, nbytes: int) -> None:
        if not self.cpu:
            # The CUDA caching allocator hands out whole 512-byte blocks.
            nbytes = -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
        storage = object()
        self.names[name] = storage
        self.sizes[storage] = nbytes
        self.level += nbytes
        self.peak = max(self.peak, self.level)

    def delete(self, name: str) -> None:
        if name.startswith("tangents"):
            return
        output = self.pending.pop(name, None)
        if output is not None:
            output.names.discard(name)      # its assert, if any, binds the others
            if not output.names and not output.has_items and output.call is not None \
                    and len(output.call.outputs) <= 1:
                raise UnreadableCode(f"a fallback kernel's output {name} deleted before "
                                     "any assert sized it")
        call = self.calls.pop(name, None)
        if call is not None and len(call.outputs) > 1:
            # A call's results deleted: the outputs never taken out of them
            # were made too, at most their op's largest (sort's indices
            # where only the values are used).
            untaken = sum(most for k, (_, most) in enumerate(call.outputs)
                          if k not in call.taken)
            self.peak = max(self.peak, call.held + call.placed + untaken)
        storage = self.names.pop(name, None)
        if storage in self.sizes and storage not in self.names.values():
            self.level -= self.sizes.pop(storage)

    def keep_only(self, kept: set) -> None:
        for storage in list(self.sizes):
            if storage not in kept:
                self.level -= self.sizes.pop(storage)

    def run(self, body: list[str]) -> list[str]:
        """Walk ``body``; return the names its ``return`` hands back."""
        returned: list[str] = []
        for statement in code.statements(body):
            if isinstance(statement, code.Return):
                returned = list(statement.names)
                self.check_returned(returned)
            elif isinstance(statement, code.Inputs):
                self.inputs |= set(statement.names)
            else:
                self.step(statement)
        return returned

    def check_returned(self, returned: list[str]) -> None:
        """Every value returned is a buffer the walk sized or an input."""
        for name in returned:
            if name in self.pending:
                raise UnreadableCode(f"returns {name}, a fallback kernel's output no "
                                     "assert sized")
            if name and name != "None" and name not in self.names and name not in self.inputs:
                raise UnreadableCode(f"returns {name}, a value the reading never saw made")

    def step(self, statement) -> None:
        if isinstance(statement, code.Allocate):
            self.allocate(statement.name, _nbytes(statement.sizes, statement.strides,
                                                  statement.dtype))
            self.layouts[statement.name] = (code.ints(statement.sizes),
                                            code.ints(statement.strides), statement.dtype)
        elif isinstance(statement, code.Reuse):
            # A buffer reused under a new name: Inductor writes a plain alias
            # where the two layouts are the same, reinterpret_tensor (sizes
            # and strides stated) where they differ; an assert after it, if
            # any, says again.
            self.bind_layout(statement.name, statement.value)
            storage = self.names.pop(statement.freed, None)
            if storage is not None:
                self.names[statement.name] = storage
        elif isinstance(statement, code.FallbackCall):
            self.fallback_call(statement)
        elif isinstance(statement, code.Item) and statement.base in self.pending:
            # One output of a multi-output fallback.
            base = self.pending[statement.base]
            base.has_items = True
            call, index, itemsize = base.call, statement.index, None
            if call is not None and len(index) == 1 and index[0] < len(call.outputs):
                itemsize = call.outputs[index[0]][0]
                call.taken.add(index[0])
            self.expect(statement.name, call, itemsize)
        elif isinstance(statement, code.SizeAssert):
            self.size_assert(statement)
        elif isinstance(statement, (code.Alias, code.Item)):
            value = statement.value if isinstance(statement, code.Alias) else statement.base
            self.bind_layout(statement.name, value)
            if statement.base in self.names:
                self.names[statement.name] = self.names[statement.base]
            elif statement.base in self.pending:
                # A fallback's output named again before the assert that
                # sizes it (``buf46 = buf45`` after a custom operator's
                # call, the assert naming buf46): the assert sizes both.
                output = self.pending[statement.name] = self.pending[statement.base]
                output.names.add(statement.name)
        elif isinstance(statement, code.Delete):
            for name in statement.names:
                self.delete(name)

    def fallback_call(self, statement: code.FallbackCall) -> None:
        op = statement.op
        if statement.wrapped is not None:
            # A wrapped op's outputs come with a generator state: only a
            # plain call's outputs are its op's, in order.
            op, outputs = statement.wrapped, ()
        else:
            outputs = self.outputs.get(op, ())
        call = self.calls[statement.name] = _Call(statement.name, self.level, outputs)
        # Its size comes in the assert after it.
        self.expect(statement.name, call, outputs[0][0] if len(outputs) == 1 else None)
        _scratch(self, statement.name, op, statement.operands, statement.text)

    def size_assert(self, statement: code.SizeAssert) -> None:
        name = statement.name
        known = self.layouts.get(name)
        dtype = statement.dtype or (known[2] if known and name not in self.pending else None)
        self.layouts[name] = (code.ints(statement.sizes), code.ints(statement.strides), dtype)
        if name not in self.pending:
            return
        output = self.pending[name]
        itemsize = getattr(torch, statement.dtype).itemsize if statement.dtype \
            else output.itemsize
        self.allocate(name, _nbytes(statement.sizes, statement.strides, "float32", itemsize))
        for other in output.names:
            self.pending.pop(other)
            self.names[other] = self.names[name]
        call = output.call
        if call is None:
            return
        call.placed += self.sizes[self.names[name]]
        self.peak = max(self.peak, call.held + call.placed)
        scratch = self.scratch_of.pop(call.name, None)
        if scratch is not None:
            # A CPU convolution's scratch, held while its output is made
            # (_scratch; -1: the rule's temporary of the output's size).
            if scratch < 0:
                scratch = self.sizes[self.names[name]]
            self.peak = max(self.peak, self.level + scratch)

    def bind_layout(self, name: str, value: str) -> None:
        """``name`` bound to ``value`` (a name, or reinterpret_tensor of one
        with the sizes and strides it states): its layout, where known."""
        self.layouts.pop(name, None)
        part = _part(self, value.strip(), None)
        if part is not None and part[0] == "tensor":
            self.layouts[name] = part[1:]

    def expect(self, name: str, call: _Call | None, itemsize: int | None) -> None:
        """``name`` is an output of ``call`` (None: a tangent) that the
        assert naming it is to size."""
        self.pending[name] = _Output(call, itemsize, {name})


def _scratch(walk: _Walk, output: str, op: str, operands, statement: str) -> None:
    """Scratch memory of a fallback kernel while it runs, as
    memory.workspace_bytes counts it: a CPU convolution's measured by
    running it at the sizes, strides and arguments of the call
    (memory/cpu_conv.py; where the call cannot be read, the rule: the
    forward's output-sized temporary, known at its size assert, and the
    backward's copies of its three operands); on CUDA, what
    ``kernel_scratch`` gives the op (outputs and scratch together) on top
    of what is live when it is called."""
    if not walk.cpu:
        walk.peak = max(walk.peak, walk.level + walk.kernel_scratch.get(op, 0))
        return
    if op not in ("convolution", "convolution_backward"):
        return
    parts = _conv_parts(walk, op, statement)
    scratch = None if parts is None else call_scratch(op, parts)
    if op == "convolution":
        walk.scratch_of[output] = -1 if scratch is None else scratch
        return
    if scratch is None:
        held = sum(walk.sizes.get(walk.names.get(name), 0) for name in operands if name)
        walk.peak = max(walk.peak, walk.level + held)
        return
    # Its outputs, as big as the input, the weight and the bias (those
    # asked for), are made while it holds its scratch.
    mask = parts[10][1] if len(parts) > 10 and parts[10][0] == "list" else (True,) * 3
    grad_input, weight = parts[1], parts[2]
    made = mask[0] * _part_bytes(grad_input) + mask[1] * _part_bytes(weight) \
        + mask[2] * weight[1][0] * getattr(torch, weight[3]).itemsize
    walk.peak = max(walk.peak, walk.level + made + scratch)


# The arguments of aten.convolution after its three tensors, by name
# (extern_kernels.convolution passes them as keywords).
_CONV_KEYWORDS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")
_DTYPES = {4: "float32", 8: "float64", 2: "bfloat16"}


def _conv_parts(walk: _Walk, op: str, statement: str) -> tuple | None:
    """A CPU convolution call's arguments as memory/cpu_conv.call_scratch
    takes them; None where they cannot all be read."""
    arguments = code.call_arguments(statement, op)
    if arguments is None:
        return None
    args, keywords = arguments
    args += [keywords[k] for k in _CONV_KEYWORDS if k in keywords]
    default = _DTYPES.get((walk.outputs.get(op) or ((4, 0),))[0][0], "float32")
    parts = []
    for k, arg in enumerate(args):
        part = _part(walk, arg, default) if k < 3 else code.literal(arg)
        if part is None:
            return None
        parts.append(part)
    return tuple(parts)


def _part(walk: _Walk, arg: str, dtype: str) -> tuple | None:
    """A tensor argument: ("tensor", sizes, strides, dtype), or ("const",
    None) for None."""
    if arg == "None":
        return ("const", None)
    if arg.startswith("reinterpret_tensor("):
        inner = code.reinterpreted(arg)
        if inner is None:
            return None
        known = walk.layouts.get(inner[0])
        sizes, strides = code.literal(inner[1]), code.literal(inner[2])
        if sizes is None or strides is None:
            return None
        return ("tensor", tuple(sizes[1]), tuple(strides[1]),
                (known[2] if known and known[2] else dtype))
    known = walk.layouts.get(arg)
    if known is None or known[0] is None or known[1] is None:
        return None
    return ("tensor", known[0], known[1], known[2] or dtype)


def _part_bytes(part: tuple) -> int:
    return _span_bytes(part[1], part[2], getattr(torch, part[3]).itemsize)


def _nbytes(size: str, stride: str, dtype: str, itemsize: int | None = None) -> int:
    sizes, strides = code.ints(size), code.ints(stride)
    if sizes is None or strides is None:
        raise UnreadableCode("symbolic sizes", f"({size}), ({stride})", expected=True)
    return _span_bytes(sizes, strides, itemsize or getattr(torch, dtype).itemsize)


def _span_bytes(sizes, strides, itemsize: int) -> int:
    """Bytes a tensor of these sizes and strides spans."""
    if any(s == 0 for s in sizes):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * itemsize


def fallback_outputs(graphs) -> dict[str, tuple[tuple[int, int], ...]]:
    """Op name -> (bytes per element, most bytes) of each of its outputs,
    the largest over the nodes of ``graphs`` (the planned FX graphs) that
    call it. The wrapper code's asserts name no dtype (sort's and topk's
    int64 indices read as float32 took half their bytes), and a call's
    outputs the code never takes out have no assert at all."""
    found: dict[str, list[list[int]]] = {}
    for name, node in _op_calls(graphs):
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else (value,)
        known = found.setdefault(name, [])
        known.extend([0, 0] for _ in range(len(values) - len(known)))
        for k, item in enumerate(values):
            if isinstance(item, torch.Tensor):
                known[k][0] = max(known[k][0], item.dtype.itemsize)
                known[k][1] = max(known[k][1], tensor_bytes(item))
    return {name: tuple((size or 4, most) for size, most in sizes)
            for name, sizes in found.items()}


def tangent_bytes(graphs) -> dict[str, int]:
    """The backward's tangents' bytes by input name, from the planned
    backward graph (``graphs``: forward, backward): the wrapper's own input
    asserts are written where a kernel first reads each input, in a form
    that changes between releases."""
    backward = graphs[-1]
    return {node.name: tensor_bytes(node.meta.get("val"))
            for node in backward.find_nodes(op="placeholder")
            if node.name.startswith("tangents")}


def fallback_scratch(graphs) -> dict[str, int]:
    """Op name -> the most bytes one call of it holds, outputs and scratch
    together, over the nodes of ``graphs`` (the planned FX graphs) whose
    scratch memory.workspace_bytes counts on a device other than the CPU:
    the wrapper code names the kernel, the graphs know its shapes."""
    found: dict[str, int] = {}
    for name, node in _op_calls(graphs):
        if device_type(node) in ("", "cpu"):
            continue
        scratch = workspace_bytes(node)
        if scratch:
            held = scratch + tensor_bytes(node.meta.get("val"))
            found[name] = max(found.get(name, 0), held)
    return found


def _op_calls(graphs):
    """(op name, node) of the nodes of ``graphs`` that call an operator:
    the name the wrapper code calls it by."""
    for graph in graphs:
        for node in graph.nodes:
            packet = getattr(node.target, "overloadpacket", None)
            if node.op == "call_function" and packet is not None:
                yield packet.__name__, node

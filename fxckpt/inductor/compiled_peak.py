"""A step's peak read from the code Inductor generated for it.

Under Inductor the memory model (memory/model.py) predicts from the planned FX
graphs, but Inductor decides the real allocation order after the partition:
its scheduler fuses kernels, and a fused kernel runs where its earliest part
was, so values recomputed for late in backward can be made in the first
backward kernel; it realizes or inlines pointwise values by its own rules;
and its wrapper reuses freed buffers. None of that is in the FX graphs.

The wrapper code Inductor emits is the allocation order itself: each buffer
is made by ``empty_strided_<device>(size, stride, dtype)`` (or returned by a
fallback kernel, whose size the following ``assert_size_stride`` states,
under that name or another it is bound to first, as a custom operator's
output is; it is made while the kernel's inputs are live, though the lines
before the assert delete them), is handed on by ``# reuse`` lines without a
new allocation, and is freed by ``del``. Walking the forward's code,
keeping what it returns (saved values and outputs), then the backward's
code, with its inputs bound to the forward's saved values, gives the live
bytes after every line and their maximum: the step's peak as the allocator
sees it. Scratch memory that
CPU convolution kernels and CUDA attention kernels allocate and free inside
themselves is added as memory.workspace_bytes counts it; other scratch is
not seen. A fallback kernel's outputs take their op's bytes per element
from the planned graphs (their asserts name no dtype; float32 where the
op is not there), and outputs of a call the code never takes out its
op's largest (``fallback_outputs``).

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

import ast
import re
from dataclasses import dataclass, field

import torch

from fxckpt.memory.cpu_conv import call_scratch
from fxckpt.memory.model import CUDA_BLOCK_BYTES, device_type, tensor_bytes, workspace_bytes

_ALLOC = re.compile(r"^(\w+) = empty_strided_\w+\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)")
_REUSE = re.compile(r"^(\w+) = (?:reinterpret_tensor\()?(\w+)\b.*; del (\w+)\s+# reuse")
_ALIAS = re.compile(r"^(\w+) = (?:reinterpret_tensor\()?(\w+)(?:\)|,|\[|$)")
_CALL = re.compile(r"^(\w+) = (?:torch\.ops\.aten|torch\.ops(?=\.higher_order\.)|torch\.ops\.\w+"
                   r"|extern_kernels)\.(\w+)[.(]"
                   r"(?:default\()?(\w+)?(?:, (\w+))?(?:, (\w+))?")
# One output of a multi-output fallback; a random op run under fxckpt's RNG
# replay returns (state, outputs), so its outputs are items of an item.
_ITEM = re.compile(r"^(\w+) = (\w+)((?:\[\d+\])+)$")
# The op a higher-order wrapper (run_and_save_rng_state, run_with_rng_state) runs.
_WRAPPED = re.compile(r"torch\.ops\.aten\.(\w+)\.")
_ASSERT = re.compile(r"^assert_size_stride\((\w+), \(([^)]*)\), \(([^)]*)\)")
_ARGS = re.compile(r"^(.*) = args$")


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
              outputs: dict[str, tuple[tuple[int, int], ...]] | None = None
              ) -> CompiledPeak | None:
    """The step's peak from Inductor's forward and backward wrapper code;
    None where the code holds lines this reading does not understand (an
    allocation of a symbolic size, a memory pool), so no figure is better
    than a wrong one. ``kernel_scratch``: for fallback kernels on CUDA that
    hold scratch memory (attention), op name -> the most bytes one call
    holds, its outputs included (``fallback_scratch``); ``outputs``: op
    name -> (bytes per element, most bytes) of each of its outputs
    (``fallback_outputs``; an output not known there is taken as
    float32, and one the code never takes out of a call's results as
    nothing)."""
    try:
        forward = _call_body(forward_code)
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
            backward = _call_body(backward_code)
            inputs = _ARGS.match(backward[0])[1].split(", ")
            saved_count = sum(not name.startswith("tangents") for name in inputs)
            saved = returned[len(returned) - saved_count:] if saved_count else []
            old = walk.names
            walk.names = {arg: old[ret] for arg, ret in zip(inputs, saved) if ret in old}
            saved_bytes = sum(walk.sizes.get(storage, 0)
                              for storage in set(walk.names.values()))
            # The backward's names are its own (its input asserts state them).
            walk.layouts = {}
            # Tangents are made by autograd for the backward, sized by the
            # wrapper's input asserts (as float32: a loss's gradient), and
            # held by autograd until the backward returns, whatever it deletes.
            for name in inputs:
                if name.startswith("tangents"):
                    walk.expect(name, None, None)
            walk.run(backward[1:])
    except _Unreadable:
        return None
    return CompiledPeak(walk.peak, forward_peak, held, saved_bytes)


def _on_cpu(body: list[str]) -> bool:
    """Whether the call allocates on the CPU only. Read from the call's own
    allocations: the module's preamble binds every device's allocator
    (``empty_strided_cpu = ...``), whatever device the code runs on."""
    return not any(_ALLOC.match(line) and " = empty_strided_cpu(" not in line for line in body)


class _Unreadable(Exception):
    pass


def _call_body(code: str) -> list[str]:
    lines = code.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "def call(self, args):"]
    if len(starts) != 1:
        raise _Unreadable("no single call()")
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip()) + 4
    body = []
    for line in lines[starts[0] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        if line.strip():
            body.append(line.strip())
    return body


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


class _Walk:
    """Live storages while the wrapper's lines run, by the names bound to them."""

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
        for line in body:
            if line.startswith("#"):
                continue
            code = line.split("  #")[0] if "# reuse" not in line else line
            if code.startswith("return "):
                returned = _returned_names(code)
                continue
            statements = [code] if "# reuse" in line else [s.strip() for s in code.split(";")]
            for statement in statements:
                self.step(statement)
        return returned

    def step(self, statement: str) -> None:
        if "alloc_from_pool" in statement or "empty_strided" in statement \
                and not _ALLOC.match(statement):
            raise _Unreadable(statement)
        if match := _ALLOC.match(statement):
            self.allocate(match[1], _nbytes(match[2], match[3], match[4]))
            self.layouts[match[1]] = (_ints(match[2]), _ints(match[3]), match[4])
        elif match := _REUSE.match(statement):
            # A buffer reused under a new name: Inductor writes a plain alias
            # where the two layouts are the same, reinterpret_tensor (sizes
            # and strides stated) where they differ; an assert after it, if
            # any, says again.
            self.bind_layout(match[1], statement.split(" = ", 1)[1].split("; del ")[0])
            storage = self.names.pop(match[3], None)
            if storage is not None:
                self.names[match[1]] = storage
        elif match := _CALL.match(statement):
            op = match[2]
            if op == "higher_order" and (wrapped := _WRAPPED.search(statement)):
                # A wrapped op's outputs come with a generator state: only
                # a plain call's outputs are its op's, in order.
                op, outputs = wrapped[1], ()
            else:
                outputs = self.outputs.get(op, ())
            call = self.calls[match[1]] = _Call(match[1], self.level, outputs)
            # Its size comes in the assert after it.
            self.expect(match[1], call, outputs[0][0] if len(outputs) == 1 else None)
            _scratch(self, match[1], op, match.group(3, 4, 5), statement)
        elif (match := _ITEM.match(statement)) and match[2] in self.pending:
            # One output of a multi-output fallback.
            call = self.pending[match[2]].call
            index = [int(k) for k in re.findall(r"\d+", match[3])]
            itemsize = None
            if call is not None and len(index) == 1 and index[0] < len(call.outputs):
                itemsize = call.outputs[index[0]][0]
                call.taken.add(index[0])
            self.expect(match[1], call, itemsize)
        elif match := _ASSERT.match(statement):
            known = self.layouts.get(match[1])
            self.layouts[match[1]] = (_ints(match[2]), _ints(match[3]),
                                      known[2] if known and match[1] not in self.pending
                                      else None)
            if match[1] not in self.pending:
                return
            output = self.pending[match[1]]
            self.allocate(match[1], _nbytes(match[2], match[3], "float32", output.itemsize))
            for name in output.names:
                self.pending.pop(name)
                self.names[name] = self.names[match[1]]
            call = output.call
            if call is None:
                return
            call.placed += self.sizes[self.names[match[1]]]
            self.peak = max(self.peak, call.held + call.placed)
            scratch = self.scratch_of.pop(call.name, None)
            if scratch is not None:
                # A CPU convolution's scratch, held while its output is made
                # (_scratch; -1: the rule's temporary of the output's size).
                if scratch < 0:
                    scratch = self.sizes[self.names[match[1]]]
                self.peak = max(self.peak, self.level + scratch)
        elif match := _ALIAS.match(statement):
            self.bind_layout(match[1], statement.split(" = ", 1)[1])
            if match[2] in self.names:
                self.names[match[1]] = self.names[match[2]]
            elif match[2] in self.pending:
                # A fallback's output named again before the assert that
                # sizes it (``buf46 = buf45`` after a custom operator's
                # call, the assert naming buf46): the assert sizes both.
                output = self.pending[match[1]] = self.pending[match[2]]
                output.names.add(match[1])
        elif statement.startswith("del "):
            for name in statement[4:].split(","):
                self.delete(name.strip())

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
    inner = _inside(statement, statement.find("(", statement.index(op)))
    if inner is None:
        return None
    args, keywords = [], {}
    for item in _top_level(inner):
        name, eq, value = item.partition("=")
        if eq and name.strip().isidentifier() and not value.startswith("="):
            keywords[name.strip()] = value.strip()
        else:
            args.append(item.strip())
    args += [keywords[k] for k in _CONV_KEYWORDS if k in keywords]
    default = _DTYPES.get((walk.outputs.get(op) or ((4, 0),))[0][0], "float32")
    parts = []
    for k, arg in enumerate(args):
        part = _part(walk, arg, default) if k < 3 else _literal(arg)
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
        inner = _top_level(_inside(arg, arg.index("(")) or "")
        if len(inner) < 3:
            return None
        known = walk.layouts.get(inner[0].strip())
        sizes, strides = _literal(inner[1]), _literal(inner[2])
        if sizes is None or strides is None:
            return None
        return ("tensor", tuple(sizes[1]), tuple(strides[1]),
                (known[2] if known and known[2] else dtype))
    known = walk.layouts.get(arg)
    if known is None or known[0] is None or known[1] is None:
        return None
    return ("tensor", known[0], known[1], known[2] or dtype)


def _literal(text: str) -> tuple | None:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, (list, tuple)):
        return ("list", tuple(value))
    if value is None or isinstance(value, (bool, int, float)):
        return ("const", value)
    return None


def _part_bytes(part: tuple) -> int:
    return _span_bytes(part[1], part[2], getattr(torch, part[3]).itemsize)


def _inside(text: str, start: int) -> str | None:
    """What the bracket at ``start`` encloses (None where it is not closed)."""
    depth = 0
    for k in range(start, len(text)):
        depth += (text[k] in "([") - (text[k] in ")]")
        if depth == 0:
            return text[start + 1:k]
    return None


def _top_level(text: str) -> list[str]:
    """``text`` split at its commas outside brackets."""
    items, depth, item = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += (char in "([") - (char in ")]")
        item += char
    if item.strip():
        items.append(item)
    return items


def _ints(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        return None


def _returned_names(statement: str) -> list[str]:
    inner = statement[len("return "):].strip()
    inner = inner[1:-1] if inner.startswith("(") else inner
    names = []
    for item in _top_level(inner):
        match = re.match(r"\s*(?:reinterpret_tensor\()?(\w+)", item)
        if item.strip():
            names.append(match[1] if match else "")
    return names


def _nbytes(size: str, stride: str, dtype: str, itemsize: int | None = None) -> int:
    sizes, strides = _ints(size), _ints(stride)
    if sizes is None or strides is None:
        raise _Unreadable(f"symbolic size {size}")
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

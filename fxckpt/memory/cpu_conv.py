"""Scratch memory of CPU convolutions, measured by running them once.

Which kernel runs a CPU convolution, and what it allocates besides its
outputs, depends on the layout of its operands, the groups, the kernel
size, the dtype and the thread count, and no rule of a few lines holds
for all of them. Measured on torch 2.13 (one thread, float32, batch 2,
8x8 images, 16 channels; a 7x7 kernel unless said):

- contiguous depthwise (groups = channels): the backward holds 25 KB (50 KB
  on two threads), near the copies of its three operands the old rule
  counted (19.5 KB);
- channels-last depthwise: the backward holds 806 KB, whatever the batch
  and image size, in proportion to channels x kernel area (411 KB at 5x5,
  1.2 KB at 3x3; 1.29 MB in bfloat16): 40 times the rule. HF's ConvNeXt
  runs its depthwise convolutions on channels-last tensors (a permute back
  from the layer norm), and its budgets were exceeded 1.8 to 7.6 times;
- channels-last, groups 1: the forward holds 209 KB and the backward
  301 KB, where the rule counted the output (16 KB) and 125 KB.

So each distinct convolution (the op, its operands' sizes, strides and
dtypes, its other arguments, the thread count) is run once on zero-filled
CPU tensors of those sizes, outside the compiler's fake and tracing modes,
with torch's profiler counting the allocator's blocks; what it held at its
most, less what it still held at its end, is its scratch. The answers are
kept for the process (``_measured``).

A second profiler cannot start while one runs (a user profiling the step
that compiles), and one started on another thread breaks the first's
record. Then the convolutions are measured in a helper process
(``serve``, started once, on the first such convolution, and ended with
this process), at the same thread count.
Where a size has no value, nothing is measured and the caller's rule
applies.
"""

from __future__ import annotations

import atexit
import functools
import json
import subprocess
import sys

import torch
import torch.fx as fx

from fxckpt.compat.autograd import host_allocations, no_dispatch_modes, profiler_enabled
from fxckpt.compat.ops import overload_name

_aten = torch.ops.aten
MEASURED_OPS = frozenset({_aten.convolution, _aten.convolution_backward})


def measured_scratch(target, args, concrete) -> int | None:
    """Bytes a CPU ``target`` (one of MEASURED_OPS) called with ``args``
    (graph nodes and constants) holds inside its call besides its outputs,
    measured; None where it cannot be measured. ``concrete`` reads a
    (possibly symbolic) size as an int."""
    key = _key(target, args, concrete)
    return None if key is None else _measured(key)


def call_scratch(op: str, parts: tuple) -> int | None:
    """The same for a call read elsewhere (Inductor's wrapper code:
    memory/compiled_peak.py): ``op`` is "convolution" or
    "convolution_backward", ``parts`` its arguments in order, each
    ("tensor", sizes, strides, dtype name), ("list", values) or ("const",
    value)."""
    return _measured((op, "default", tuple(parts), torch.get_num_threads()))


def _key(target, args, concrete) -> tuple | None:
    """What the scratch depends on, as plain data (the helper process reads
    it as JSON): (op, overload, operands, thread count)."""
    parts = []
    for arg in args:
        if isinstance(arg, fx.Node):
            value = arg.meta.get("val")
            if not isinstance(value, torch.Tensor) or value.device.type != "cpu" \
                    or value.layout != torch.strided:
                return None
            sizes = tuple(concrete(s) for s in value.shape)
            strides = tuple(concrete(s) for s in value.stride())
            if any(s <= 0 for s in sizes):
                return None
            parts.append(("tensor", sizes, strides, str(value.dtype).removeprefix("torch.")))
        elif isinstance(arg, (list, tuple)):
            if not all(isinstance(a, (bool, int, float, torch.SymInt)) for a in arg):
                return None
            parts.append(("list", tuple(concrete(a) if isinstance(a, torch.SymInt) else a
                                        for a in arg)))
        elif isinstance(arg, torch.SymInt):
            parts.append(("const", concrete(arg)))
        elif arg is None or isinstance(arg, (bool, int, float)):
            parts.append(("const", arg))
        else:
            return None
    packet = target.overloadpacket.__name__
    return (packet, overload_name(target), tuple(parts), torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _measured(key: tuple) -> int | None:
    """None where the call fails (arguments read wrongly from generated
    code): the caller's rule applies."""
    if profiler_enabled():
        return _helper().ask(key)
    # Planning runs under the compiler's fake and tracing modes: the
    # measurement runs on real tensors, outside them.
    with no_dispatch_modes():
        try:
            return _run(key)
        except (RuntimeError, TypeError, ValueError, IndexError):
            return None


def _run(key) -> int:
    packet, overload, parts, _ = key
    target = getattr(getattr(_aten, packet), overload)
    args = []
    for part in parts:
        if part[0] == "tensor":
            _, sizes, strides, dtype = part
            args.append(torch.empty_strided(tuple(sizes), tuple(strides),
                                            dtype=getattr(torch, dtype)).zero_())
        elif part[0] == "list":
            args.append(list(part[1]))
        else:
            args.append(part[1])
    with torch.no_grad():
        target(*args)           # the first call may set up a kernel's caches
        with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as profile:
            out = target(*args)
    del out
    return _held_inside(host_allocations(profile))


def _held_inside(events) -> int:
    """The most the call held above what it left allocated: its scratch.
    Frees of blocks allocated before the call are not its own."""
    mine, live, high = set(), 0, 0
    for _, address, nbytes in events:
        if nbytes > 0:
            mine.add(address)
        elif address in mine:
            mine.discard(address)
        else:
            continue
        live += nbytes
        high = max(high, live)
    return max(high - live, 0)


class _Helper:
    """The helper process: one key a line in, its scratch a line out."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from fxckpt.memory.cpu_conv import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1)
        atexit.register(self.close)

    def ask(self, key: tuple) -> int | None:
        self.process.stdin.write(json.dumps(key) + "\n")
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("fxckpt: the process measuring CPU convolutions' "
                                   "scratch memory ended; its error is above")
            if line.startswith(_ANSWER):
                answer = int(line[len(_ANSWER):])
                return None if answer < 0 else answer

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


@functools.lru_cache(maxsize=1)
def _helper() -> _Helper:
    return _Helper()


_ANSWER = "fxckpt-scratch "


def serve() -> None:
    """The helper process's loop (``_Helper``): a key (JSON) a line on
    stdin, its scratch on stdout."""
    for line in sys.stdin:
        packet, overload, parts, threads = json.loads(line)
        torch.set_num_threads(threads)
        key = (packet, overload, tuple(tuple(p) for p in parts), threads)
        try:
            answer = _run(key)
        except (RuntimeError, TypeError, ValueError, IndexError):
            answer = -1
        print(f"{_ANSWER}{answer}", flush=True)

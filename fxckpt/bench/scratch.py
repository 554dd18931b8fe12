"""``fxckpt bench --suite scratch``: each op of a model's planned graphs run
alone on the device, its scratch memory against the memory model's.

The memory model counts an op's own scratch (what it allocates and frees
inside its call, besides its outputs) as ``memory.workspace_bytes`` says; a
kernel holding more than that can take a step over its budget. This suite
plans each model at the floor and by default, runs every ATen op of the
planned forward and backward graphs once on fresh inputs of the recorded
shapes, strides and dtypes (then again, measured: first calls allocate
caches), and reports each op whose measured scratch exceeds the model's by
more than ``TOLERANCE`` bytes: what to measure and model next, on the device
that matters.

Measured scratch is the allocator's peak during the call less the op's
output bytes (``measure.measure_peak_bytes``: CUDA's allocator counters, the
CPU profiler's allocation events). Inputs hold uniform values in [-0.5, 0.5) and indices
0, so data-dependent kernels (embedding backward's segments) run their
smallest case.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.fx as fx

from fxckpt.compat.ops import OpOverload
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.memory.scratch import workspace_bytes
from fxckpt.memory.values import device_type, tensor_bytes

# Bytes of unmodeled scratch an op may hold before it is reported.
TOLERANCE = 256


@dataclass(frozen=True)
class OpScratch:
    op: str            # the ATen overload
    node: str          # the first node it was seen at
    calls: int         # nodes of the planned graphs with this op and shape
    measured: int      # bytes, the most of its calls
    modeled: int       # what memory.workspace_bytes counts for that call
    shapes: str        # its tensor operands' shapes, for the record


def planned_graphs(model: torch.nn.Module, inputs: tuple, loss_fn: Callable,
                   budget) -> list[fx.Graph]:
    """The forward and backward graphs fxckpt plans for one step of
    ``model`` (compiler="eager") at ``budget``."""
    from fxckpt.bench.ways import Step
    from fxckpt.planning.capture import compile_planned
    from fxckpt.entry.backend import Backend
    from fxckpt.options import Options

    graphs: list[fx.Graph] = []

    def compile_fn(gm, example_inputs, planner):
        compiled = compile_planned(gm, example_inputs, planner)
        for forward, backward in planner.graphs:
            graphs.extend((forward, backward))
        return compiled

    backend = Backend(Options.create(budget=budget, compiler="eager"), compile_fn=compile_fn)
    # A Step of its own: compiled afresh, what Dynamo compiled before untouched.
    compiled = torch.compile(Step(model, loss_fn), backend=backend)
    compiled(*inputs).backward()
    model.zero_grad(set_to_none=True)
    return graphs


def audit(graphs: list[fx.Graph]) -> list[OpScratch]:
    """Every ATen op call of ``graphs`` whose measured scratch exceeds the
    memory model's by more than TOLERANCE bytes, largest excess first; each
    distinct (op, operand shapes) measured once."""
    found: dict[tuple, OpScratch] = {}
    counts: dict[tuple, int] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, OpOverload):
                continue
            device = device_type(node)
            if device not in ("cpu", "cuda"):
                continue
            shapes = _operand_shapes(node)
            key = (str(node.target), shapes)
            counts[key] = counts.get(key, 0) + 1
            if key in found or counts[key] > 1:
                continue
            measured = _measured_scratch(node, torch.device(device))
            if measured is None:
                continue
            modeled = workspace_bytes(node)
            found[key] = OpScratch(str(node.target), node.name, 1, measured, modeled, shapes)
    over = [OpScratch(**{**asdict(s), "calls": counts[key]}) for key, s in found.items()
            if s.measured > s.modeled + TOLERANCE]
    return sorted(over, key=lambda s: s.modeled - s.measured)


def _operand_shapes(node: fx.Node) -> str:
    shapes = []
    for arg in node.args:
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(value, torch.Tensor):
            shapes.append(f"{tuple(value.shape)} {str(value.dtype)[6:]}")
    return "; ".join(shapes)


def _fresh(value, device: torch.device):
    if not isinstance(value, torch.Tensor):
        return value
    shape, stride = [int(x) for x in value.shape], [int(x) for x in value.stride()]
    numel = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    if value.is_floating_point():
        base = torch.rand(numel, dtype=value.dtype, device=device) - 0.5
    else:
        base = torch.zeros(numel, dtype=value.dtype, device=device)
    return base.as_strided(shape, stride)


def _measured_scratch(node: fx.Node, device: torch.device) -> int | None:
    args = fx.node.map_arg(node.args, lambda n: _fresh(n.meta.get("val"), device))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: _fresh(n.meta.get("val"), device))

    def call():
        return node.target(*args, **kwargs)

    try:
        call()
        peak = measure_peak_bytes(call, device=device)
    except Exception:     # an op that cannot run on made-up values: not measured
        return None
    return max(0, peak - tensor_bytes(node.meta.get("val")))


def run_scratch(*, models, size: str, device: str,
                note: Callable[[str], object] | None = None) -> dict:
    """Per model, the ops over the model's scratch at the floor and default
    plans; ``note`` gets a line per model done."""
    from fxckpt.bench.zoo import make_bench_model

    rows = []
    for name in models:
        # Built on the device: the loss's targets too.
        model, inputs, loss_fn = make_bench_model(name, size=size, device=device)
        graphs = []
        for budget in (0.0, None):
            graphs += planned_graphs(model, inputs, loss_fn, budget)
        over = audit(graphs)
        ops = sum(1 for g in graphs for n in g.nodes if n.op == "call_function")
        rows.append({"model": name, "ops": ops, "over": [asdict(s) for s in over]})
        if note is not None:
            note(f"scratch {name}: {len(over)} of {ops} op calls over the model")
    return {"device": device, "size": size, "tolerance": TOLERANCE,
            "threads": torch.get_num_threads(), "rows": rows}


def scratch_markdown(result: dict) -> str:
    lines = [f"Ops whose measured scratch exceeds the memory model's by more than "
             f"{result['tolerance']} B ({result['device']}, size {result['size']}, "
             f"{result['threads']} thread(s)).", "",
             "| model | op | operands | calls | measured B | modeled B |",
             "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        if not row["over"]:
            lines.append(f"| {row['model']} | none of {row['ops']} ops | | | | |")
        for s in row["over"]:
            lines.append(f"| {row['model']} | {s['op']} | {s['shapes']} | {s['calls']} | "
                         f"{s['measured']} | {s['modeled']} |")
    return "\n".join(lines) + "\n"

"""For ``fxckpt bench`` and ``fxckpt demo``, what they measure of one way
of training: the first step's loss and gradients, the peak memory, the bytes saved for backward, the work
done, and the step time.

Work is counted while the step runs: every aten op that executes (in eager,
in a compiled graph, in a recompute) is priced with fxckpt's cost model --
FLOPs from torch's flop formulas, bytes read and written -- so a way's
recompute FLOPs and recompute cost are what it ran beyond a step that
recomputes nothing, measured the same way for torch's plans and fxckpt's.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch

from fxckpt.compat.autograd import TorchDispatchMode
from fxckpt.compat.ops import HigherOrderOperator, OpOverload
from fxckpt.bench.measure import (measure_peak_bytes, measure_saved_bytes, synchronize,
                                  time_steps)
from fxckpt.memory.values import tensor_bytes
from fxckpt.passes.profile import CostModel, op_flops


@dataclass
class Measured:
    """One way's numbers (bytes, seconds, FLOPs); the first step's loss and
    gradients are kept for comparison and dropped from bench.json."""

    first_step_seconds: float
    step_seconds: float              # median wall-clock time of the timed steps
    step_cpu_seconds: float          # median CPU time of the calling thread
    step_times: list[float]
    peak_bytes: int
    saved_bytes: int
    flops: int
    cost: float
    loss: torch.Tensor = field(repr=False)
    grads: dict[str, torch.Tensor] = field(repr=False)


def measure_way(run, model: torch.nn.Module, inputs, *, repeat: int = 3,
                min_seconds: float = 0.0, scope=contextlib.nullcontext,
                device: str | torch.device = "cpu") -> Measured:
    """Measure ``run(*inputs) -> loss`` training ``model``: the first step
    (compiling, if it compiles) with seed 0, then one step each for peak
    memory, saved bytes and counted work, then timed steps (``time_steps``).
    Every step starts with the gradients set to None, so each allocates
    them afresh, as a training step does. ``device`` is where the step
    allocates and runs: its allocator's peak is read, and on a GPU each
    timed step ends when the device has finished it."""
    live = [*model.parameters(), *model.buffers()]

    def step():
        model.zero_grad(set_to_none=True)
        run(*inputs).backward()

    with scope():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        start = time.perf_counter()
        loss = run(*inputs)
        loss.backward()
        synchronize(device)
        first = time.perf_counter() - start
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()
                 if p.grad is not None}
        loss = loss.detach().clone()

        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        peak = measure_peak_bytes(lambda: run(*inputs).backward(), device=device)

        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        saved = measure_saved_bytes(lambda: run(*inputs), exclude=live)
        saved.output.backward()

        torch.manual_seed(1)
        with WorkCounter() as work:
            step()

        torch.manual_seed(2)
        cpu: list[float] = []
        wall = time_steps(step, repeat=repeat, min_seconds=min_seconds, cpu_seconds=cpu,
                          device=device)
    model.zero_grad(set_to_none=True)
    return Measured(first_step_seconds=first, step_seconds=statistics.median(wall),
                    step_cpu_seconds=statistics.median(cpu), step_times=wall,
                    peak_bytes=peak, saved_bytes=saved.total_bytes,
                    flops=work.flops, cost=work.cost, loss=loss, grads=grads)



def compare(measured: Measured, reference: Measured) -> dict:
    """Loss and gradients against the reference (eager): bitwise, and the
    largest absolute difference."""
    loss_equal = torch.equal(measured.loss, reference.loss)
    missing = sorted(set(reference.grads) - set(measured.grads))
    differ, worst = [], float(abs(measured.loss - reference.loss))
    for name, expected in reference.grads.items():
        got = measured.grads.get(name)
        if got is None:
            continue
        if not torch.equal(got, expected):
            differ.append(name)
            worst = max(worst, float((got - expected).abs().max()))
    return {"loss_bitwise": loss_equal, "grads_bitwise": not differ and not missing,
            "grads_differing": len(differ) + len(missing), "grads_total": len(reference.grads),
            "max_abs_error": worst,
            "matches_eager": loss_equal and not differ and not missing}


# --- counting work -----------------------------------------------------------

class WorkCounter(TorchDispatchMode):
    """Sum FLOPs and cost-model seconds of every aten op that runs.

    Declares itself outside compilation (``ignore_compile_internals``), so
    torch.compile still compiles and runs compiled graphs while it is on,
    and the ops those graphs run are counted; compiling itself is not. The
    random-op wrappers fxckpt's replay uses are counted as the op they
    wrap."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, cost_model: CostModel = CostModel()) -> None:
        super().__init__()
        self.cost_model = cost_model
        self.flops = 0
        self.cost = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op, op_args, op_out = func, args, out
        if isinstance(func, HigherOrderOperator):
            # run_and_save_rng_state(op, *args) -> (state, out);
            # run_with_rng_state(state, op, *args) -> out
            wrapped = [i for i, a in enumerate(args[:2]) if isinstance(a, OpOverload)]
            if not wrapped:
                return out
            op, op_args = args[wrapped[0]], args[wrapped[0] + 1:]
            if wrapped[0] == 0 and isinstance(out, tuple):
                op_out = out[1]
        self._count(op, op_args, kwargs, op_out)
        return out

    def _count(self, op, args, kwargs, out) -> None:
        if not isinstance(op, OpOverload):
            return
        flops = op_flops(op, args, kwargs, out)
        moved = 0 if op.is_view else tensor_bytes((args, kwargs)) + tensor_bytes(out)
        self.flops += flops
        self.cost += self.cost_model.seconds(flops, moved)



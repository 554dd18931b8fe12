"""The memory model against measurement: the predicted peak of a planned step
is within 10% of the real peak, on every zoo model and three strategies.

The loss runs inside the compiled module so the graph is the whole step; the
real peak is CPU allocator traffic above the memory in use when the step
starts (fxckpt.bench.measure)."""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes

try:
    from tests.harness import fresh
    from tests.zoo import ZOO, ZOO_NAMES
except ImportError:  # pragma: no cover
    from harness import fresh
    from zoo import ZOO, ZOO_NAMES


class Step(torch.nn.Module):
    """A model and its loss as one module, so one graph covers the step."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.model(*inputs))


def measured_and_predicted(name: str, solver: str = "auto", budget=None):
    torch._dynamo.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    be = fxckpt.backend(compiler="eager", solver=solver, budget=budget)
    step = torch.compile(Step(model, loss_fn), backend=be)
    step(*inputs).backward()                       # compile, allocate .grad once
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: step(*inputs).backward())
    model.zero_grad(set_to_none=True)
    return measured, sum(p.peak_bytes for p in be.plans), be.plans


@pytest.mark.parametrize("solver", ["auto", "recompute_all", "save_all"])
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_predicted_peak_within_10_percent_of_measured(name, solver):
    measured, predicted, _ = measured_and_predicted(name, solver)
    assert predicted > 0
    assert abs(measured - predicted) <= 0.10 * measured, (measured, predicted)


def test_peak_location_is_reported():
    _, _, plans = measured_and_predicted("gpt")
    assert plans[0].peak_at.split(":")[0] in ("forward", "backward")
    phases = {phase for phase, _, _ in plans[0].timeline.points}
    assert phases == {"forward", "backward"}


def _traced_op(fn, *args):
    """The one-op graph of ``fn(*args)`` with fake values in ``meta["val"]``."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return next(n for n in gm.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("case", ["safe_softmax", "dropout_backward"])
def test_op_scratch_is_what_the_allocator_sees(case):
    """``workspace_bytes`` of an op is its measured peak less its output:
    _safe_softmax's mask, reduced mask and scalar; dropout backward's widened
    mask and its scale as two scalar tensors."""
    from fxckpt.memory import workspace_bytes
    torch.set_num_threads(1)
    scores = torch.randn(2, 4, 64, 64)
    if case == "safe_softmax":
        def fn(x):
            return torch.ops.aten._safe_softmax.default(x, -1)
        args = (scores,)
    else:
        def fn(g, m):
            return torch.ops.aten.native_dropout_backward.default(g, m, 1.25)
        args = (scores, torch.rand(2, 4, 64, 64) > 0.2)
    node = _traced_op(fn, *args)
    measured = measure_peak_bytes(lambda: fn(*args))
    assert measured - scores.nbytes == workspace_bytes(node) > 0

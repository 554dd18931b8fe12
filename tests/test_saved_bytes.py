"""What forward really keeps for backward (counted by saved-tensor hooks,
each storage once, parameters and buffers excluded) matches the plan's
saved_bytes within 5%, on every zoo model and under two strategies."""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_saved_bytes

try:
    from tests.harness import fresh
    from tests.zoo import ZOO, ZOO_NAMES
except ImportError:  # pragma: no cover
    from harness import fresh
    from zoo import ZOO, ZOO_NAMES


@pytest.mark.parametrize("solver", ["auto", "recompute_all"])
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_measured_saved_bytes_match_plan(name, solver):
    torch._dynamo.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    be = fxckpt.backend(compiler="eager", solver=solver)
    compiled = torch.compile(model, backend=be)
    loss_fn(compiled(*inputs)).backward()           # compile
    planned = sum(p.saved_bytes for p in be.plans)
    live = [*model.parameters(), *model.buffers()]
    report = measure_saved_bytes(lambda: compiled(*inputs), exclude=live)
    loss_fn(report.output).backward()
    assert planned > 0
    assert report.total_bytes == pytest.approx(planned, rel=0.05), (
        f"measured {report.total_bytes} B saved, plan says {planned} B")

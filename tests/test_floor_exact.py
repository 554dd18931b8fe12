"""At the floor a BudgetError names, under compiler="eager", the step's
measured peak is within it: not 5% within, within. Each model here was once
over its floor because the memory model missed something the step holds:

* mlp: the floor plan saves a ``detach`` of a ReLU and recomputes the ReLU
  (a weight gradient reads it); the copy was simulated as the original's
  storage, which the saved view keeps alive, so its 32 KiB were free
  (measured 2.6% over);
* every model: autograd holds the loss gradient until backward returns
  (4 bytes over);
* gpt: dropout's backward wraps its scale as two scalar tensors (12 bytes
  over);
* hf_gpt2: ``_safe_softmax`` recomputed in backward holds a bool mask of
  the scores while it runs (3.4 KiB over).
The MLP covers the first two here (it failed by 30,728 bytes); the last two
are per-op rules, checked against the allocator in tests/test_memory_model.py
(test_op_scratch_is_what_the_allocator_sees), which keeps this file to one
compile of half a minute.

Bench models at the "small" size (fxckpt.bench.zoo), CPU allocator, one
thread; loss and gradients bitwise those of eager PyTorch at the floor."""

from __future__ import annotations

import pytest
import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.errors import BudgetError

try:
    from tests.harness import assert_bitwise_equal, run_step
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step


def _loss(loss):
    return loss


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp"])
def test_measured_peak_at_the_floor_is_within_it(name, reset_dynamo):
    torch.set_num_threads(1)
    model, inputs, loss_fn = make_bench_model(name, size="small")
    with pytest.raises(BudgetError) as refused:
        fxckpt.explain(Step(model, loss_fn), *inputs, budget=1, compiler="eager")
    floor = refused.value.floor_bytes
    torch._dynamo.reset()
    model, inputs, loss_fn = make_bench_model(name, size="small")
    reference = make_bench_model(name, size="small")
    backend = fxckpt.backend(budget=floor, compiler="eager")
    step = torch.compile(Step(model, loss_fn), backend=backend)
    got = run_step(step, inputs, _loss)
    measured = measure_peak_bytes(lambda: step(*inputs).backward())
    assert sum(plan.peak_bytes for plan in backend.plans) <= floor
    assert measured <= floor, (measured, floor)
    want = run_step(Step(reference[0], reference[2]), reference[1], _loss)
    assert_bitwise_equal(got, want)

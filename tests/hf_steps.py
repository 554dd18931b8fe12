"""Steps of Hugging Face causal LMs (tests/zoo.py's HFCausalLM) under
torch.compile, for the tests that measure them against torch's per-block
checkpoint."""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from fxckpt.bench.measure import measure_peak_bytes


def checkpoint_each(layers) -> None:
    """Wrap each of ``layers`` (a decoder's ModuleList) in
    torch.utils.checkpoint, non-reentrant, as a user would per block."""
    for layer in layers:
        layer.forward = functools.partial(
            lambda f, *a, **k: checkpoint(f, *a, use_reentrant=False, **k), layer.forward)


def compiled_peak(model, inputs, backend):
    """(the measured peak of a second step, the compiled model) of
    ``model`` compiled afresh with ``backend``."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        compiled(*inputs).loss.backward()

    step()
    return measure_peak_bytes(step), compiled

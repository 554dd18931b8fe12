"""Steps of Hugging Face causal LMs (tests/zoo.py's HFCausalLM) under
torch.compile, for the tests that measure them against torch's per-block
checkpoint."""

from __future__ import annotations

import torch

from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.bench.ways import torch_checkpointed, wrap_each


def checkpoint_each(layers) -> None:
    """Wrap each of ``layers`` (a decoder's ModuleList) in
    torch.utils.checkpoint, non-reentrant, as a user would per block."""
    wrap_each(layers, torch_checkpointed)


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

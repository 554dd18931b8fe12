"""CPU offload on a real CUDA device (skipped without one): the measured
device peak drops as the plan predicts, gradients stay bitwise equal to
eager, and the step-time cost is reported by ``fxckpt bench --suite offload``
(timings are a benchmark's business, not a test's)."""

from __future__ import annotations

import pytest
import torch

from fxckpt.bench.offload import run_offload

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("reset_dynamo")]


def test_cuda_offload_lowers_the_measured_peak_as_predicted():
    result = run_offload(device="cuda", size="small", repeat=1)
    rows = {row["way"]: row for row in result["rows"]}
    assert all(row["bitwise_equal_to_eager"] for row in result["rows"]), result["rows"]
    offloaded = rows["fxckpt, offloaded"]
    assert offloaded["offloaded_values"] > 0
    summary = result["summary"]
    assert 0 < summary["predicted_peak_drop_bytes"] <= offloaded["offloaded_bytes"]
    assert summary["measured_peak_drop_bytes"] >= 0.8 * summary["predicted_peak_drop_bytes"]
    for way in ("fxckpt, saved on device", "fxckpt, offloaded"):
        row = rows[way]
        assert abs(row["measured_peak_bytes"] - row["predicted_peak_bytes"]) \
            <= 0.10 * row["measured_peak_bytes"], row

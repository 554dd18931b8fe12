"""``fxckpt bench --suite offload``: CPU offload on an accelerator, side by side.

The built-in GPT trains three ways in one process, on one device: plain
eager (the reference), fxckpt with matmul outputs saved on the device
(``policies.save_matmuls()``), and fxckpt with the same values offloaded to
pinned host memory (``policies.offload(policies.save_matmuls())``). Per row:
the plan's predicted device peak and the allocator's measured one, the bytes
offloaded, the median step time and its ratio to the on-device row, and
whether loss and every gradient equal eager's bit for bit. The point of the
suite is the difference between the two fxckpt rows: the peak should drop by
what the plan predicts, at the step-time cost of the copies that do not hide
behind compute.
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from fxckpt import policies
from fxckpt.bench import measure
from fxckpt.entry.backend import backend
from fxckpt.bench.ways import Step
from fxckpt.models import make_model
from fxckpt.options import format_bytes

ROWS = (
    ("eager", None),
    ("fxckpt, saved on device", policies.save_matmuls()),
    ("fxckpt, offloaded", policies.offload(policies.save_matmuls())),
)


def run_offload(*, device: str, size: str = "small", repeat: int = 10,
                offload_bandwidth=None, progress=None) -> dict:
    """Measure the rows on ``device``; a dict ready for JSON."""
    rows, reference = [], None
    if progress is not None:
        progress.start(f"gpt {size} {device}", len(ROWS))
    for name, policy in ROWS:
        with progress.row(name) if progress is not None else contextlib.nullcontext(
                lambda text: None) as note:
            row, result = _measure_row(name, policy, device=device, size=size,
                                       repeat=repeat, offload_bandwidth=offload_bandwidth)
            note(f"peak {format_bytes(row['measured_peak_bytes'])}")
        reference = reference or result
        row["bitwise_equal_to_eager"] = _bitwise(result, reference)
        rows.append(row)
    on_device, offloaded = rows[1], rows[2]
    for row in rows:
        row["step_ratio_to_on_device"] = row["step_seconds"] / on_device["step_seconds"]
    summary = {
        "predicted_peak_drop_bytes": on_device["predicted_peak_bytes"]
        - offloaded["predicted_peak_bytes"],
        "measured_peak_drop_bytes": on_device["measured_peak_bytes"]
        - offloaded["measured_peak_bytes"],
        "offloaded_bytes": offloaded["offloaded_bytes"],
        "step_overhead": offloaded["step_ratio_to_on_device"] - 1.0,
    }
    return {"device": device, "size": size, "repeat": repeat, "rows": rows,
            "summary": summary,
            "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda")
            else "cpu"}


def _measure_row(name, policy, *, device, size, repeat, offload_bandwidth):
    model, inputs, loss_fn = make_model("gpt", size=size, device=device)
    step = Step(model, loss_fn)
    be = None
    run = step
    if policy is not None:
        be = backend(compiler="eager", policy=policy, offload_bandwidth=offload_bandwidth)
        run = torch.compile(step, backend=be)
    step.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    loss = run(*inputs)
    loss.backward()
    result = (loss.detach().clone(),
              {n: p.grad.detach().clone() for n, p in step.named_parameters()
               if p.grad is not None})

    def one_step():
        step.zero_grad(set_to_none=True)
        run(*inputs).backward()

    step.zero_grad(set_to_none=True)
    peak = measure.measure_peak_bytes(one_step, device=device)
    times = measure.time_steps(one_step, repeat=repeat, device=device)
    plan = be.plans[0] if be is not None and be.plans else None
    row = {
        "way": name,
        "predicted_peak_bytes": plan.peak_bytes if plan else None,
        "measured_peak_bytes": peak,
        "saved_bytes": plan.saved_bytes if plan else None,
        "offloaded_bytes": plan.offloaded_bytes if plan else 0,
        "offloaded_values": len(plan.offloaded) if plan else 0,
        "offload_bandwidth": plan.offload_bandwidth if plan else None,
        "step_seconds": statistics.median(times),
    }
    return row, result


def _bitwise(result, reference) -> bool:
    loss, grads = result
    ref_loss, ref_grads = reference
    return torch.equal(loss, ref_loss) and grads.keys() == ref_grads.keys() and all(
        torch.equal(grads[n], ref_grads[n]) for n in ref_grads)


def offload_markdown(result: dict) -> str:
    lines = [f"CPU offload, built-in GPT ({result['size']}) on {result['device_name']}, "
             f"median of {result['repeat']} steps",
             "",
             "| way | predicted peak | measured peak | offloaded | step | vs on-device "
             "| bitwise vs eager |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        predicted = row["predicted_peak_bytes"]
        lines.append(
            f"| {row['way']} | {format_bytes(predicted) if predicted else '-'} "
            f"| {format_bytes(row['measured_peak_bytes'])} "
            f"| {format_bytes(row['offloaded_bytes'])} in {row['offloaded_values']} values "
            f"| {row['step_seconds'] * 1e3:.2f} ms | {row['step_ratio_to_on_device']:.2f}x "
            f"| {'yes' if row['bitwise_equal_to_eager'] else 'NO'} |")
    s = result["summary"]
    lines += ["", f"Offloading {format_bytes(s['offloaded_bytes'])} lowered the predicted "
              f"peak by {format_bytes(s['predicted_peak_drop_bytes'])} and the measured one "
              f"by {format_bytes(s['measured_peak_drop_bytes'])}; step time "
              f"{s['step_overhead']:+.1%} against saving on the device."]
    return "\n".join(lines)

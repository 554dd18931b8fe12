"""Floors per compiler on the test zoo, measured: for each model, the
floor ``fxckpt.explain(step, *inputs, budget=1, compiler="eager")`` names,
the floor it names under Inductor (a compiled peak), the measured peak of
a step compiled with ``fxckpt.backend(budget=<that floor>)``, and the
runtime-optimal plan's compiled and measured peak under Inductor; then a
budget halfway between the Inductor floor and the default, measured.

    PYTHONPATH=. python examples/floors_per_compiler.py mlp,gpt,...

CPU, one thread; measured peaks are the second step's (CPU allocator,
fxckpt.bench.measure.measure_peak_bytes). Prints one row per model.
"""

from __future__ import annotations

import os
import sys

import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from harness import fresh  # noqa: E402
from zoo import ZOO  # noqa: E402


class Step(torch.nn.Module):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.model(*inputs))


def floor(name: str, compiler: str) -> int | None:
    torch.compiler.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    try:
        fxckpt.explain(Step(model, loss_fn), *inputs, budget=1, compiler=compiler)
    except fxckpt.BudgetError as refused:
        return refused.floor_bytes
    return None


def compiled_step(name: str, **options) -> tuple[int, int]:
    """(sum of the plans' peaks, measured peak of the second step)."""
    torch.compiler.reset()
    model, inputs, loss_fn = fresh(ZOO[name])
    be = fxckpt.backend(**options)
    step = torch.compile(Step(model, loss_fn), backend=be)
    step(*inputs).backward()
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: step(*inputs).backward())
    return sum(plan.peak_bytes for plan in be.plans), measured


def row(name: str) -> str:
    eager = floor(name, "eager")
    inductor = floor(name, "inductor")
    default, default_measured = compiled_step(name)
    _, at_floor = compiled_step(name, budget=inductor)
    middle = (inductor + default) // 2
    try:
        _, at_middle = compiled_step(name, budget=middle)
        middle_text = f"{middle:,} | {at_middle:,} | {at_middle / middle:.2f}"
    except fxckpt.BudgetError as refused:
        middle_text = f"{middle:,} | refused ({refused.floor_bytes:,}) | -"
    return (f"| {name} | {eager:,} | {inductor:,} | {at_floor:,} | {inductor / eager:.2f} | "
            f"{default:,} | {default_measured:,} | {middle_text} |")


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("| model | eager floor | Inductor floor (compiled) | measured at it | "
          "Inductor / eager | Inductor default (compiled) | measured | "
          "budget halfway | measured | measured / budget |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in sys.argv[1].split(","):
        print(row(name), flush=True)

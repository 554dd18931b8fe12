"""``fxckpt demo``: train the built-in GPT on the CPU three ways -- without
checkpointing, with fxckpt's default plan, and with fxckpt under a tight
budget -- and print what each costs, measured rather than predicted."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import fxckpt
from fxckpt.bench import work
from fxckpt.bench.ways import Step
from fxckpt.models import GPT, make_model

MiB = 2 ** 20


@dataclass
class DemoRow:
    """What one way of training measured, or why it did not run."""

    label: str
    skipped: str = ""                    # the reason, when it did not run
    peak_bytes: int = 0
    saved_bytes: int = 0
    step_seconds: float = 0.0            # median over steps after the first
    measured: work.Measured | None = None   # first step's loss and grads among them
    plans: list[Any] = field(default_factory=list)


def run_demo(args: argparse.Namespace) -> int:
    if args.steps < 2:
        raise SystemExit("fxckpt demo: --steps must be at least 2 (the first "
                         "step compiles and is not timed)")
    model, inputs, _ = make_model("gpt", size="small")
    print(f"fxckpt demo: {_describe(model, inputs)}; {args.steps} steps "
          f"each on the CPU, 1 thread\n", flush=True)
    budget, budget_label = _demo_budget(args.budget, model, inputs)
    runs = [("(a) no checkpointing", None),  # None: aot_eager, no fxckpt
            ("(b) fxckpt default", {}),
            (f"(c) fxckpt {budget_label}", {"budget": budget})]
    width = max(len(label) for label, _ in runs)
    print(_header(width), flush=True)
    threads = torch.get_num_threads()
    # One thread keeps timings steady and reductions in one order.
    torch.set_num_threads(1)
    rows: list[DemoRow] = []
    try:
        for label, options in runs:
            row = _run(label, options, args.steps)
            rows.append(row)
            print(_line(row, rows[0], width), flush=True)
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        if row.plans:
            print(f"{row.label} planned: {_plan_summary(row.plans)}")
        for index, plan in enumerate(row.plans if args.show_plans else []):
            print(f"\n{row.label}, graph {index}:\n{plan}")
    return 0


def _demo_budget(text: str | None, model, inputs) -> tuple[Any, str]:
    """Run (c)'s budget and its label: the one asked for, or fxckpt's floor,
    found by asking for a budget no plan can meet."""
    if text is not None:
        value: Any = float(text) if text.replace(".", "", 1).isdigit() and "." in text \
            else (int(text) if text.isdigit() else text)
        return value, f"budget {text}"
    try:
        fxckpt.explain(model, *inputs, budget=1, compiler="eager")
    except fxckpt.BudgetError as refused:
        floor = refused.floor_bytes
        return floor, f"floor {floor / 2**20:.2f} MiB"
    return None, "at its floor"


def _run(label: str, options: dict | None, steps: int) -> DemoRow:
    """Train one way: through aot_eager when ``options`` is None, else
    through ``fxckpt.backend(compiler="eager", **options)``. A budget
    fxckpt declines gives an n/a row."""
    if options is None:
        return train_way(label, "aot_eager", steps)
    try:
        return train_way(label, fxckpt.backend(compiler="eager", **options), steps)
    except Exception as error:  # a declined budget is a result, not a crash
        declined = _declined(error)
        if declined is None:
            raise
        return DemoRow(label,
                       skipped=f"{type(declined).__name__}: {declined}")


def _describe(model: GPT, inputs: tuple[torch.Tensor, ...]) -> str:
    config = model.config
    batch, seq = inputs[0].shape
    return (f"GPT with {config.n_layer} layers, n_embd {config.n_embd}, "
            f"vocab {config.vocab_size}, batch {batch}, seq {seq}, dropout "
            f"{config.dropout:g}")


def train_way(label: str, backend: str | Callable, steps: int) -> DemoRow:
    """Train a fresh copy of the demo GPT through
    ``torch.compile(backend=backend)`` and measure it as ``fxckpt bench``
    measures a way: the first step compiles, then ``steps - 1`` timed steps."""
    model, inputs, loss_fn = make_model("gpt", size="small", seed=0)
    # A Step compiles afresh, with no Dynamo reset: what the caller compiled stays.
    compiled = torch.compile(Step(model, loss_fn), backend=backend)
    got = work.measure_way(compiled, model, inputs, repeat=steps - 1)
    return DemoRow(label, peak_bytes=got.peak_bytes, saved_bytes=got.saved_bytes,
                   step_seconds=got.step_seconds, measured=got,
                   plans=list(getattr(backend, "plans", [])))


def _match(row: DemoRow, reference: DemoRow) -> str:
    if row is reference:
        return "reference"
    compared = work.compare(row.measured, reference.measured)
    if not compared["loss_bitwise"]:
        return (f"no: loss {row.measured.loss.item():.6g} vs "
                f"{reference.measured.loss.item():.6g}")
    if not compared["grads_bitwise"]:
        return f"no: {compared['grads_differing']}/{compared['grads_total']} grads differ"
    return "yes"


def _header(width: int) -> str:
    return (f"{'run':<{width}}  {'peak MiB':>9}  {'saved MiB':>9}  "
            f"{'step time':>9}  loss+grads = (a)")


def _line(row: DemoRow, reference: DemoRow, width: int) -> str:
    if row.skipped:
        return f"{row.label:<{width}}  n/a: {row.skipped}"
    relative = row.step_seconds / reference.step_seconds
    return (f"{row.label:<{width}}  {row.peak_bytes / MiB:>9.2f}  "
            f"{row.saved_bytes / MiB:>9.2f}  {relative:>8.2f}x  "
            f"{_match(row, reference)}")


def _plan_summary(plans: list[Any]) -> str:
    saved = sum(plan.saved_bytes for plan in plans)
    peak = max(plan.peak_bytes for plan in plans)
    flops = sum(plan.recompute_flops for plan in plans)
    return (f"{len(plans)} graph(s), saved {saved / MiB:.2f} MiB, peak "
            f"{peak / MiB:.2f} MiB, recompute {flops / 1e6:.1f} MFLOP")


def _declined(error: BaseException) -> BaseException | None:
    """The NotImplementedError or BudgetError behind ``error``, if any.

    torch.compile wraps a backend's exception (BackendCompilerFailed), so
    follow the chain of causes.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (NotImplementedError, fxckpt.BudgetError)):
            return error
        seen.add(id(error))
        error = (getattr(error, "inner_exception", None) or error.__cause__
                 or error.__context__)
    return None

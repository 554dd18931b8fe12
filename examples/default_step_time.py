"""fxckpt's default plan (no budget, no policy) under compiler="eager" against
torch.compile's default on the same runtime (backend="aot_eager"), side by
side in one process: measured peak, saved bytes, and step time as the median
of many steps taken in alternation (a few steps of one, then of the other),
so that load from other processes falls on both alike.

    python examples/default_step_time.py            # prints a markdown table
    python examples/default_step_time.py --rounds 60

CPU, one torch thread. Step time is the calling thread's CPU time (forward
and backward both run on it with one thread); wall-clock medians are shown
too. Models: the built-in GPT (fxckpt.models, size "small": 4 layers) and a
5-layer GPT (n_embd 192, 6 heads, sequence 128, batch 4, dropout 0.1).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes, measure_saved_bytes
from fxckpt.models import GPT, GPTConfig, gpt_loss, make_model

MiB = 2 ** 20
FIVE_LAYERS = GPTConfig(vocab_size=512, block_size=128, n_layer=5, n_head=6, n_embd=192,
                        dropout=0.1)


def five_layer_gpt():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(FIVE_LAYERS).train()
        generator = torch.Generator().manual_seed(0)
        shape = (4, FIVE_LAYERS.block_size)
        idx = torch.randint(FIVE_LAYERS.vocab_size, shape, generator=generator)
        targets = torch.randint(FIVE_LAYERS.vocab_size, shape, generator=generator)
    return model, (idx,), lambda out: gpt_loss(out, targets)


MODELS = {
    "GPT small (fxckpt.models, 4 layers)": lambda: make_model("gpt", size="small"),
    "GPT, 5 layers, n_embd 192": five_layer_gpt,
}


def _way(make, backend):
    """A compiled step of a fresh copy of the model: returns (step, model,
    inputs, loss_fn, backend)."""
    model, inputs, loss_fn = make()
    compiled = torch.compile(model, backend=backend)

    def step():
        model.zero_grad(set_to_none=True)
        loss_fn(compiled(*inputs)).backward()

    torch.manual_seed(0)
    step()  # compiles
    return step, model, inputs, loss_fn, compiled


def _memory(way) -> tuple[int, int]:
    step, model, inputs, loss_fn, compiled = way
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    peak = measure_peak_bytes(lambda: loss_fn(compiled(*inputs)).backward())
    model.zero_grad(set_to_none=True)
    saved = measure_saved_bytes(lambda: loss_fn(compiled(*inputs)),
                                exclude=[*model.parameters(), *model.buffers()])
    saved.output.backward()
    return peak, saved.total_bytes


def _alternate(steps: dict, rounds: int, per_round: int) -> dict:
    """Per way, (CPU seconds, wall seconds) of every timed step, the ways
    taking turns ``per_round`` steps at a time."""
    times = {name: ([], []) for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            step()  # untimed: the first step after the other way's
            for _ in range(per_round):
                wall, cpu = time.perf_counter(), time.thread_time()
                step()
                times[name][0].append(time.thread_time() - cpu)
                times[name][1].append(time.perf_counter() - wall)
    return times


def compare(label: str, make, rounds: int, per_round: int) -> list[str]:
    torch._dynamo.reset()
    backend = fxckpt.backend(compiler="eager")
    ways = {"torch.compile(backend=\"aot_eager\")": _way(make, "aot_eager"),
            "fxckpt.backend(compiler=\"eager\")": _way(make, backend)}
    memory = {name: _memory(way) for name, way in ways.items()}
    times = _alternate({name: way[0] for name, way in ways.items()}, rounds, per_round)
    reference = "torch.compile(backend=\"aot_eager\")"
    base_cpu = statistics.median(times[reference][0])
    base_wall = statistics.median(times[reference][1])
    base_peak = memory[reference][0]
    rows = []
    for name in ways:
        cpu, wall = statistics.median(times[name][0]), statistics.median(times[name][1])
        peak, saved = memory[name]
        rows.append(f"| {label} | {name} | {peak / MiB:.2f} MiB ({peak / base_peak:.3f}x) "
                    f"| {saved / MiB:.2f} MiB | {cpu * 1e3:.1f} ms ({cpu / base_cpu:.3f}x) "
                    f"| {wall * 1e3:.1f} ms ({wall / base_wall:.3f}x) | {len(times[name][0])} |")
    plan = backend.plans[0]
    rows.append(f"| {label} | fxckpt's plan | predicted {plan.peak_bytes / MiB:.2f} MiB | "
                f"{plan.saved_bytes / MiB:.2f} MiB planned | {len(plan.recomputed)} values "
                f"recomputed, {plan.recompute_cost * 1e3:.3f} ms priced | | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print("| model | way | measured peak (x aot_eager) | saved | step CPU time, median "
          "(x aot_eager) | step wall time, median (x aot_eager) | timed steps |")
    print("|---|---|---|---|---|---|---|")
    for label, make in MODELS.items():
        for row in compare(label, make, args.rounds, args.per_round):
            print(row, flush=True)


if __name__ == "__main__":
    main()

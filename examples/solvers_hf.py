"""The fast solver against the exact programme on Hugging Face architectures
the test zoo does not hold (examples/hf_architectures.py's MODELS, tiny
configurations, no weights), at 21 budgets from the exact programme's
floor to the runtime-optimal plan's peak, as `fxckpt bench --suite
solvers` compares the zoo:

    FXSEQ=16 python examples/solvers_hf.py qwen2,mistral,gpt_neox,opt,phi,gemma,falcon,bert

For each model and solver the whole frontier a budget selects from
(fxckpt.pareto's, the plans inside its steps included); then, at each
budget, the recompute cost of the plan each picks, and whether the fast
one is within 5% of the exact one's. One thread, compiler="eager".
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_architectures import MODELS  # noqa: E402

from fxckpt.bench.solvers import capture_joint, frontier  # noqa: E402
from fxckpt.bench.ways import Step  # noqa: E402

BUDGETS = 21
BOUND = 0.05


def compare(name: str) -> str:
    model, inputs, loss_fn = MODELS[name]()
    joint_call = capture_joint(Step(model, loss_fn), inputs)
    found = {solver: frontier(joint_call, solver) for solver in ("ilp", "fast")}
    ilp, fast = found["ilp"][0], found["fast"][0]
    floor, top = ilp.plans[0].peak_bytes, ilp.runtime_optimal.peak_bytes
    within, misses = 0, []
    for k in range(BUDGETS):
        budget = int(floor + k / (BUDGETS - 1) * (top - floor))
        exact, ours = ilp.select(budget), fast.select(budget)
        if ours is None:
            misses.append(f"{budget} B: no fast plan fits")
            continue
        ratio = ours.recompute_cost / exact.recompute_cost if exact.recompute_cost > 0 else (
            1.0 if ours.recompute_cost <= 0 else float("inf"))
        if ratio <= 1 + BOUND:
            within += 1
        else:
            misses.append(f"{budget} B: {ours.recompute_cost * 1e6:.3f} vs "
                          f"{exact.recompute_cost * 1e6:.3f} us ({ratio:.2f}x)")
    return (f"{name}: {within}/{BUDGETS} within {BOUND:.0%}; frontiers "
            f"{found['ilp'][1]:.1f} s exact, {found['fast'][1]:.1f} s fast"
            + "".join(f"\n  {miss}" for miss in misses))


if __name__ == "__main__":
    torch.set_num_threads(1)
    names = sys.argv[1] if len(sys.argv) > 1 else "qwen2"
    for name in names.split(","):
        print(compare(name), flush=True)

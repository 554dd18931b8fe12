"""Train the built-in GPT with FSDP2 and fxckpt under a memory budget per step.

    torchrun --nproc_per_node 2 examples/fsdp2_train.py --steps 5 --budget 28MiB

gloo on CPU, NCCL on CUDA (one GPU per rank). Each block is a ``fully_shard``
unit and the model is compiled with ``fxckpt.backend``. FSDP2's hooks run
outside Dynamo, so every block call breaks the graph: Dynamo compiles the
block's forward once and runs that graph once per block, while the embeddings,
final norm, head and loss run eagerly. The backend budgets each run of a graph
on its own, so the step budget is shared out evenly between the blocks.

The same steps run first without fxckpt (plain FSDP2, eager) for comparison.
Rank 0 prints, per step and rank, both runs' losses and measured peaks (all
the step allocates: activations, gathered parameters, gradients), then what
fxckpt's graphs held for backward and the step's peak as their plans predict
it. After the first step, every rank's plans are checked to be the same.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import fxckpt
from fxckpt.distributed import GraphRuns, check_plans_agree
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.models import gpt_loss, make_model
from fxckpt.options import format_bytes, parse_budget


def main() -> None:
    args = parse_args()
    device = setup()
    step_budget = parse_budget(args.budget).bytes

    plain = sharded_gpt(args.size, device)
    baseline = train(plain, plain, args, device)

    model = sharded_gpt(args.size, device)
    blocks = len(model.blocks)
    backend = fxckpt.backend(budget=step_budget // blocks, compiler=args.compiler)
    runs = GraphRuns(backend)

    def first_step_done() -> None:
        fingerprint = check_plans_agree(backend.plans)   # raises if ranks differ
        runs.check_budget(step_budget)                   # raises if over budget
        if dist.get_rank() == 0:
            plan = backend.plans[0]
            print(f"{len(backend.plans)} graph(s) planned, alike on every rank "
                  f"(fingerprint {fingerprint[:16]}), run {runs.runs} time(s) a step; "
                  f"budget {format_bytes(step_budget)} a step, "
                  f"{format_bytes(step_budget // blocks)} a block: each run saves "
                  f"{format_bytes(plan.saved_bytes)}, recomputes {len(plan.recomputed)} "
                  f"values, peaks at {format_bytes(plan.peak_bytes)} by the plan")

    checkpointed = train(torch.compile(model, backend=runs), model, args, device,
                         runs=runs, after_first_step=first_step_done)
    report(baseline, checkpointed)
    dist.destroy_process_group()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small", "medium"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--budget", default="28MiB",
                        help="bytes fxckpt's graphs may use in one step, e.g. 28MiB")
    parser.add_argument("--compiler", default=None, choices=("eager", "inductor"),
                        help="what compiles the planned graphs (default: inductor "
                             "on CUDA, eager on CPU)")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if args.compiler is None:
        args.compiler = "inductor" if torch.cuda.is_available() else "eager"
    return args


def setup() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def sharded_gpt(size: str, device: torch.device):
    """The built-in GPT, the same on every rank, one FSDP2 unit per block."""
    model, _, _ = make_model("gpt", size=size, seed=0)
    model.to(device)
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def train(module, model, args, device, *, runs=None, after_first_step=None) -> list:
    """(loss, measured peak, held by fxckpt's graphs, planned peak) per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    shape = (make_model("gpt", size=args.size)[1][0]).shape
    rows = []
    for step in range(args.steps):
        idx, targets = batch(model.config, shape, step, device)
        torch.manual_seed(step)                 # dropout: the same in both runs
        opt.zero_grad(set_to_none=True)
        if runs is not None:
            runs.new_step()
        losses = []

        def train_step():
            loss = gpt_loss(module(idx), targets)
            loss.backward()
            losses.append(loss.detach())

        peak = measure_peak_bytes(train_step, device=device)
        opt.step()
        rows.append((losses[0].item(), peak, runs.held_bytes() if runs else None,
                     runs.peak_bytes() if runs else None))
        if step == 0 and after_first_step is not None:
            after_first_step()
    return rows


def batch(config, shape, step: int, device: torch.device):
    """Random tokens and targets, different on every rank and step."""
    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    idx = torch.randint(config.vocab_size, tuple(shape), generator=generator)
    targets = torch.randint(config.vocab_size, tuple(shape), generator=generator)
    return idx.to(device), targets.to(device)


def report(baseline: list, checkpointed: list) -> None:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (baseline, checkpointed))
    if dist.get_rank() != 0:
        return
    print(f"{'step':>4} {'rank':>4} | {'loss':>8} {'peak':>10} | without fxckpt: "
          f"{'loss':>8} {'peak':>10} | {'held by graphs':>14} {'planned peak':>12}")
    for rank, (plain, ours) in enumerate(gathered):
        for step, (p, o) in enumerate(zip(plain, ours)):
            print(f"{step:>4} {rank:>4} | {o[0]:>8.4f} {format_bytes(o[1]):>10} | "
                  f"{'':>15} {p[0]:>8.4f} {format_bytes(p[1]):>10} | "
                  f"{format_bytes(o[2]):>14} {format_bytes(o[3]):>12}")


if __name__ == "__main__":
    main()

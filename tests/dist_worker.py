"""One rank of tests/test_distributed.py: trains small models under FSDP2 and DDP
on gloo, with and without fxckpt, and writes what it saw to ``<out>/<case>.<rank>.json``.

Every case builds each run from scratch (same weights, same per-rank data and
dropout seeds) and compares, inside this process, the fxckpt run's losses and
gradients with those of the references, bit for bit. What fxckpt's compiled
graphs save for backward is measured with saved-tensor hooks around each run of
a compiled graph, independently of the plans.

Run by the test through torch.multiprocessing; by hand::

    python tests/dist_worker.py OUT_DIR [CASE ...]
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import CheckpointPolicy

import fxckpt
from fxckpt.distributed import GraphRuns, check_plans_agree
from fxckpt.models import GPT, GPTConfig, gpt_loss

STEPS = 3
LR = 0.5
# Two blocks of width 128 over a 512-token vocabulary: 2.0 MiB of parameters,
# enough for DDP's 1 MiB buckets to split the graph in two; 256 tokens a rank,
# so that activations outweigh the parameters.
GPT_CONFIG = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=128,
                       dropout=0.1)
GPT_BATCH = 4
DDP_BUCKET_MB = 1
LLAMA_TOKENS = (8, 64)     # batch, sequence


# --- measuring what the compiled graphs save ---------------------------------

class SavedByGraphs:
    """Bytes the compiled graphs save for backward in a step, each storage once.

    Parameter storages are left out, as the plans leave them out. FSDP2 swaps
    the unsharded parameters in just before a block runs, so they are looked up
    each time a graph starts."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.storages: dict[int, int] = {}

    def around(self):
        params = {_local(p).untyped_storage().data_ptr() for p in self.model.parameters()}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in params:
                self.storages.setdefault(storage.data_ptr(), storage.nbytes())
            return tensor

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)

    def take(self) -> int:
        total = sum(self.storages.values())
        self.storages.clear()
        return total


def _local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


# --- one training run ---------------------------------------------------------

def train(module, model, batch_of, loss_of, *, steps=STEPS, runs=None, saved=None):
    """``steps`` SGD steps of ``module`` (``model``, wrapped or compiled); per step
    the loss, this rank's gradients and, when measuring, the graphs' saved bytes
    and runs."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    record = {"losses": [], "grads": [], "saved_bytes": [], "held_bytes": [],
              "peak_bytes": [], "runs": []}
    for step in range(steps):
        inputs, targets = batch_of(step)
        torch.manual_seed(1000 * step + dist.get_rank())     # dropout, per rank
        opt.zero_grad(set_to_none=True)
        if runs is not None:
            runs.new_step()
        loss = loss_of(module(*inputs), targets)
        loss.backward()
        record["losses"].append(loss.item())
        record["grads"].append({name: _local(p.grad).detach().clone()
                                for name, p in model.named_parameters() if p.grad is not None})
        if runs is not None:
            record["runs"].append(runs.runs)
            record["held_bytes"].append(runs.held_bytes())
            record["peak_bytes"].append(runs.peak_bytes())
            record["saved_bytes"].append(saved.take())
        opt.step()
    return record


def compare(reference: dict, got: dict) -> dict:
    """Losses and gradients of two runs: equal bit for bit, and the largest difference."""
    losses_equal = reference["losses"] == got["losses"]
    grads_equal, max_diff, first_diff = True, 0.0, None
    for step, (ref, new) in enumerate(zip(reference["grads"], got["grads"])):
        if ref.keys() != new.keys():
            return {"losses_equal": losses_equal, "grads_equal": False,
                    "max_grad_diff": float("nan"),
                    "first_diff": f"step {step}: gradient sets differ"}
        for name in ref:
            if not torch.equal(ref[name], new[name]):
                grads_equal = False
                first_diff = first_diff or f"step {step}: {name}"
                max_diff = max(max_diff, (ref[name] - new[name]).abs().max().item())
    return {"losses_equal": losses_equal, "grads_equal": grads_equal,
            "max_grad_diff": max_diff, "first_diff": first_diff}


def _error_text(fn) -> str | None:
    """The message of the FxckptError ``fn()`` raises; None if it returns."""
    try:
        fn()
    except fxckpt.FxckptError as error:
        return str(error)
    return None


def train_fxckpt(model, module, batch_of, loss_of, *, budget, steps=STEPS,
                 blocks=None) -> dict:
    """Train ``module`` compiled with fxckpt under ``budget`` (the backend's
    byte budget, which it reads as per graph run), or with ``blocks`` each
    compiled on its own and the rest eager; record the plans with the losses,
    gradients and measurements."""
    backend = fxckpt.backend(budget=budget, compiler="eager")
    saved = SavedByGraphs(model)
    runs = GraphRuns(backend, around=saved.around)
    if blocks is None:
        module = torch.compile(module, backend=runs)
    else:
        for block in blocks:
            block.compile(backend=runs)
    record = train(module, model, batch_of, loss_of, steps=steps, runs=runs, saved=saved)
    record.update(
        fingerprints=[plan.fingerprint for plan in backend.plans],
        agreed=check_plans_agree(backend.plans),
        plans=[{"saved_bytes": p.saved_bytes, "peak_bytes": p.peak_bytes,
                "budget_bytes": p.budget_bytes, "recomputed": len(p.recomputed)}
               for p in backend.plans],
        graphs=len(runs.plans),
        replans=backend.replans,
        ledger_runs=[entry.runs for entry in backend.ledger.live() if entry.plan is not None],
        runs_record=runs)
    return record


def result(step_budget: int, references: dict, got: dict, **extra) -> dict:
    """What the test reads: the budget, every run's losses, the comparisons of
    fxckpt's run with each reference, and fxckpt's plans and measurements."""
    out = {"step_budget": step_budget,
           "losses": {**{name: ref["losses"] for name, ref in references.items()},
                      "fxckpt": got["losses"]},
           **{f"vs_{name}": compare(ref, got) for name, ref in references.items()},
           **{key: value for key, value in got.items()
              if key not in ("grads", "losses", "runs_record")},
           **extra}
    if "aot_eager" in references:
        out["aot_eager_vs_eager"] = compare(references["eager"], references["aot_eager"])
    return out


# --- the built-in GPT -------------------------------------------------------

def make_gpt() -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(GPT_CONFIG)


def gpt_batch(step: int):
    generator = torch.Generator().manual_seed(100 * dist.get_rank() + step)
    shape = (GPT_BATCH, GPT_CONFIG.block_size)
    idx = torch.randint(GPT_CONFIG.vocab_size, shape, generator=generator)
    targets = torch.randint(GPT_CONFIG.vocab_size, shape, generator=generator)
    return (idx,), targets


def shard_gpt(model: GPT) -> GPT:
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def references(make, wrap, batch_of, loss_of, backends=(None, "aot_eager")) -> dict:
    """Runs without fxckpt: plain (eager) and compiled with each other backend."""
    runs = {}
    for backend in backends:
        torch._dynamo.reset()
        model = make()
        module = wrap(model)
        if backend is not None:
            module = torch.compile(module, backend=backend)
        runs[backend or "eager"] = train(module, model, batch_of, loss_of)
    return runs


def floor_bytes(run) -> int:
    """The smallest budget ``run(budget)`` can be given: the step's floor a
    BudgetError reports for a budget of one byte, raised once the first
    step's backward has run at every graph's floor."""
    try:
        run(1)
    except fxckpt.BudgetError as error:
        return error.floor_bytes
    raise AssertionError("a budget of one byte was met")


def case_fsdp2_gpt() -> dict:
    def run(budget, steps=STEPS):
        torch._dynamo.reset()
        model = shard_gpt(make_gpt())
        return train_fxckpt(model, model, gpt_batch, gpt_loss, budget=budget, steps=steps)

    refs = references(lambda: shard_gpt(make_gpt()), lambda m: m, gpt_batch, gpt_loss)
    # Dynamo compiles one graph for the block and runs it once per block. The
    # backend is given the step floor it named for a one-byte budget, which
    # the block graph meets only by recomputing once the backend has seen
    # (after the first step) that it runs n_layer times.
    step_budget = floor_bytes(lambda budget: run(budget, steps=1))
    got = run(step_budget)
    return result(step_budget, refs, got, n_layer=GPT_CONFIG.n_layer,
                  checked_step_peak=got["runs_record"].check_budget(step_budget))


def case_ddp_gpt() -> dict:
    def run(budget, steps=STEPS):
        torch._dynamo.reset()
        model = make_gpt()
        return train_fxckpt(model, DDP(model, bucket_cap_mb=DDP_BUCKET_MB), gpt_batch,
                            gpt_loss, budget=budget, steps=steps)

    refs = references(make_gpt, lambda m: DDP(m, bucket_cap_mb=DDP_BUCKET_MB),
                      gpt_batch, gpt_loss, backends=(None,))
    # DDPOptimizer's graphs each run once. The Backend gives the first the
    # whole budget and the second what the first saves less; the first,
    # given room, may save more than its unbudgeted plan, so the budget leaves
    # a quarter more than the unbudgeted plans need.
    need = run(None, steps=1)["peak_bytes"][0]
    step_budget = need + need // 4
    return result(step_budget, refs, run(step_budget), unbudgeted_need=need)


# --- a Hugging Face Llama, sharded per decoder layer ---------------------------

def case_fsdp2_llama() -> dict:
    try:
        from tests.zoo import make_hf_llama
    except ImportError:  # tests/ itself on sys.path
        from zoo import make_hf_llama

    def make():
        with torch.random.fork_rng(devices=[]):
            model, _, _ = make_hf_llama()
        for layer in model.model.model.layers:
            fully_shard(layer)
        return fully_shard(model)

    def batch(step):
        generator = torch.Generator().manual_seed(100 * dist.get_rank() + step)
        tokens = torch.randint(128, LLAMA_TOKENS, generator=generator)
        return (tokens, tokens), None

    def run(budget, steps=STEPS):
        # Each decoder layer compiled on its own and the rest left eager, as
        # torchtitan does (the GPT case compiles the whole model); the layers
        # share one graph, run once per layer.
        torch._dynamo.reset()
        model = make()
        return train_fxckpt(model, model, batch, _hf_loss, budget=budget, steps=steps,
                            blocks=model.model.model.layers)

    refs = references(make, lambda m: m, batch, _hf_loss, backends=(None,))
    step_budget = floor_bytes(lambda budget: run(budget, steps=1))
    with torch.random.fork_rng(devices=[]):
        n_layer = len(make_hf_llama()[0].model.model.layers)
    return result(step_budget, refs, run(step_budget), n_layer=n_layer)


def _hf_loss(out, _targets):
    return out.loss


# --- a graph with a collective in it ------------------------------------------

def case_collectives() -> dict:
    import torch.distributed._functional_collectives as funcol

    weight = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1 + dist.get_rank()))

    def step(inp):
        h = inp @ weight
        total = funcol.all_reduce(h.detach(), "sum", dist.group.WORLD)
        return (torch.sin(h) * total).sum()

    def compiled_step(policy):
        torch._dynamo.reset()
        backend = fxckpt.backend(compiler="eager", policy=policy)
        weight.grad = None
        loss = torch.compile(step, backend=backend, fullgraph=True)(x)
        loss.backward()
        return backend, loss.item(), weight.grad.clone()

    weight.grad = None
    eager_loss = step(x)
    eager_loss.backward()
    eager = (eager_loss.item(), weight.grad.clone())

    def must_recompute_collectives(ctx, op, *args, **kwargs):
        if op.namespace == "_c10d_functional":
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.PREFER_SAVE

    def entries(backend):
        return [{"name": e.name, "op": e.op, "action": e.action, "reason": e.reason}
                for e in backend.plans[0].entries if "_c10d_functional" in e.op]

    backend, loss, grad = compiled_step(None)
    result = {"default": entries(backend),
              "default_matches_eager": loss == eager[0] and torch.equal(grad, eager[1])}
    # Rank 1 pretends to have planned differently: every rank must hear of it.
    plan = backend.plans[0]
    mine = plan if dist.get_rank() == 0 else dataclasses.replace(plan, saved=plan.saved[1:])
    result["disagreement"] = _error_text(lambda: check_plans_agree([mine]))
    backend, loss, grad = compiled_step(
        fxckpt.policies.recompute_ops(torch.ops._c10d_functional.all_reduce))
    result["prefer_recompute"] = entries(backend)
    result["prefer_recompute_matches_eager"] = loss == eager[0] and torch.equal(grad, eager[1])
    all_reduce = torch.ops._c10d_functional.all_reduce
    for name, policy in [("sac_must_recompute", must_recompute_collectives),
                         ("must_recompute_ops",
                          fxckpt.policies.must(fxckpt.policies.recompute_ops(all_reduce)))]:
        result[name] = _error_text(lambda: compiled_step(policy))   # a PolicyError's
    return result


CASES = {"fsdp2_gpt": case_fsdp2_gpt, "ddp_gpt": case_ddp_gpt,
         "fsdp2_llama": case_fsdp2_llama, "collectives": case_collectives}


def main(rank: int, world_size: int, init_method: str, out_dir: str,
         cases: tuple[str, ...] = tuple(CASES)) -> None:
    torch.set_num_threads(1)   # two ranks share the machine's cores
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for case in cases:
            try:
                result = {"ok": True, **CASES[case]()}
            except Exception:  # recorded for the test to report, then go on
                result = {"ok": False, "error": traceback.format_exc()}
            with open(os.path.join(out_dir, f"{case}.{rank}.json"), "w") as f:
                json.dump(result, f, indent=1)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    out_dir, *chosen = sys.argv[1:]
    main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", out_dir,
         tuple(chosen) or tuple(CASES))

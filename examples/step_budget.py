"""Budgets across a training step, measured: one row per layout, the budget,
each step's measured peak (CPU allocator events, gradients allocated afresh),
how many graphs the backend re-planned and whether loss and gradients equal
eager PyTorch's bit for bit.

    python examples/step_budget.py          # prints a markdown table

CPU, compiler="eager", a small GPT (3 layers, n_embd 32, dropout 0.1).
"""

from __future__ import annotations

import warnings

import torch

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.models import GPT, FeedForward, GPTConfig, gpt_loss

CONFIG = GPTConfig(vocab_size=64, block_size=64, n_layer=3, n_head=2, n_embd=32, dropout=0.1)


class BreakAfterEachBlock(GPT):
    """A GPT whose forward breaks the graph after every block (.item())."""

    def forward(self, idx):
        x = self.emb_dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1])))
        for block in self.blocks:
            x = block(x)
            if x.mean().item() > 1e9:
                x = x * 2
        return self.head(self.ln_out(x))


class BreakingFeedForward(FeedForward):
    """A block's MLP whose forward breaks the graph (.item()): under
    fxckpt.compile, an eager fallback region."""

    def forward(self, x):
        h = super().forward(x)
        if h.mean().item() > 1e9:
            h = h * 2
        return h


class Unrolled(GPT):
    """A GPT whose forward calls its blocks one by one. A graph break inside
    a block then ends the graph at that call and the code around it still
    compiles; inside a ``for`` loop, Dynamo would run the whole forward
    eagerly, uncounted by any budget."""

    def forward(self, idx):
        x = self.emb_dropout(self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1])))
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        x = self.blocks[2](x)
        return self.head(self.ln_out(x))


def breaking_mlps() -> GPT:
    model = gpt(Unrolled)
    for block in model.blocks:
        block.mlp.__class__ = BreakingFeedForward
    return model


def gpt(cls=GPT) -> GPT:
    torch.manual_seed(0)
    return cls(CONFIG)


def batch(size: int, seq: int):
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(CONFIG.vocab_size, (size, seq), generator=generator)
    targets = torch.randint(CONFIG.vocab_size, (size, seq), generator=generator)
    return idx, targets


def step(model, run, idx, targets, *, peak: bool = True):
    """One training step from seed 3: (measured peak or None, loss, grads)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    out = {}

    def go():
        out["loss"] = gpt_loss(run(idx), targets)
        out["loss"].backward()

    measured = measure_peak_bytes(go) if peak else go()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return measured, out["loss"].detach(), grads


def bitwise(a, b) -> bool:
    return torch.equal(a[1], b[1]) and all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


def floor(model, idx) -> int:
    try:
        fxckpt.explain(model, idx, budget=1, compiler="eager")
    except fxckpt.BudgetError as refused:
        return refused.floor_bytes
    raise AssertionError("a budget of one byte was met")


def row(layout, budget, peaks, replans, equal, *, replanned: bool = False) -> str:
    """The worst peak over the budget counts every step, or, where graphs
    were re-planned (or regions given another policy) after the first step,
    every step after it."""
    text = ", ".join(f"{p / 2**20:.2f}" for p in peaks)
    worst = max(peaks[1:] if replans or replanned else peaks) / budget
    return (f"| {layout} | {budget / 2**20:.2f} MiB | {text} | {worst:.3f} | {replans} | "
            f"{'bitwise' if equal else 'differs'} |")


def one_graph_recompiles() -> str:
    idx, targets = batch(4, 48)
    budget = int(floor(gpt(), idx) * 1.02)
    model = gpt()
    be = fxckpt.backend(compiler="eager", budget=budget)
    compiled = torch.compile(model, backend=be)
    peaks, equal = [], True
    for size, seq in ((4, 48), (3, 40), (4, 48)):
        idx, targets = batch(size, seq)
        got = step(model, compiled, idx, targets)
        reference_model = gpt()
        equal &= bitwise(got, step(reference_model, reference_model, idx, targets, peak=False))
        peaks.append(got[0])
        model.eval()
        with torch.no_grad():
            compiled(idx)
        model.train()
    return row("one graph; last batch smaller (recompile), eval pass between steps",
               budget, peaks, be.replans, equal)


def per_block(layout: str, cls=GPT, compile_blocks: bool = True) -> str:
    idx, targets = batch(4, 64)
    default = gpt(cls)
    if compile_blocks:
        for block in default.blocks:
            block.compile(backend=fxckpt.backend(compiler="eager"))
        run_default = default
    else:
        run_default = torch.compile(default, backend=fxckpt.backend(compiler="eager"))
    budget = int(0.8 * step(default, run_default, idx, targets)[0])
    torch._dynamo.reset()
    model = gpt(cls)
    be = fxckpt.backend(compiler="eager", budget=budget)
    if compile_blocks:
        for block in model.blocks:
            block.compile(backend=be)
        run = model
    else:
        run = torch.compile(model, backend="fxckpt",
                            options={"budget": budget, "compiler": "eager"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [step(model, run, idx, targets) for _ in range(3)]
    reference = gpt(cls)
    equal = bitwise(got[-1], step(reference, reference, idx, targets, peak=False))
    replans = sum("re-planning" in str(w.message) for w in caught)   # one per backend
    return row(layout, budget, [g[0] for g in got], replans, equal)


def dynamic_shapes() -> str:
    large, large_targets = batch(4, 48)
    small, small_targets = batch(4, 16)
    budget = int(floor(gpt(), large) * 1.1)
    model = gpt()
    be = fxckpt.backend(compiler="eager", budget=budget)
    compiled = torch.compile(model, backend=be, dynamic=True)
    first = step(model, compiled, large, large_targets)
    second = step(model, compiled, small, small_targets)
    reference = gpt()
    equal = bitwise(second, step(reference, reference, small, small_targets, peak=False))
    return row("dynamic=True, seq 48 then 16", budget, [first[0], second[0]], be.replans, equal)


def fraction() -> str:
    idx, targets = batch(4, 48)
    low, high = floor(gpt(), idx), fxckpt.explain(gpt(), idx, compiler="eager").peak_bytes
    model = gpt()
    compiled = torch.compile(model, backend=fxckpt.backend(compiler="eager", budget=0.5))
    got = [step(model, compiled, idx, targets) for _ in range(2)]
    reference = gpt()
    equal = bitwise(got[-1], step(reference, reference, idx, targets, peak=False))
    return row("one graph, budget=0.5 (floor + half the way to the runtime-optimal peak)",
               (low + high) // 2, [g[0] for g in got], 0, equal)


def fallback_regions(above_floor: float) -> str:
    """fxckpt.compile, policy save_all(): each block's MLP is a region. The
    budget is the step floor BudgetError names, times ``above_floor``."""
    idx, targets = batch(4, 64)
    policy = fxckpt.policies.save_all()
    refused = fxckpt.compile(breaking_mlps(), compiler="eager", policy=policy, budget=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(2):
                step(refused, refused, idx, targets, peak=False)
        raise AssertionError("a budget of one byte was met")
    except fxckpt.BudgetError as error:
        floor_bytes = error.floor_bytes
    torch._dynamo.reset()
    budget = int(floor_bytes * above_floor)
    model = breaking_mlps()
    run = fxckpt.compile(model, compiler="eager", policy=policy, budget=budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [step(model, run, idx, targets) for _ in range(3)]
    reference = breaking_mlps()
    equal = bitwise(got[-1], step(reference, reference, idx, targets, peak=False))
    report = run.fxckpt_report
    moved = sum(r.policy.startswith("its floor") for r in report.regions)
    layout = ("graph break in every block's MLP (an eager region each), fxckpt.compile, "
              "policy save_all(); budget "
              + ("the step floor BudgetError names" if above_floor == 1 else
                 f"{above_floor:g} x the step floor")
              + f": {moved} of {len(report.regions)} regions at their floor")
    return row(layout, budget, [g[0] for g in got], run._fxckpt.backend.replans, equal,
               replanned=True)


def main() -> None:
    torch.set_num_threads(1)
    print("| layout | budget | measured step peaks (MiB) | worst peak / budget "
          "| re-plans | loss and grads vs eager |")
    print("|---|---|---|---|---|---|")
    for make in (one_graph_recompiles,
                 lambda: per_block("each block compiled on its own (block.compile)"),
                 lambda: per_block("graph break after every block (.item()), string "
                                   "backend with options", BreakAfterEachBlock, False),
                 dynamic_shapes, fraction,
                 lambda: fallback_regions(1.5), lambda: fallback_regions(1.0)):
        torch._dynamo.reset()
        print(make(), flush=True)


if __name__ == "__main__":
    main()

"""``fxckpt bench --suite compile``: how long the first step takes to
compile, torch's way and fxckpt's, as the GPT grows.

Each way (torch.compile's default, torch with ``activation_memory_budget``,
fxckpt's default, fxckpt with the same budget fraction) of each row (a layer
count and a compiler, aot_eager or Inductor) runs in a process of its own,
one torch thread, twice: first against an empty cache directory of its own
(``TORCHINDUCTOR_CACHE_DIR``, where torch keeps compiled graphs and kernels
and fxckpt its plans), then in a second process against the directory the
first left. So every way pays for what its own first compile builds (under
Inductor, mostly C++ kernels), as a user's first run does: no way is served
kernels another way built. A way's time is its first step (compile,
forward and backward) in CPU seconds of the process and of the C++
compiler runs it waits for (``TORCHINDUCTOR_COMPILE_THREADS=1``: no pool of
compile workers); on a shared machine the wall clock counts other jobs'
time too, so it is kept beside, not compared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from fxckpt.compat.aot import functorch_config
from fxckpt.bench.measure import using_threads

WAYS = ("fxckpt_budget", "fxckpt_default", "torch_budget", "torch_default")
COMPILERS = ("aot_eager", "inductor")
LAYERS = (4, 8, 16, 32, 64)


def gpt_step(n_layer: int):
    """The GPT the suite compiles: n_embd 64, 2 heads, batch 2, 32 tokens,
    dropout 0.1 (the default); (step module, inputs)."""
    from fxckpt.bench.ways import Step
    from fxckpt.models import GPT, GPTConfig, gpt_loss

    config = GPTConfig(vocab_size=64, block_size=32, n_layer=n_layer, n_head=2, n_embd=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(config)
        idx = torch.randint(config.vocab_size, (2, config.block_size))
        targets = torch.randint(config.vocab_size, (2, config.block_size))
    return Step(model, lambda logits: gpt_loss(logits, targets)), (idx,)


def _time_way(way: str, n_layer: int, compiler: str, budget: float) -> dict:
    """One way's first step: seconds, and for fxckpt's ways the plans'
    fingerprints and planning seconds. Runs only in a process of its own
    (``run_row_processes`` -> ``_main``), which owns Dynamo's state: each
    way's compile is timed cold, so Dynamo is reset around it."""
    import fxckpt

    torch.compiler.reset()
    step, inputs = gpt_step(n_layer)
    plans = None
    if way.startswith("fxckpt"):
        backend = fxckpt.backend(budget=budget if way == "fxckpt_budget" else None,
                                 compiler="eager" if compiler == "aot_eager" else "inductor")
        plans = backend.plans
        amb = 1.0
    else:
        backend = compiler
        amb = budget if way == "torch_budget" else 1.0
    compiled = torch.compile(step, backend=backend)
    with functorch_config.patch(activation_memory_budget=amb):
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        compiled(*inputs).backward()
        cpu, wall = _cpu_seconds() - cpu_start, time.perf_counter() - start
    torch.compiler.reset()
    row = {"way": way, "seconds": cpu, "wall_seconds": wall}
    if plans is not None:
        row.update(fingerprints=[p.fingerprint for p in plans],
                   planning_seconds=sum(p.plan_seconds for p in plans),
                   peak_bytes=[p.peak_bytes for p in plans])
    return row


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (the
    C++ compiler Inductor runs for each kernel)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _measure_way(way: str, n_layer: int, compiler: str, budget: float,
                 threads: int = 1) -> dict:
    with using_threads(threads):
        return _time_way(way, n_layer, compiler, budget)


def run_row_processes(n_layer: int, compiler: str, budget: float, threads: int = 1,
                      repeat: int = 1) -> dict:
    """The row: each way in a first process (an empty cache directory of its
    own) and a second one (the directory the first left). ``repeat``: that
    many rounds, each with fresh cache directories and the ways in an order
    rotated by one (no way always runs first, or after the same other way);
    a way's figures are those of its median round, and ``rounds`` keeps
    every round's seconds, so that ratios can be taken within a round,
    between processes run minutes apart at most."""
    rounds = []
    for index in range(repeat):
        first, second = {}, {}
        for way in WAYS[index % len(WAYS):] + WAYS[:index % len(WAYS)]:
            first[way], second[way] = _first_and_second(way, n_layer, compiler, budget,
                                                        threads)
        rounds.append((first, second))
    return {"layers": n_layer, "compiler": compiler,
            "first": {w: _median_run([r[0][w] for r in rounds]) for w in WAYS},
            "second": {w: _median_run([r[1][w] for r in rounds]) for w in WAYS},
            "rounds": [{w: (r[0][w]["seconds"], r[1][w]["seconds"]) for w in WAYS}
                       for r in rounds]}


def _first_and_second(way: str, n_layer: int, compiler: str, budget: float,
                      threads: int) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory(prefix="fxckpt-compile-bench-") as cache:
        # One compile thread: Inductor then builds kernels from this
        # process (its C++ compiler a child it waits for, counted),
        # not in a pool of workers whose CPU time the way would not see.
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                   TORCHINDUCTOR_COMPILE_THREADS="1")
        args = [sys.executable, "-m", "fxckpt.bench.compile", way, str(n_layer), compiler,
                repr(budget), str(threads)]
        runs = []
        for _ in range(2):
            done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"compile bench row {n_layer} x {compiler}, {way}, "
                                   "failed:\n" + done.stderr[-4000:])
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs[0], runs[1]


def _median_run(runs: list[dict]) -> dict:
    """The run of median seconds (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2]


def round_ratios(row: dict, way: str, over: str) -> list[float]:
    """``way``'s first-process seconds over ``over``'s, within each round."""
    return [r[way][0] / r[over][0] for r in row.get("rounds", ())]


def run_compile(*, layers=LAYERS, compilers=COMPILERS, budget: float = 0.5,
                threads: int = 1, repeat: int = 1, progress=None) -> dict:
    rows = []
    if progress is not None:
        progress.start("compile", len(layers) * len(compilers))
    for n_layer in layers:
        for compiler in compilers:
            label = f"compile: GPT {n_layer} layers, {compiler}"
            if progress is None:
                rows.append(run_row_processes(n_layer, compiler, budget, threads, repeat))
                continue
            with progress.row(label):
                rows.append(run_row_processes(n_layer, compiler, budget, threads, repeat))
    return {"budget": budget, "repeat": repeat, "rows": rows}


def compile_markdown(result: dict) -> str:
    budget, repeat = result["budget"], result.get("repeat", 1)
    head = ("| layers | compiler | torch default s | torch budget s | fxckpt default s | "
            "fxckpt budget s | fxckpt budget / torch default | fxckpt budget / torch budget | "
            "fxckpt planning s (default / budget) | second process s (torch default, torch "
            "budget, fxckpt default, fxckpt budget) | second / first, fxckpt budget |")
    columns = 11
    if repeat > 1:
        head += " fxckpt budget / torch default, each round |"
        columns += 1
    lines = [head, "|" + "---|" * columns]
    for row in result["rows"]:
        first, second = row["first"], row["second"]
        s = {w: first[w]["seconds"] for w in WAYS}
        again = ", ".join(f"{second[w]['seconds']:.2f}" for w in reversed(WAYS))
        # A row read from a result written before rounds were kept: its one run.
        over_default = round_ratios(row, "fxckpt_budget", "torch_default") \
            or [s["fxckpt_budget"] / s["torch_default"]]
        ratio_default = statistics.median(over_default)
        ratio_budget = statistics.median(round_ratios(row, "fxckpt_budget", "torch_budget")
                                         or [s["fxckpt_budget"] / s["torch_budget"]])
        line = (f"| {row['layers']} | {row['compiler']} | {s['torch_default']:.2f} | "
                f"{s['torch_budget']:.2f} | {s['fxckpt_default']:.2f} | "
                f"{s['fxckpt_budget']:.2f} | {ratio_default:.2f}x | {ratio_budget:.2f}x | "
                f"{first['fxckpt_default']['planning_seconds']:.2f} / "
                f"{first['fxckpt_budget']['planning_seconds']:.2f} | {again} | "
                f"{second['fxckpt_budget']['seconds'] / s['fxckpt_budget']:.2f}x |")
        if repeat > 1:
            line += " " + ", ".join(f"{r:.2f}x" for r in over_default) + " |"
        lines.append(line)
    rounds = (f" Each way ran {repeat} rounds (the ways' order rotated each round); "
              "seconds are a way's median round, ratios the median of the ratios "
              "within each round.") if repeat > 1 else ""
    return (f"First-step CPU seconds (compile, forward, backward) of a process of the "
            f"way's own, with the C++ compiler runs it waited for; an empty cache "
            f"directory per way (second process: the directory its first left); one "
            f"torch thread, one Inductor compile thread; torch "
            f"budget: activation_memory_budget={budget:g}; fxckpt budget: budget={budget:g}."
            + rounds + "\n\n" + "\n".join(lines) + "\n")


def _main(argv: list[str]) -> None:
    way, n_layer, compiler = argv[0], int(argv[1]), argv[2]
    budget, threads = float(argv[3]), int(argv[4])
    print(json.dumps(_measure_way(way, n_layer, compiler, budget, threads)))


if __name__ == "__main__":
    _main(sys.argv[1:])

"""The ``fxckpt`` command line.

Each subcommand is a function ``run_NAME(args) -> exit status`` plus an
``add_NAME(subparsers)`` that declares its arguments; ``main`` only parses
and dispatches.

``fxckpt demo`` trains the built-in GPT on the CPU three ways -- without
checkpointing, with fxckpt's default plan, and with fxckpt under a tight
budget -- and prints what each costs, measured rather than predicted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fxckpt import measure
from fxckpt.models import GPT, MODEL_NAMES, make_model

MiB = 2 ** 20


# --- the core, imported late -------------------------------------------------

class CoreUnavailable(RuntimeError):
    """fxckpt's compile backend cannot be imported."""


def _core():
    """Return ``(fxckpt.backend, BudgetError)``, or raise CoreUnavailable
    saying what is missing."""
    try:
        import fxckpt
        backend = fxckpt.backend
    except (ImportError, AttributeError) as error:
        raise CoreUnavailable(
            f"fxckpt.backend is not available ({error}); the core pipeline "
            f"is missing or failed to import") from error
    budget_error = getattr(fxckpt, "BudgetError", None)
    if budget_error is None:
        from fxckpt.errors import BudgetError as budget_error
    return backend, budget_error


def _declined(error: BaseException, budget_error: type) -> BaseException | None:
    """The NotImplementedError or BudgetError behind ``error``, if any.

    torch.compile wraps a backend's exception (BackendCompilerFailed), so
    follow the chain of causes.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (NotImplementedError, budget_error)):
            return error
        seen.add(id(error))
        error = (getattr(error, "inner_exception", None) or error.__cause__
                 or error.__context__)
    return None


# --- demo --------------------------------------------------------------------

@dataclass
class DemoRow:
    """What one way of training measured, or why it did not run."""

    label: str
    skipped: str = ""                    # the reason, when it did not run
    peak_bytes: int = 0
    saved_bytes: int = 0
    step_seconds: float = 0.0            # median over steps after the first
    loss: torch.Tensor | None = None     # first step's loss
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    plans: list[Any] = field(default_factory=list)


def add_demo(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="train a small GPT with and without fxckpt and compare",
        description=(
            "Train the built-in GPT on the CPU three ways: (a) no "
            "checkpointing, (b) fxckpt's default plan, (c) fxckpt under a "
            "tight budget. Prints measured peak memory, saved activations, "
            "step time and whether loss and gradients match (a) bitwise."))
    parser.add_argument("--steps", type=int, default=5,
                        help="training steps per run; the first compiles and "
                             "is not timed (default: 5)")
    parser.add_argument("--budget", default=None,
                        help="budget of run (c): bytes, a size such as 12MiB, or a "
                             "fraction of the runtime-optimal plan's peak "
                             "(default: the smallest budget fxckpt can meet)")
    parser.add_argument("--show-plans", action="store_true",
                        help="print fxckpt's plan for each compiled graph")
    parser.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if args.steps < 2:
        raise SystemExit("fxckpt demo: --steps must be at least 2 (the first "
                         "step compiles and is not timed)")
    try:
        core, missing = _core(), None
    except CoreUnavailable as error:
        core, missing = None, error
    model, inputs, _ = make_model("gpt", size="small")
    print(f"fxckpt demo: {_describe(model, inputs)}; {args.steps} steps "
          f"each on the CPU, 1 thread\n", flush=True)
    budget, budget_label = _demo_budget(args.budget, model, inputs, core)
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
            row = _run(label, options, core, args.steps)
            rows.append(row)
            print(_line(row, rows[0], width), flush=True)
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        if row.plans:
            print(f"{row.label} planned: {_plan_summary(row.plans)}")
        for index, plan in enumerate(row.plans if args.show_plans else []):
            print(f"\n{row.label}, graph {index}:\n{plan}")
    if missing is not None:
        print(f"fxckpt demo: {missing}", file=sys.stderr)
        return 1
    return 0


def _demo_budget(text: str | None, model, inputs, core) -> tuple[Any, str]:
    """Run (c)'s budget and its label: the one asked for, or fxckpt's floor,
    found by asking for a budget no plan can meet."""
    if text is not None:
        value: Any = float(text) if text.replace(".", "", 1).isdigit() and "." in text \
            else (int(text) if text.isdigit() else text)
        return value, f"budget {text}"
    if core is None:
        return None, "at its floor"
    import fxckpt

    try:
        fxckpt.explain(model, *inputs, budget=1, compiler="eager")
    except fxckpt.BudgetError as refused:
        floor = refused.floor_bytes
        return floor, f"floor {floor / 2**20:.2f} MiB"
    return None, "at its floor"


def _run(label: str, options: dict | None, core, steps: int) -> DemoRow:
    """Train one way: through aot_eager when ``options`` is None, else
    through ``fxckpt.backend(compiler="eager", **options)``. A run the core
    declines (or a missing core) gives an n/a row."""
    if options is None:
        return _train(label, "aot_eager", steps)
    if core is None:
        return DemoRow(label, skipped="fxckpt core unavailable")
    backend, budget_error = core
    try:
        return _train(label, backend(compiler="eager", **options), steps)
    except Exception as error:  # a declined budget is a result, not a crash
        declined = _declined(error, budget_error)
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


def _train(label: str, backend: str | Callable, steps: int) -> DemoRow:
    """Train a fresh copy of the demo GPT for ``steps`` steps through
    ``torch.compile(backend=backend)`` and measure it."""
    torch._dynamo.reset()
    model, inputs, loss_fn = make_model("gpt", size="small", seed=0)
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    live = [*model.parameters(), *model.buffers()]
    row = DemoRow(label)

    def train_step(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)  # the same dropout masks in every run
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(compiled(*inputs))
        loss.backward()
        return loss

    # Step 1 compiles; its loss and gradients are the ones compared.
    row.loss = train_step(seed=0).detach().clone()
    row.grads = {name: param.grad.clone()
                 for name, param in model.named_parameters()}
    row.plans = list(getattr(backend, "plans", []))
    optimizer.step()

    seeds = iter(range(1, steps))

    def timed_step() -> None:
        train_step(next(seeds))
        optimizer.step()

    row.step_seconds = statistics.median(
        measure.time_steps(timed_step, repeat=steps - 1, warmup=0))

    optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(steps)
    saved = measure.measure_saved_bytes(
        lambda: loss_fn(compiled(*inputs)), exclude=live)
    saved.output.backward()
    row.saved_bytes = saved.total_bytes

    optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(steps)
    row.peak_bytes = measure.measure_peak_bytes(
        lambda: loss_fn(compiled(*inputs)).backward())
    return row


def _match(row: DemoRow, reference: DemoRow) -> str:
    if row is reference:
        return "reference"
    if not torch.equal(row.loss, reference.loss):
        return (f"no: loss {row.loss.item():.6g} vs "
                f"{reference.loss.item():.6g}")
    differ = [name for name, grad in reference.grads.items()
              if not torch.equal(row.grads[name], grad)]
    if differ:
        return f"no: {len(differ)}/{len(reference.grads)} grads differ"
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


# --- bench -------------------------------------------------------------------

def add_bench(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure torch's checkpointing and fxckpt's side by side",
        description=(
            "Train the built-in models every way torch offers to save "
            "activation memory (eager checkpoint per block, selective "
            "checkpointing, torch.compile's activation_memory_budget) and "
            "with fxckpt, at torch's measured peaks as budgets and at fxckpt's "
            "floor; measure peak memory, saved bytes, step time, recompute "
            "and correctness. Writes bench.json, bench.md and pareto.png. "
            "--suite solvers times the solvers instead; --suite offload "
            "measures CPU offload on a CUDA device."))
    parser.add_argument("--suite", choices=("models", "solvers", "offload"), default="models",
                        help="models: the side-by-side table (default); solvers: "
                             "solve time on a ~10,000-node graph and the fast "
                             "solver against the ILP; offload: the GPT with matmul "
                             "outputs saved on the device vs offloaded to host "
                             "memory (needs CUDA)")
    parser.add_argument("--device", default=None,
                        help="--suite offload: the device (default: cuda)")
    parser.add_argument("--model", action="append", choices=MODEL_NAMES,
                        help="a built-in model; repeat for several (default: all)")
    parser.add_argument("--size", choices=("tiny", "small", "medium"), default=None,
                        help="model size (default: small; tiny with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a CI-sized run: tiny models, 3 timed steps per row, no "
                             "Inductor rows; with --suite solvers a 12-layer GPT and "
                             "tiny models")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed steps per row, median reported (default: 15, "
                             "3 with --quick)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads while measuring (default: 1)")
    parser.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=None,
                        help="add Inductor rows, for timing (default: on, off "
                             "with --quick)")
    parser.add_argument("--layers", type=int, default=None,
                        help="--suite solvers: layers of the deep GPT (default: 58, "
                             "about 10,000 joint-graph nodes; 12 with --quick)")
    parser.add_argument("--out", default="bench-results",
                        help="directory for the results (default: ./bench-results)")
    parser.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from fxckpt import bench, bench_report

    command = _bench_command(args)
    if args.suite == "solvers":
        return _run_solvers(args, command)
    if args.suite == "offload":
        return _run_offload(args, command)
    overrides = {"models": tuple(args.model or MODEL_NAMES), "threads": args.threads}
    if args.size is not None:
        overrides["size"] = args.size
    if args.repeat is not None:
        overrides["repeat"] = args.repeat
    if args.inductor is not None:
        overrides["inductor"] = args.inductor
    config = (bench.BenchConfig.quick_run(**overrides) if args.quick
              else bench.BenchConfig(**overrides))
    result = bench.run_bench(config)
    paths = bench_report.write(result, args.out, command=command)
    print(bench_report.markdown(dict(result, command=command)))
    print("wrote " + ", ".join(paths.values()), file=sys.stderr)
    return 0


def _bench_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, for the report."""
    words = ["fxckpt", "bench"]
    if args.suite != "models":
        words += ["--suite", args.suite]
    words += [f"--model {m}" for m in args.model or ()]
    words += ["--quick"] if args.quick else []
    for flag, value, default in (("--size", args.size, None), ("--repeat", args.repeat, None),
                                 ("--threads", args.threads, 1), ("--layers", args.layers, None),
                                 ("--device", args.device, None),
                                 ("--out", args.out, "bench-results")):
        if value != default:
            words.append(f"{flag} {value}")
    if args.inductor is not None:
        words.append("--inductor" if args.inductor else "--no-inductor")
    return " ".join(words)


def _run_solvers(args: argparse.Namespace, command: str) -> int:
    from fxckpt import bench_solvers
    from fxckpt.bench import Progress, machine

    layers = args.layers or (12 if args.quick else 58)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = bench_solvers.run_solvers(
            n_layer=layers, models=tuple(args.model or MODEL_NAMES),
            size=args.size or ("tiny" if args.quick else "small"),
            progress=Progress(sys.stderr))
    finally:
        torch.set_num_threads(threads)
    result.update(command=command, machine=machine(args.threads))
    return _write_suite(args.out, "solvers", result, bench_solvers.solvers_markdown(result))


def _run_offload(args: argparse.Namespace, command: str) -> int:
    from fxckpt import bench_offload
    from fxckpt.bench import Progress

    device = args.device or "cuda"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        print(f"fxckpt bench --suite offload needs a CUDA device (got {device!r}, "
              f"CUDA available: {torch.cuda.is_available()}): on the host, offload "
              "degrades to save and there is nothing to measure", file=sys.stderr)
        return 2
    result = bench_offload.run_offload(
        device=device, size=args.size or ("tiny" if args.quick else "medium"),
        repeat=args.repeat or (3 if args.quick else 20), progress=Progress(sys.stderr))
    result["command"] = command
    return _write_suite(args.out, "offload", result, bench_offload.offload_markdown(result))


def _write_suite(out: str, stem: str, result: dict, text: str) -> int:
    """Write ``<stem>.json`` and ``<stem>.md`` (headed by the command) under
    ``out`` and print the markdown."""
    import json

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(f"`{result['command']}`\n\n{text}")
    print(text)
    return 0


# --- entry point -------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fxckpt",
        description="Automatic activation checkpointing for torch.compile.")
    subparsers = parser.add_subparsers(dest="command", required=True,
                                       metavar="COMMAND")
    add_demo(subparsers)
    add_bench(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The profiler that fxckpt.measure uses prints a line to stderr each time
    # it starts and stops unless told otherwise before its first use.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    args = build_parser().parse_args(argv)
    return args.run(args)

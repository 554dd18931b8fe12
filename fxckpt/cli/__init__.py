"""The ``fxckpt`` command line: it parses and dispatches.

``fxckpt demo`` (fxckpt/cli/demo.py) trains the built-in GPT three ways and
compares them; ``fxckpt bench`` (fxckpt/bench/) measures fxckpt side by side
with torch's own options. The subcommands import their modules when run.
"""

from __future__ import annotations

import argparse
import os

from fxckpt.bench.zoo import BENCH_MODEL_NAMES


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
                             "fraction 0..1 (0 the floor, 1 the runtime-optimal peak) "
                             "(default: the smallest budget fxckpt can meet)")
    parser.add_argument("--show-plans", action="store_true",
                        help="print fxckpt's plan for each compiled graph")
    parser.set_defaults(run=_run_demo)


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
            "measures CPU offload on a CUDA device; --suite compile times "
            "compiles, torch's and fxckpt's, as the GPT grows; --suite scratch "
            "checks each planned op's scratch memory against the memory model."))
    parser.add_argument("--suite", choices=("models", "solvers", "offload", "compile", "scratch"),
                        default="models",
                        help="models: the side-by-side table (default); solvers: "
                             "solve time on a ~10,000-node graph and the fast "
                             "solver against the ILP (the zoo at 5 budgets, the "
                             "compile suite's 8-layer GPT and tiny HF Llama and GPT-2 at 21); "
                             "offload: the GPT with matmul "
                             "outputs saved on the device vs offloaded to host "
                             "memory (needs CUDA); compile: first-step compile time "
                             "of a GPT, 4 to 64 layers, torch and fxckpt, with and "
                             "without a budget, in a first and a second process; "
                             "scratch: every op of the planned graphs run alone, its "
                             "scratch memory against the memory model's")
    parser.add_argument("--device", default=None,
                        help="where the models train: --suite offload needs CUDA "
                             "(default: cuda); models and scratch default to cuda "
                             "where there is one, else cpu")
    parser.add_argument("--model", action="append", choices=BENCH_MODEL_NAMES,
                        help="a model; repeat for several (default: the built-in "
                             "gpt, cnn and mlp; hf_gpt2 and hf_llama, tiny Hugging "
                             "Face configurations, need transformers)")
    parser.add_argument("--size", choices=("tiny", "small", "medium", "large"), default=None,
                        help="model size (default: small; tiny with --quick; large is "
                             "sized for a GPU: the GPT has GPT-2 small's shape, batch 8 "
                             "of 1,024 tokens)")
    parser.add_argument("--quick", action="store_true",
                        help="a CI-sized run: tiny models, 3 timed steps per row, no "
                             "Inductor rows; with --suite solvers a 12-layer GPT and "
                             "tiny models")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed steps per row, median reported (default: 15, "
                             "3 with --quick); with --suite compile, rounds of every "
                             "way's processes (default: 1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads while measuring (default: 1)")
    parser.add_argument("--inductor", action=argparse.BooleanOptionalAction, default=None,
                        help="add Inductor rows, for timing (default: on, off "
                             "with --quick)")
    parser.add_argument("--layers", type=int, action="append", default=None,
                        help="--suite solvers: layers of the deep GPT (default: 58, "
                             "about 10,000 joint-graph nodes; 12 with --quick); "
                             "--suite compile: the GPT's layers, repeat for several "
                             "(default: 4, 8, 16, 32, 64; 2 with --quick)")
    parser.add_argument("--all", action="store_true",
                        help="run every CPU suite in its quick configuration and write "
                             "benchmarks/results.json and BENCHMARKS.md from it")
    parser.add_argument("--from", dest="from_results", default=None, metavar="RESULTS",
                        help="with --all: render BENCHMARKS.md from this results file "
                             "without running anything")
    parser.add_argument("--out", default="bench-results",
                        help="directory for the results (default: ./bench-results)")
    parser.set_defaults(run=_run_bench)


def _run_demo(args: argparse.Namespace) -> int:
    from fxckpt.cli import demo

    return demo.run_demo(args)


def _run_bench(args: argparse.Namespace) -> int:
    from fxckpt.bench import command

    return command.run_bench(args)


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
    # The profiler that fxckpt.bench.measure uses prints a line to stderr each time
    # it starts and stops unless told otherwise before its first use.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    args = build_parser().parse_args(argv)
    return args.run(args)

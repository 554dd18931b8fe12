"""``fxckpt bench``'s suites as the command line runs them: the side-by-side
table (models), the solvers, offload, compile and scratch suites, each written
as JSON and markdown under ``--out``; ``--all`` hands over to
:mod:`fxckpt.bench.suites`."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from fxckpt.bench import compile as bench_compile
from fxckpt.bench import offload as bench_offload
from fxckpt.bench import report as bench_report
from fxckpt.bench import scratch as bench_scratch
from fxckpt.bench import run as bench
from fxckpt.bench import solvers as bench_solvers
from fxckpt.bench.measure import using_threads
from fxckpt.bench.run import Progress, machine
from fxckpt.models import MODEL_NAMES


def run_bench(args: argparse.Namespace) -> int:
    if args.all:
        return _run_all(args)
    command = _bench_command(args)
    if args.suite == "solvers":
        return _run_solvers(args, command)
    if args.suite == "offload":
        return _run_offload(args, command)
    if args.suite == "compile":
        return _run_compile(args, command)
    if args.suite == "scratch":
        return _run_scratch(args, command)
    overrides = {"models": tuple(args.model or MODEL_NAMES), "threads": args.threads,
                 "device": args.device or ("cuda" if torch.cuda.is_available() else "cpu")}
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


def _run_all(args: argparse.Namespace) -> int:
    from fxckpt.bench import suites
    if args.from_results:
        return suites.rerender(args.from_results)
    return suites.run_all(threads=args.threads)


def _bench_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, for the report."""
    words = ["fxckpt", "bench"]
    if args.suite != "models":
        words += ["--suite", args.suite]
    words += [f"--model {m}" for m in args.model or ()]
    words += ["--quick"] if args.quick else []
    words += [f"--layers {n}" for n in args.layers or ()]
    for flag, value, default in (("--size", args.size, None), ("--repeat", args.repeat, None),
                                 ("--threads", args.threads, 1),
                                 ("--device", args.device, None),
                                 ("--out", args.out, "bench-results")):
        if value != default:
            words.append(f"{flag} {value}")
    if args.inductor is not None:
        words.append("--inductor" if args.inductor else "--no-inductor")
    return " ".join(words)


def _run_solvers(args: argparse.Namespace, command: str) -> int:
    layers = args.layers[-1] if args.layers else (12 if args.quick else 58)
    with using_threads(args.threads):
        result = bench_solvers.run_solvers(
            n_layer=layers, models=tuple(args.model or MODEL_NAMES),
            size=args.size or ("tiny" if args.quick else "small"),
            compile_gpt_layers=2 if args.quick else 8,
            hf_models=() if args.quick else ("hf_llama", "hf_gpt2"),
            progress=Progress(sys.stderr))
    result.update(command=command, machine=machine(args.threads))
    return _write_suite(args.out, "solvers", result, bench_solvers.solvers_markdown(result))


def _run_offload(args: argparse.Namespace, command: str) -> int:
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


def _run_compile(args: argparse.Namespace, command: str) -> int:
    layers = tuple(args.layers or ((2,) if args.quick else bench_compile.LAYERS))
    compilers = ("aot_eager", "inductor") if args.inductor is not False else ("aot_eager",)
    if args.quick and args.inductor is None:
        compilers = ("aot_eager",)
    result = bench_compile.run_compile(layers=layers, compilers=compilers,
                                       threads=args.threads, repeat=args.repeat or 1,
                                       progress=Progress(sys.stderr))
    result.update(command=command, machine=machine(args.threads))
    return _write_suite(args.out, "compile", result, bench_compile.compile_markdown(result))


def _run_scratch(args: argparse.Namespace, command: str) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with using_threads(args.threads):
        result = bench_scratch.run_scratch(
            models=tuple(args.model or MODEL_NAMES), device=device,
            size=args.size or ("tiny" if args.quick else "small"),
            note=lambda line: print(line, file=sys.stderr))
    result.update(command=command, machine=machine(args.threads))
    return _write_suite(args.out, "scratch", result, bench_scratch.scratch_markdown(result))


def _write_suite(out: str, stem: str, result: dict, text: str) -> int:
    """Write ``<stem>.json`` and ``<stem>.md`` (headed by the command) under
    ``out`` and print the markdown."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(f"`{result['command']}`\n\n{text}")
    print(text)
    return 0

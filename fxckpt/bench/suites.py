"""``fxckpt bench --all``: runs the suites that make BENCHMARKS.md in one
sequence, keeps their results in one JSON file and renders the page from it."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time

import torch

from fxckpt.bench import compile as bench_compile
from fxckpt.bench import run as bench
from fxckpt.bench import scratch as bench_scratch
from fxckpt.bench import solvers as bench_solvers
from fxckpt.bench.measure import using_threads
from fxckpt.bench.page import render
from fxckpt.bench.run import Progress, machine
from fxckpt.models import MODEL_NAMES

COMMAND = "fxckpt bench --all"
RESULTS = os.path.join("benchmarks", "results.json")
PAGE = "BENCHMARKS.md"

# Each suite's configuration, sized so the whole run fits half an hour on two cores.
CONFIGS = {
    "models": "quick: tiny models, 3 timed steps per row, no Inductor rows",
    "solvers": "quick: a 12-layer GPT and the tiny built-in models, a 2-layer compiled GPT",
    "compile": "quick: a 2-layer GPT under aot_eager, one round",
    "scratch": "quick: the tiny built-in models",
}


def run_all(*, threads: int = 1, results: str = RESULTS, page: str = PAGE) -> int:
    """Run every CPU suite, writing the results file after each so a cut run keeps what ran."""
    found = header(threads)
    found["suites"] = {}
    started = time.perf_counter()
    for name, suite in SUITES.items():
        print(f"fxckpt bench --all: {name}", file=sys.stderr)
        found["suites"][name] = suite(threads)
        found["seconds"] = time.perf_counter() - started
        write(found, results=results, page=page)
    return 0


def rerender(results: str = RESULTS, page: str = PAGE) -> int:
    """Render ``page`` from a results file, running nothing."""
    with open(results) as f:
        found = json.load(f)
    write(found, results=None, page=page)
    return 0


def write(found: dict, *, results: str | None, page: str) -> None:
    """Write the results file (unless None) and the page rendered from the same dict."""
    if results:
        os.makedirs(os.path.dirname(results) or ".", exist_ok=True)
        with open(results, "w") as f:
            json.dump(found, f, indent=1, allow_nan=True)
            f.write("\n")
    with open(page, "w") as f:
        f.write(render(found))


def header(threads: int) -> dict:
    return {"command": COMMAND,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(threads), "versions": versions(),
            "cuda_available": torch.cuda.is_available(), "configs": dict(CONFIGS)}


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": _transformers_version(), "fxckpt": _commit()}


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "not installed"
    return transformers.__version__


def _commit() -> str:
    """The checkout's commit, so the page names the code that made it."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _models(threads: int) -> dict:
    config = bench.BenchConfig.quick_run(models=tuple(MODEL_NAMES), threads=threads)
    return bench.run_bench(config)


def _solvers(threads: int) -> dict:
    with using_threads(threads):
        result = bench_solvers.run_solvers(
            n_layer=12, models=tuple(MODEL_NAMES), size="tiny", compile_gpt_layers=2,
            hf_models=(), progress=Progress(sys.stderr))
    return dict(result, machine=machine(threads))


def _compile(threads: int) -> dict:
    result = bench_compile.run_compile(layers=(2,), compilers=("aot_eager",), threads=threads,
                                       repeat=1, progress=Progress(sys.stderr))
    return dict(result, machine=machine(threads))


def _scratch(threads: int) -> dict:
    with using_threads(threads):
        result = bench_scratch.run_scratch(models=tuple(MODEL_NAMES), device="cpu", size="tiny",
                                           note=lambda line: print(line, file=sys.stderr))
    return dict(result, machine=machine(threads))


SUITES = {"models": _models, "solvers": _solvers, "compile": _compile, "scratch": _scratch}

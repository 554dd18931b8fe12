"""BENCHMARKS.md as a pure function of ``fxckpt bench --all``'s results, so the
page can be re-rendered from the committed JSON and checked against it."""

from __future__ import annotations

from fxckpt.bench.compile import compile_markdown
from fxckpt.bench.report import model_markdown
from fxckpt.bench.scratch import scratch_markdown
from fxckpt.bench.solvers import solvers_markdown

TITLES = {"models": "Models: torch's checkpointing and fxckpt side by side",
          "solvers": "Solvers: the fast solver against the ILP",
          "compile": "Compile time",
          "scratch": "Scratch memory: ops the memory model undercounts"}

READING = {
    "models": (
        "Each built-in model trains every way torch offers to save activation memory "
        "(eager checkpoint per block, selective checkpointing, torch.compile's "
        "`activation_memory_budget` at 0.5, 0.25 and 0) and with fxckpt, all in this one "
        "process. Step time is the median of the timed steps (the calling thread's CPU time "
        "on one thread) as a multiple of the compiled step that saves everything "
        "(`compile, saves all`); recompute GFLOP and ms are counted while the step runs, "
        "every aten op priced by fxckpt's cost model, beyond the step of the same family "
        "that recomputes nothing. The second table gives fxckpt each torch budget row's "
        "measured peak as its budget: a ratio below 1 is fxckpt lower. The floor line is "
        "fxckpt's lowest plan against torch's lowest measured peak. Peaks, saved bytes "
        "and counted recompute are deterministic; step-time ratios move by 0.1 to 0.3 "
        "between runs on a shared machine."),
    "solvers": (
        "The deep GPT line times `solver=\"fast\"` on one large joint graph. The table "
        "compares the fast solver with the exact ILP on each graph at budgets `@p`, a "
        "fraction p of the way from the ILP's floor to the runtime-optimal peak: the cost "
        "columns are the recompute each plan pays (cost model ms), and \"fast vs ILP\" is "
        "how much more the fast plan recomputes (0% is optimal). Frontier seconds are "
        "planning alone, each solver's whole frontier (profile, tag, solve, rewrite and "
        "the simulation of every candidate), never tracing."),
    "compile": (
        "Four ways compile the same GPT: torch.compile by default and at an "
        "`activation_memory_budget`, fxckpt by default and at a budget. The ratio "
        "columns divide fxckpt's budgeted first step by torch's: below 1 is fxckpt "
        "faster. The planning column is the part of fxckpt's seconds spent planning; "
        "the second process starts from the cache its first left, so it shows what a "
        "warm cache saves."),
    "scratch": (
        "Every op of the planned graphs runs alone on the device while the allocator is "
        "watched; an op listed here held more temporary memory than the memory model "
        "counts for it, by more than the tolerance. \"none of N ops\" means the model "
        "covered every op of that model."),
}

_MARKDOWN = {"solvers": solvers_markdown, "compile": compile_markdown,
             "scratch": scratch_markdown}


def render(results: dict) -> str:
    """The whole page: header, one section per suite in ``results["suites"]``, CUDA."""
    lines = header_lines(results)
    for name in TITLES:
        lines += suite_lines(name, results)
    lines += cuda_lines(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def header_lines(results: dict) -> list[str]:
    m, v = results["machine"], results["versions"]
    seconds = results.get("seconds")
    rows = [("command", f"`{results['command']}`"), ("date", results["date"]),
            ("machine", f"{m['processor']}, {m['cpus']} CPUs, {m['threads']} torch "
                        f"thread(s) used"),
            ("platform", m["platform"]), ("python", v["python"]), ("torch", v["torch"]),
            ("transformers", v["transformers"]), ("fxckpt", f"commit {v['fxckpt']}"),
            ("wall time", "-" if seconds is None else f"{seconds / 60:.1f} min")]
    return ["# Benchmarks", "",
            f"This page is generated: `{results['command']}` runs the suites below, writes "
            "`benchmarks/results.json` and renders this file from it "
            "(`fxckpt bench --all --from benchmarks/results.json` re-renders without "
            "running). Every figure comes from that one run on this machine; ratios "
            "compare ways measured side by side in it.", "",
            "| | |", "|---|---|", *(f"| {k} | {val} |" for k, val in rows), "",
            *(f"- [{TITLES[name]}](#{anchor(TITLES[name])})" for name in TITLES),
            "- [CUDA](#cuda)", ""]


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def suite_lines(name: str, results: dict) -> list[str]:
    lines = [f"## {TITLES[name]}", ""]
    suite = results["suites"].get(name)
    if suite is None:
        return lines + ["Not part of this run.", ""]
    lines += [READING[name], "", f"Configuration: {results['configs'][name]}.", ""]
    if name == "models":
        for model in suite["models"]:
            lines += model_markdown(model)
        return lines
    return lines + [_MARKDOWN[name](suite).rstrip("\n"), ""]


def cuda_lines(results: dict) -> list[str]:
    ran = ("This page's run had a CUDA device" if results.get("cuda_available")
           else "This page's run had no CUDA device, so it holds no GPU figures")
    return ["## CUDA", "",
            f"{ran}; the suites above ran on the CPU. GPU figures are not carried over "
            "from runs of other code: they remain in this file's git history only. On a "
            "CUDA machine these commands measure what the CPU cannot (offload, the "
            "allocator's peaks, Inductor's GPU kernels):", "",
            "```sh",
            "fxckpt bench --device cuda --model gpt --size large --no-inductor --repeat 10",
            "fxckpt bench --suite offload --device cuda",
            "fxckpt bench --suite scratch --device cuda --size medium",
            "bash .ci/cuda          # CUDA tests, memory model against the allocator, "
            "offload, Inductor rows, scratch",
            "bash .ci/cuda_quick    # the same checks side by side within a short deadline",
            "```", ""]

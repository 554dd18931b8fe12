"""``fxckpt bench``: torch's ways of saving activation memory and fxckpt's,
side by side, measured in one process on the built-in models.

For each model every way (ways.ways) trains fresh copies of the same
weights on the same batch; bench.work measures each. fxckpt then gets,
as an absolute budget, the measured peak of each of torch's budgeted rows,
and its floor; the verdicts compare measured peak and counted recompute
cost at those matched budgets. Results go to bench.json, bench.md and
pareto.png (bench.report).
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from fxckpt.bench import work as bench_measure
from fxckpt.bench.measure import using_threads
from fxckpt.bench import ways as bench_ways
from fxckpt.bench.ways import EAGER, FXCKPT, TORCH, Step, Way
from fxckpt.errors import BudgetError
from fxckpt.bench.zoo import make_bench_model

SCHEMA = 1
# Row fields every row of bench.json carries (None where not applicable).
ROW_FIELDS = (
    "model", "key", "label", "family", "backend", "budget_bytes", "torch_budget",
    "budget_of", "skipped", "measured_peak_bytes", "saved_bytes", "predicted_peak_bytes",
    "step_seconds", "step_cpu_seconds", "step_time_ratio", "step_clock",
    "first_step_seconds", "compile_seconds", "partition_seconds", "solve_seconds", "recompute_flops", "recompute_cost",
    "planned_recompute_flops", "planned_recompute_cost", "loss_bitwise", "grads_bitwise",
    "max_abs_error", "grads_differing", "grads_total", "matches_eager", "graphs",
)


@dataclass(frozen=True)
class BenchConfig:
    models: tuple[str, ...] = ("gpt", "cnn", "mlp")
    size: str = "small"
    repeat: int = 15             # timed steps per row (median reported), at least
    min_seconds: float = 1.0     # and more until this long has been timed
    threads: int = 1
    inductor: bool = True        # add Inductor rows (timing only; slow to compile)
    quick: bool = False
    torch_budgets: tuple[float, ...] = (0.5, 0.25, 0.0)
    device: str = "cpu"

    @staticmethod
    def quick_run(**overrides) -> "BenchConfig":
        """Sized for CI: tiny models, three timed steps, no Inductor."""
        settings = dict(size="tiny", repeat=3, min_seconds=0.0, inductor=False, quick=True)
        settings.update(overrides)
        return BenchConfig(**settings)


@dataclass
class ModelResult:
    model: str
    description: str
    rows: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    floor: dict = field(default_factory=dict)
    frontier: list[dict] = field(default_factory=list)
    modelled_step_cost: float = 0.0   # cost-model seconds of the reference step


def run_bench(config: BenchConfig, *, progress=None) -> dict:
    """Run every way on every model; return what bench.json holds."""
    progress = progress or Progress(sys.stderr)
    started = time.perf_counter()
    with using_threads(config.threads):
        models = [run_model(name, config, progress) for name in config.models]
    return {
        "schema": SCHEMA,
        "config": asdict(config),
        "machine": machine(config.threads, config.device),
        "seconds": time.perf_counter() - started,
        "columns": list(ROW_FIELDS),
        "models": [asdict(m) for m in models],
    }


def run_model(name: str, config: BenchConfig, progress, *,
              keys: tuple[str, ...] | None = None, sweep: bool = True) -> ModelResult:
    """Every way on one model, or only the ways named by ``keys`` and those
    they need (eager and the saves-all compiled step as references, the
    torch row whose peak an fxckpt row takes as budget). ``sweep`` adds
    fxckpt's frontier (fxckpt.pareto) for the plot."""
    from fxckpt.entry.pareto import pareto

    model, inputs, loss_fn = make_bench_model(name, size=config.size, device=config.device)
    result = ModelResult(name, describe(name, model, inputs))
    plan_ways = _selected(bench_ways.ways(inductor=config.inductor,
                                          torch_budgets=config.torch_budgets), keys)
    floor_needed = any(w.floor for w in plan_ways)
    progress.start(name, len(plan_ways) + sweep + floor_needed)
    if sweep:
        with progress.row("fxckpt frontier (pareto)"):
            swept = pareto(Step(model, loss_fn), *inputs, compiler="eager")
        result.frontier = [frontier_point(plan) for plan in swept.frontier]
        result.floor["pareto_floor_bytes"] = swept.floor_bytes
    floor = None
    if floor_needed:
        with progress.row("fxckpt floor (BudgetError)"):
            floor = floor_bytes(Step(model, loss_fn), inputs)
        result.floor["fxckpt_floor_bytes"] = floor
    measured: dict[str, bench_measure.Measured] = {}
    rows: dict[str, dict] = {}
    for way in plan_ways:
        with progress.row(way.label + f" [{way.backend}]") as note:
            budget = _budget_for(way, rows, floor)
            row, got = run_way(name, way, config, budget)
            rows[way.key], measured[way.key] = row, got
            note(_row_note(row))
    finish_rows(rows, measured, threads=config.threads, device=config.device)
    result.rows = list(rows.values())
    if "compile_save_all" in measured:
        result.modelled_step_cost = measured["compile_save_all"].cost
    result.comparisons = [compare_at_budget(rows[w.budget_of], rows[w.key])
                          for w in plan_ways if w.budget_of]
    if floor_needed:
        result.floor.update(floor_verdict(rows))
    return result


def _selected(all_ways: list[Way], keys) -> list[Way]:
    if keys is None:
        return all_ways
    by_key = {w.key: w for w in all_ways}
    unknown = sorted(set(keys) - set(by_key))
    if unknown:
        raise ValueError(f"unknown rows {unknown}; the rows are {list(by_key)}")
    wanted = {"eager", "compile_save_all", *keys}
    wanted |= {by_key[k].budget_of for k in keys if by_key[k].budget_of}
    return [w for w in all_ways if w.key in wanted]


def measure_rows(model: str, keys, *, size: str = "small", repeat: int = 3,
                 threads: int = 1, progress=None):
    """Run some rows of the bench table on one built-in model; returns a
    ``bench_report.Rows`` (the rows as in bench.json; shows as a table)."""
    from fxckpt.bench.report import Rows

    config = BenchConfig(models=(model,), size=size, repeat=repeat, min_seconds=0.0,
                         threads=threads, inductor=any("inductor" in k for k in keys))
    with using_threads(threads):
        result = run_model(model, config, progress or Progress(None), keys=tuple(keys),
                           sweep=False)
    return Rows([row for row in result.rows if row["key"] in keys])


def run_way(name: str, way: Way, config: BenchConfig, budget: int | None):
    """Train one way on a fresh copy of the model; return its row and its
    Measured (None when it could not run, the reason in the row)."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(model=name, key=way.key, label=way.label, family=way.family,
               backend=way.backend, torch_budget=way.torch_budget, budget_of=way.budget_of,
               budget_bytes=budget, skipped="")
    if way.family == FXCKPT and (way.budget_of or way.floor) and budget is None:
        row["skipped"] = "no budget: the row it takes its budget from did not run"
        return row, None
    model, inputs, loss_fn = make_bench_model(name, size=config.size, device=config.device)
    built = bench_ways.build(way, Step(model, loss_fn), budget_bytes=budget)
    try:
        got = bench_measure.measure_way(built.run, model, inputs, repeat=config.repeat,
                                        min_seconds=config.min_seconds, scope=built.scope,
                                        device=config.device)
    except BudgetError as refused:  # a budget fxckpt refuses is a result
        row["skipped"] = (f"BudgetError: fxckpt's floor is {refused.floor_bytes} bytes, "
                          f"above the budget of {budget}")
        return row, None
    row.update(measured_peak_bytes=got.peak_bytes, saved_bytes=got.saved_bytes,
               step_seconds=got.step_seconds, step_cpu_seconds=got.step_cpu_seconds,
               first_step_seconds=got.first_step_seconds)
    if way.family != EAGER:
        row["compile_seconds"] = max(0.0, got.first_step_seconds - got.step_seconds)
    if built.partition_seconds:
        row["partition_seconds"] = sum(built.partition_seconds)
    if built.plans:
        row.update(
            graphs=len(built.plans),
            predicted_peak_bytes=max(p.peak_bytes for p in built.plans),
            partition_seconds=sum(p.plan_seconds for p in built.plans),
            solve_seconds=sum(p.solve_seconds for p in built.plans),
            planned_recompute_flops=sum(p.recompute_flops for p in built.plans),
            planned_recompute_cost=sum(p.recompute_cost for p in built.plans))
    return row, got


def finish_rows(rows: dict[str, dict], measured: dict, *, threads: int,
                device: str = "cpu") -> None:
    """Fill what needs other rows: correctness against eager, step time
    against the no-checkpoint compiled step, and recompute as the work done
    beyond the step that recomputes nothing in the same family (eager rows
    against eager, compiled rows against the compiled save-all step).

    On the CPU with one thread, step times compare the calling thread's
    CPU time, which other processes on a shared machine do not inflate;
    with more threads, or on a GPU (where the thread waits for the
    device), wall-clock time to the device's end of the step."""
    eager, reference = measured.get("eager"), measured.get("compile_save_all")
    thread_clock = threads == 1 and torch.device(device).type == "cpu"
    clock = "thread CPU" if thread_clock else "wall"
    for key, row in rows.items():
        got = measured.get(key)
        if got is None:
            continue
        if eager is not None:
            row.update(bench_measure.compare(got, eager))
        if reference is not None:
            row["step_clock"] = clock
            row["step_time_ratio"] = (
                got.step_cpu_seconds / reference.step_cpu_seconds if thread_clock
                else got.step_seconds / reference.step_seconds)
        base = eager if row["family"] == EAGER else reference
        if base is not None and row["backend"] != "inductor" and "inductor" not in row["backend"]:
            row["recompute_flops"] = got.flops - base.flops
            row["recompute_cost"] = got.cost - base.cost


def compare_at_budget(torch_row: dict, fx_row: dict) -> dict:
    """fxckpt given torch's measured peak as its budget: is its measured
    peak no higher, and its counted recompute cost no higher? Under
    Inductor, whose kernels the work counter cannot see into, the cost is
    the measured step time instead."""
    out = {"torch_key": torch_row["key"], "fxckpt_key": fx_row["key"],
           "budget_bytes": fx_row["budget_bytes"],
           "torch_peak_bytes": torch_row["measured_peak_bytes"],
           "fxckpt_peak_bytes": fx_row["measured_peak_bytes"],
           "torch_recompute_cost": torch_row["recompute_cost"],
           "fxckpt_recompute_cost": fx_row["recompute_cost"],
           "torch_step_time_ratio": torch_row["step_time_ratio"],
           "fxckpt_step_time_ratio": fx_row["step_time_ratio"]}
    if fx_row["skipped"] or torch_row["skipped"]:
        out.update(peak_ratio=None, cost_ratio=None, peak_ok=False, cost_ok=False,
                   verdict=f"behind: {fx_row['skipped'] or torch_row['skipped']}")
        return out
    peak_ratio = out["fxckpt_peak_bytes"] / out["torch_peak_bytes"]
    peak_ok = out["fxckpt_peak_bytes"] <= out["torch_peak_bytes"]
    if out["fxckpt_recompute_cost"] is None or out["torch_recompute_cost"] is None:
        cost_ratio = fx_row["step_seconds"] / torch_row["step_seconds"]
        cost_ok, cost = cost_ratio <= 1.0, "step time"
    else:
        cost_ratio = _ratio(out["fxckpt_recompute_cost"], out["torch_recompute_cost"])
        cost_ok = out["fxckpt_recompute_cost"] <= out["torch_recompute_cost"] + _COST_SLACK
        cost = "recompute cost"
    out.update(peak_ratio=peak_ratio, cost_ratio=cost_ratio, cost_basis=cost,
               peak_ok=peak_ok, cost_ok=cost_ok,
               verdict=_verdict(peak_ok, cost_ok, peak_ratio, cost_ratio, cost))
    return out


# Costs below this (1 ns of modelled work) are equal: counting noise.
_COST_SLACK = 1e-9


def _ratio(a, b):
    if a is None or b is None:
        return None
    if abs(b) <= _COST_SLACK:
        return 1.0 if abs(a) <= _COST_SLACK else math.inf
    return a / b


def _verdict(peak_ok: bool, cost_ok: bool, peak_ratio: float, cost_ratio,
             basis: str = "recompute cost") -> str:
    cost = "n/a" if cost_ratio is None else f"{cost_ratio:.2f}x"
    if peak_ok and cost_ok:
        return f"ahead: peak {peak_ratio:.2f}x, {basis} {cost} of torch's"
    misses = []
    if not peak_ok:
        misses.append(f"peak {peak_ratio:.3f}x torch's")
    if not cost_ok:
        misses.append(f"{basis} {cost} torch's")
    return "behind: " + ", ".join(misses)


def floor_verdict(rows: dict[str, dict]) -> dict:
    """fxckpt's floor against the lowest peak of torch's compiled rows that
    run as fxckpt's do (aot_eager; Inductor's fusions change what is
    allocated)."""
    torch_peaks = [r["measured_peak_bytes"] for r in rows.values()
                   if r["family"] == TORCH and r["backend"] != "inductor"
                   and r["measured_peak_bytes"] is not None]
    floor = rows.get("fxckpt_floor", {})
    got, lowest = floor.get("measured_peak_bytes"), min(torch_peaks, default=None)
    if got is None or lowest is None:
        return {"torch_lowest_peak_bytes": lowest, "fxckpt_floor_peak_bytes": got,
                "ratio": None, "ok": False, "verdict": "n/a: a row did not run"}
    ok = got < lowest
    standing = "ahead" if ok else "tie (not below)" if got == lowest else "behind"
    return {"torch_lowest_peak_bytes": lowest, "fxckpt_floor_peak_bytes": got,
            "ratio": got / lowest, "ok": ok,
            "verdict": f"{standing}: fxckpt's floor peaks at {got / lowest:.3f}x torch's "
                       "lowest measured peak"}


def floor_bytes(step: torch.nn.Module, inputs, *, compiler: str = "eager") -> int | None:
    """fxckpt's floor, as BudgetError names it at a 1-byte budget (None
    where that budget is met)."""
    from fxckpt.entry.explain import explain

    try:
        explain(step, *inputs, budget=1, compiler=compiler)
    except BudgetError as error:
        return error.floor_bytes
    return None


def frontier_point(plan) -> dict:
    return {"predicted_peak_bytes": plan.peak_bytes, "recompute_cost": plan.recompute_cost,
            "recompute_flops": plan.recompute_flops, "saved_bytes": plan.saved_bytes,
            "solver": plan.solver}


def _budget_for(way: Way, rows: dict[str, dict], floor: int | None) -> int | None:
    if way.floor:
        return floor
    if way.budget_of:
        return rows.get(way.budget_of, {}).get("measured_peak_bytes")
    return None


def _row_note(row: dict) -> str:
    if row["skipped"]:
        return f"skipped: {row['skipped']}"
    return f"peak {row['measured_peak_bytes'] / 2**20:.2f} MiB"


def describe(name: str, model: torch.nn.Module, inputs) -> str:
    params = sum(p.numel() for p in model.parameters())
    shapes = ", ".join("x".join(map(str, t.shape)) for t in inputs)
    if name == "gpt":
        c = model.config
        return (f"GPT, {c.n_layer} layers, n_embd {c.n_embd}, {c.n_head} heads, vocab "
                f"{c.vocab_size}, dropout {c.dropout:g}; input {shapes}; {params:,} parameters")
    if hasattr(model, "description"):
        return f"{model.description}; {params:,} parameters"
    return f"{type(model).__name__}, {len(model.blocks)} blocks; input {shapes}; " \
           f"{params:,} parameters"


def machine(threads: int, device: str = "cpu") -> dict:
    found = {"platform": platform.platform(), "processor": _cpu_name(),
             "cpus": os.cpu_count(), "threads": threads, "python": platform.python_version(),
             "torch": torch.__version__, "device": device}
    if torch.device(device).type == "cuda":
        found["device_name"] = torch.cuda.get_device_name(device)
        found["cuda"] = torch.version.cuda
    return found


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Progress:
    """Per-row progress lines: "[gpt  3/12] eager, checkpoint per block ... 1.2 s"."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.model, self.total, self.done = "", 0, 0

    def start(self, model: str, total: int) -> None:
        self.model, self.total, self.done = model, total, 0

    def row(self, label: str):
        return _ProgressRow(self, label)


class _ProgressRow:
    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label, self.extra = progress, label, ""

    def __enter__(self):
        p = self.progress
        p.done += 1
        self.start = time.perf_counter()
        if p.stream is not None:
            print(f"[{p.model} {p.done:>2}/{p.total}] {self.label} ...", end="",
                  file=p.stream, flush=True)
        return self._note

    def _note(self, text: str) -> None:
        self.extra = text

    def __exit__(self, kind, *_):
        p = self.progress
        if p.stream is not None:
            status = "failed" if kind else f"{time.perf_counter() - self.start:.1f} s"
            print(f" {status}" + (f"  {self.extra}" if self.extra else ""),
                  file=p.stream, flush=True)
        return False

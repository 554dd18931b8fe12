"""What ``fxckpt bench`` writes: bench.json, a markdown table (bench.md)
and the Pareto plot (pareto.png), from the dict ``bench.run_bench`` returns."""

from __future__ import annotations

import json
import math
import os

from fxckpt.options import format_bytes
from fxckpt.report.render import bytes_axis


_COLUMNS = ("way", "runs on", "budget", "peak", "saved", "predicted peak",
            "step time x", "recompute GFLOP", "recompute ms", "compile s",
            "partition / solve s", "loss + grads vs eager")


def write(result: dict, out: str, *, command: str) -> dict[str, str]:
    """Write bench.json, bench.md and pareto.png into ``out``; return their paths."""
    os.makedirs(out, exist_ok=True)
    paths = {name: os.path.join(out, name) for name in ("bench.json", "bench.md", "pareto.png")}
    result = dict(result, command=command)
    with open(paths["bench.json"], "w") as f:
        json.dump(result, f, indent=1, allow_nan=True)
    with open(paths["bench.md"], "w") as f:
        f.write(markdown(result))
    plot(result).savefig(paths["pareto.png"], dpi=120)
    return paths


# --- markdown ----------------------------------------------------------------

class Rows(list):
    """Rows of the bench table (dicts as in bench.json) that show as the
    markdown table in a notebook."""

    def _repr_markdown_(self) -> str:
        return "\n".join(rows_markdown(self))

    def __str__(self) -> str:
        return self._repr_markdown_()

    def by_key(self) -> dict[str, dict]:
        return {row["key"]: row for row in self}


def rows_markdown(rows) -> list[str]:
    return ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS),
            *("| " + " | ".join(_cells(row)) + " |" for row in rows)]


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"`{result.get('command', 'fxckpt bench')}` on {m['processor']} "
             f"({m['cpus']} CPUs, {m['threads']} thread(s)), torch {m['torch']}, "
             f"Python {m['python']}; {result['seconds']:.0f} s in all.", "",
             "Step time is the median of repeated steps (the calling thread's CPU time when "
             "running on one thread, wall-clock time otherwise), as a multiple of the "
             "compiled step that saves everything (`compile, saves all`). Recompute GFLOP "
             "and ms are counted while the step runs (every aten op priced by fxckpt's cost model) "
             "beyond the step of the same family that recomputes nothing: eager rows "
             "against eager, compiled rows against `compile, saves all`. fxckpt rows run "
             "their planned graphs as aot_eager runs torch's.", ""]
    for model in result["models"]:
        lines += model_markdown(model)
    return "\n".join(lines) + "\n"


def model_markdown(model: dict) -> list[str]:
    lines = [f"### {model['model']}: {model['description']}", "", *rows_markdown(model["rows"])]
    lines += ["", "fxckpt given each torch budget row's measured peak as its budget "
                  "(Inductor rows, whose kernels the work counter cannot see into, are "
                  "weighed by step time):", "",
              "| torch row | budget | torch peak | fxckpt peak | torch recompute ms "
              "| fxckpt recompute ms | step time x (torch / fxckpt) | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for c in model["comparisons"]:
        lines.append("| " + " | ".join((
            c["torch_key"], _mib(c["budget_bytes"]), _mib(c["torch_peak_bytes"]),
            _with_ratio(_mib(c["fxckpt_peak_bytes"]), c["peak_ratio"]),
            _ms(c["torch_recompute_cost"]),
            _with_ratio(_ms(c["fxckpt_recompute_cost"]),
                        c["cost_ratio"] if c.get("cost_basis") != "step time" else None),
            f"{_x(c['torch_step_time_ratio'])} / {_x(c['fxckpt_step_time_ratio'])}",
            c["verdict"])) + " |")
    floor = model["floor"]
    lines += ["", f"Floor: fxckpt's floor is {_mib(floor.get('fxckpt_floor_bytes'))} "
                  f"(BudgetError at a 1-byte budget); at it the measured peak is "
                  f"{_mib(floor.get('fxckpt_floor_peak_bytes'))} against torch's lowest "
                  f"measured peak {_mib(floor.get('torch_lowest_peak_bytes'))}: "
                  f"{floor.get('verdict')}.", ""]
    return lines


def _cells(row: dict) -> tuple[str, ...]:
    if row["skipped"]:
        return (row["label"], row["backend"], _budget(row), *(["-"] * 8), row["skipped"])
    flops = row["recompute_flops"]
    return (row["label"], row["backend"], _budget(row), _mib(row["measured_peak_bytes"]),
            _mib(row["saved_bytes"]), _mib(row["predicted_peak_bytes"]),
            _x(row["step_time_ratio"]), "-" if flops is None else f"{flops / 1e9:.3f}",
            _ms(row["recompute_cost"]), _s(row["compile_seconds"]),
            " / ".join(_s(row[k]) for k in ("partition_seconds", "solve_seconds")
                       if row[k] is not None) or "-",
            _match(row))


def _budget(row: dict) -> str:
    if row["torch_budget"] is not None:
        return f"{row['torch_budget']:g} (torch)"
    return _mib(row["budget_bytes"])


def _match(row: dict) -> str:
    if row["matches_eager"] is None:
        return "-"
    if row["matches_eager"]:
        return "bitwise"
    return (f"no: max error {row['max_abs_error']:.1e}, "
            f"{row['grads_differing']}/{row['grads_total']} grads differ")


def _mib(value) -> str:
    return "-" if value is None else format_bytes(value)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.3f}"


def _s(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _with_ratio(text: str, ratio) -> str:
    if ratio is None or text == "-":
        return text
    return f"{text} ({'inf' if math.isinf(ratio) else f'{ratio:.2f}'}x)"


# --- the Pareto plot ---------------------------------------------------------

_STYLE = {"eager": ("s", "#7f7f7f"), "torch": ("^", "#c55a11"), "fxckpt": ("o", "#1f4e79")}


def plot(result: dict):
    """Top row: measured peak against step time, one marker per row, with
    fxckpt's frontier (time estimated from its recompute cost). Bottom row:
    measured peak against counted recompute cost, where fxckpt's frontier
    is its predicted peak and planned cost."""
    from matplotlib.figure import Figure

    models = result["models"]
    fig = Figure(figsize=(5.5 * len(models), 8.5), layout="constrained")
    axes = fig.subplots(2, len(models), squeeze=False)
    for column, model in enumerate(models):
        _panel(axes[0][column], model, time_axis=True)
        _panel(axes[1][column], model, time_axis=False)
    fig.suptitle("fxckpt bench: peak memory against step time (top) and recompute "
                 "cost (bottom)")
    return fig


def _panel(ax, model: dict, *, time_axis: bool) -> None:
    total = model["modelled_step_cost"] or 1.0
    frontier = sorted(model["frontier"], key=lambda p: p["predicted_peak_bytes"])
    ys = [1 + p["recompute_cost"] / total if time_axis else p["recompute_cost"] * 1e3
          for p in frontier]
    ax.plot([p["predicted_peak_bytes"] for p in frontier], ys, "-", color="#1f4e79",
            alpha=0.5, drawstyle="steps-post",
            label="fxckpt frontier" + (" (time from cost model)" if time_axis else ""))
    for row in model["rows"]:
        y = row["step_time_ratio"] if time_axis else row["recompute_cost"]
        if row["skipped"] or y is None or row["measured_peak_bytes"] is None:
            continue
        marker, colour = _STYLE[row["family"]]
        ax.plot([row["measured_peak_bytes"]], [y if time_axis else y * 1e3], marker,
                color=colour, markersize=7, alpha=0.8)
        ax.annotate(row["key"], (row["measured_peak_bytes"], y if time_axis else y * 1e3),
                    textcoords="offset points", xytext=(4, 3), fontsize=6)
    for family, (marker, colour) in _STYLE.items():
        ax.plot([], [], marker, color=colour, label=family)
    bytes_axis(ax.xaxis)
    ax.set_xlabel("peak MiB (measured; frontier: predicted)")
    ax.set_ylabel("step time x (saves-all compiled step = 1)" if time_axis
                  else "recompute cost, ms (counted; frontier: planned)")
    ax.set_title(model["model"])
    ax.legend(fontsize=7)


def plot_against_torch(sweeps: dict, rows, ax=None):
    """fxckpt's frontiers (``{label: ParetoSweep}``: predicted peak against
    planned recompute cost) with bench rows as markers (measured peak
    against counted recompute cost). Returns the Figure."""
    from fxckpt.report.render import new_axes

    fig, ax = new_axes(ax, size=(7, 4.5))
    for label, sweep in sweeps.items():
        plans = sweep.frontier
        ax.plot([p.peak_bytes for p in plans], [p.recompute_cost * 1e3 for p in plans],
                "o-", drawstyle="steps-post", markersize=4, label=f"fxckpt {label}")
    for row in rows:
        if row["skipped"] or row["recompute_cost"] is None:
            continue
        marker, colour = _STYLE[row["family"]]
        ax.plot([row["measured_peak_bytes"]], [row["recompute_cost"] * 1e3], marker,
                color=colour, markersize=8)
        ax.annotate(row["label"], (row["measured_peak_bytes"], row["recompute_cost"] * 1e3),
                    textcoords="offset points", xytext=(5, 3), fontsize=7)
    for family in sorted({row["family"] for row in rows}):
        marker, colour = _STYLE[family]
        ax.plot([], [], marker, color=colour, label=f"{family} (measured)")
    bytes_axis(ax.xaxis)
    ax.set_xlabel("peak MiB (fxckpt: predicted; markers: measured)")
    ax.set_ylabel("recompute cost, ms (fxckpt: planned; markers: counted)")
    ax.legend(fontsize=7)
    return fig

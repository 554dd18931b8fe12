"""Renderings of a Plan and of a budget sweep: HTML for notebooks,
matplotlib figures, graphviz DOT text.

Figures are built on ``matplotlib.figure.Figure`` directly, not through
pyplot, so rendering never opens a window, needs no backend choice and
leaves pyplot's list of open figures alone; ``fig.savefig`` writes files.
"""

from __future__ import annotations

import html

from fxckpt.options import format_bytes
from fxckpt.planning.phases import describe_phases
from fxckpt.types import RNG_STATE_OP, Phase, is_recomputed_name, point

# What each action in a plan is drawn as (DOT fill colours).
ACTION_COLOURS = {
    "saved": "#8fd18f",        # green: kept from forward for backward
    "recomputed": "#f5a35c",   # orange: run in forward and again in backward
    "deferred": "#9cc3e6",     # blue: run once, in backward
    "offloaded": "#c39bd3",    # purple: moved off the device between passes
    "rng state": "#f2e17d",    # yellow: generator state for a replayed random op
}
_OTHER_COLOUR = "#eeeeee"


# --- text and HTML -----------------------------------------------------------

def plan_summary_rows(plan) -> list[tuple[str, str]]:
    """The head of ``str(plan)`` as (label, value) pairs, with offloaded
    values when there are any."""
    rows = [
        ("solver", f"{plan.solver}, {plan.solve_seconds * 1e3:.1f} ms"
         + (f", gap {plan.gap:.2%}" if plan.gap is not None else "")),
        ("budget", format_bytes(plan.budget_bytes) if plan.budget_bytes else "none"),
        ("saved", f"{format_bytes(plan.saved_bytes)} in {len(plan.saved)} values"),
        ("predicted peak", f"{format_bytes(plan.peak_bytes)} (at {plan.peak_at})"),
        ("deferred", f"{len(plan.deferred)} values (run once, in backward)"),
        ("recomputed", f"{len(plan.recomputed)} values, {plan.recompute_flops / 1e6:.2f} "
                       f"MFLOP, ~{plan.recompute_cost * 1e3:.3f} ms"),
    ]
    if plan.offloaded:
        bandwidth = (f" at {plan.offload_bandwidth / 1e9:.1f} GB/s"
                     if plan.offload_bandwidth else "")
        rows.insert(3, ("offloaded", f"{format_bytes(plan.offloaded_bytes)} in "
                                     f"{len(plan.offloaded)} values (host memory), "
                                     f"~{plan.offload_seconds * 1e3:.3f} ms of copies"
                                     f"{bandwidth}"))
    if plan.phase_seconds:
        rows.append(("planning", f"{plan.plan_seconds:.2f} s: "
                                 f"{describe_phases(plan.phase_seconds)}"))
    rows += [("note", note) for note in (*plan.notes, *plan.overrides)]
    return rows


def plan_html(plan) -> str:
    """An HTML table with the rows of ``str(plan)``: the summary, then one
    row per saved, recomputed and deferred value."""
    e = html.escape
    head = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td style='text-align:left'>"
                   f"{e(v)}</td></tr>" for k, v in plan_summary_rows(plan))
    columns = ("action", "value", "op", "bytes", "cost ms", "tag", "reason", "source")
    body = []
    for entry in plan.entries:
        colour = ACTION_COLOURS.get(entry.action, _OTHER_COLOUR)
        cells = (entry.action, entry.name, entry.op, format_bytes(entry.bytes),
                 f"{entry.cost * 1e3:.4f}", entry.tag, entry.reason, entry.source)
        body.append(f"<tr style='background:{colour}33'>"
                    + "".join(f"<td style='text-align:left'>{e(str(c))}</td>" for c in cells)
                    + "</tr>")
    table = ""
    if body:
        table = ("<table><thead><tr>"
                 + "".join(f"<th style='text-align:left'>{c}</th>" for c in columns)
                 + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")
    return (f"<div><b>fxckpt plan (graph {plan.graph_id})</b>"
            f"<table>{head}</table>{table}</div>")


def _sweep_cells(row) -> tuple[str, ...]:
    if not row.fits:
        return (_budget_text(row.budget_bytes), "-", "-", "-", "-", row.solver)
    return (_budget_text(row.budget_bytes), format_bytes(row.predicted_peak_bytes),
            f"{row.recompute_cost * 1e3:.3f}", f"{row.recompute_flops / 1e6:.2f}",
            format_bytes(row.saved_bytes), row.solver)


_SWEEP_COLUMNS = ("budget", "predicted peak", "recompute ms", "recompute MFLOP",
                  "saved", "solver")


def _budget_text(budget) -> str:
    return "none" if budget is None else format_bytes(budget)


def sweep_text(sweep) -> str:
    cells = [_SWEEP_COLUMNS] + [_sweep_cells(row) for row in sweep.rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_SWEEP_COLUMNS))]
    lines = [f"fxckpt pareto: {len(sweep.frontier)} frontier plans, floor "
             f"{format_bytes(sweep.floor_bytes)}, runtime-optimal peak "
             f"{format_bytes(sweep.runtime_optimal.peak_bytes)} ({sweep.seconds:.1f} s); "
             f"peaks from the {sweep.peaks_from}"]
    lines += ["  " + "  ".join(c.rjust(w) if i < 5 else c for i, (c, w) in
                               enumerate(zip(row, widths))) for row in cells]
    return "\n".join(lines)


def sweep_html(sweep) -> str:
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in _sweep_cells(row)) + "</tr>"
                   for row in sweep.rows)
    return (f"<div><b>fxckpt pareto</b>: {len(sweep.frontier)} frontier plans, floor "
            f"{e(format_bytes(sweep.floor_bytes))}, runtime-optimal peak "
            f"{e(format_bytes(sweep.runtime_optimal.peak_bytes))}; peaks from the "
            f"{e(sweep.peaks_from)}<table><thead><tr>"
            + "".join(f"<th>{c}</th>" for c in _SWEEP_COLUMNS)
            + f"</tr></thead><tbody>{rows}</tbody></table></div>")


class PlansTable:
    """Plans side by side (``{label: Plan}``), as text and as HTML."""

    COLUMNS = ("plan", "saved", "saved values", "recomputed", "deferred",
               "recompute MFLOP", "recompute ms", "predicted peak", "solver")

    def __init__(self, plans) -> None:
        self.plans = dict(plans)

    def cells(self) -> list[tuple[str, ...]]:
        return [(label, format_bytes(p.saved_bytes), str(len(p.saved)), str(len(p.recomputed)),
                 str(len(p.deferred)), f"{p.recompute_flops / 1e6:.2f}",
                 f"{p.recompute_cost * 1e3:.3f}", format_bytes(p.peak_bytes), p.solver)
                for label, p in self.plans.items()]

    def __str__(self) -> str:
        rows = [self.COLUMNS, *self.cells()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.COLUMNS))]
        return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(row, widths)))
                         for row in rows)

    def _repr_html_(self) -> str:
        e = html.escape
        return ("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in self.COLUMNS)
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                          for row in self.cells()) + "</tbody></table>")


def plans_table(plans) -> PlansTable:
    """``{label: Plan}`` side by side: saved bytes, recompute, predicted peak."""
    return PlansTable(plans)


# --- figures -----------------------------------------------------------------

def new_axes(ax=None, *, size=(8, 4)):
    """``ax`` and its figure, or a fresh figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def bytes_axis(axis) -> None:
    """Tick and label a matplotlib axis (ax.xaxis / ax.yaxis) that holds
    bytes at round numbers of MiB."""
    from matplotlib.ticker import FuncFormatter, Locator, MaxNLocator

    class MiBLocator(Locator):
        def __call__(self):
            low, high = self.axis.get_view_interval()
            return MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10]).tick_values(
                low / 2**20, high / 2**20) * 2**20

    axis.set_major_locator(MiBLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 2**20:g}"))


def memory_curve(plan) -> tuple[list[int], list[int], int]:
    """(x, live bytes, index of the peak) for plotting ``plan.timeline``.

    Timeline points are the bytes live after each node ran and freed what it
    no longer needs; the peak is the high-water mark inside the node at
    ``peak_at`` (with its scratch memory). That node gets two points, the
    peak and then the level after it, so the line's maximum is the peak."""
    xs, ys, peak_index = [], [], 0
    for index, (phase, name, live) in enumerate(plan.timeline.points):
        if point(phase, name) == plan.peak_at:
            peak_index = len(xs)
            xs.append(index)
            ys.append(plan.peak_bytes)
        xs.append(index)
        ys.append(live)
    return xs, ys, peak_index


def plot_memory(plan, ax=None):
    """Live bytes over the planned forward and backward schedule, with the
    budget (if any) and the peak marked. Returns the Figure."""
    if plan.timeline is None:
        raise ValueError("this plan has no memory timeline to plot")
    fig, ax = new_axes(ax)
    points = plan.timeline.points
    forward_end = sum(1 for phase, _, _ in points if phase == Phase.FORWARD)
    if forward_end:
        ax.axvspan(-0.5, forward_end - 0.5, color="#dbe9f6", label="forward")
    if forward_end < len(points):
        ax.axvspan(forward_end - 0.5, len(points) - 0.5, color="#fbe5d6", label="backward")
    xs, ys, peak_index = memory_curve(plan)
    ax.plot(xs, ys, color="#1f4e79", linewidth=1.2, label="live bytes")
    ax.plot([xs[peak_index]], [ys[peak_index]], "o", color="#c00000",
            label=f"peak {format_bytes(plan.peak_bytes)}")
    ax.annotate(plan.peak_at, (xs[peak_index], ys[peak_index]), textcoords="offset points",
                xytext=(4, 4), fontsize=7)
    if plan.budget_bytes:
        ax.axhline(plan.budget_bytes, color="#c00000", linestyle="--",
                   label=f"budget {format_bytes(plan.budget_bytes)}")
    ax.set_xlim(-0.5, max(len(points) - 0.5, 0.5))
    ax.set_ylim(bottom=0)
    bytes_axis(ax.yaxis)
    ax.set_xlabel("step in the schedule (forward, then backward)")
    ax.set_ylabel("live MiB (above the step's start)")
    ax.set_title(f"fxckpt plan, graph {plan.graph_id}: predicted memory")
    ax.legend(loc="upper left", fontsize=8)
    return fig


def plot_pareto(sweep, ax=None, *, label: str = "fxckpt frontier"):
    """Predicted peak (x) against recompute cost (y) of a ParetoSweep."""
    fig, ax = new_axes(ax, size=(6, 4))
    plans = sweep.frontier
    ax.plot([p.peak_bytes for p in plans], [p.recompute_cost * 1e3 for p in plans],
            "-", drawstyle="steps-post", color="#1f4e79", alpha=0.6, label=label)
    fitting = [row for row in sweep.rows if row.fits]
    ax.plot([r.predicted_peak_bytes for r in fitting],
            [r.recompute_cost * 1e3 for r in fitting], "o", color="#1f4e79",
            label="swept budgets")
    ax.axvline(sweep.floor_bytes, color="grey", linestyle=":",
               label=f"floor {format_bytes(sweep.floor_bytes)}")
    bytes_axis(ax.xaxis)
    ax.set_xlabel("predicted peak (MiB)")
    ax.set_ylabel("recompute cost (estimated ms)")
    ax.legend(fontsize=8)
    return fig


# --- graphviz ----------------------------------------------------------------

def to_dot(plan, *, planned_only: bool = False) -> str:
    """The planned schedule as graphviz DOT source.

    One cluster per phase, nodes in the order they run, chained by schedule
    edges; saved values are green, recomputed ones orange (in forward and as
    their clones in backward), deferred ones blue, offloaded ones purple,
    saved RNG states yellow, everything else grey. ``planned_only`` keeps
    only the values the plan acted on. A Plan keeps names, not data flow,
    so edges show order, not which value reads which."""
    action = {entry.name: RNG_STATE_OP if entry.op == RNG_STATE_OP else entry.action
              for entry in plan.entries}
    lines = [f'digraph "fxckpt_plan_{plan.graph_id}" {{', "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", '
             f'fontsize=10, fillcolor="{_OTHER_COLOUR}"];']
    for phase in Phase:
        names = [name for p, name, _ in plan.timeline.points if p == phase] \
            if plan.timeline is not None else []
        drawn = []
        lines.append(f'  subgraph "cluster_{phase}" {{')
        lines.append(f'    label="{phase}";')
        for name in names:
            kind = _node_kind(name, phase, action)
            if planned_only and kind is None:
                continue
            drawn.append(name)
            node_id = point(phase, name)
            attrs = f'label="{_dot_escape(name)}"'
            if kind is not None:
                attrs += f', fillcolor="{ACTION_COLOURS[kind]}", tooltip="{kind}"'
            lines.append(f'    "{_dot_escape(node_id)}" [{attrs}];')
        for a, b in zip(drawn, drawn[1:]):
            lines.append(f'    "{_dot_escape(phase + ":" + a)}" -> '
                         f'"{_dot_escape(phase + ":" + b)}" [color="#999999"];')
        lines.append("  }")
    lines.append("  subgraph cluster_legend {")
    lines.append('    label="legend";')
    for kind, colour in ACTION_COLOURS.items():
        lines.append(f'    "legend:{kind}" [label="{kind}", fillcolor="{colour}"];')
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _node_kind(name: str, phase: str, action: dict[str, str]) -> str | None:
    """How to colour node ``name`` of ``phase``: a saved value keeps its
    colour as backward's input, a recompute clone is coloured as recomputed."""
    if phase == Phase.BACKWARD and is_recomputed_name(name):
        return "recomputed"
    return action.get(name)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def render_dot(dot: str, path: str, *, format: str = "svg") -> str | None:
    """Render DOT source to ``path`` with the graphviz package; return the
    written file's path, or None when graphviz (the package or its ``dot``
    program) is not available."""
    try:
        import graphviz
    except ImportError:
        return None
    try:
        return graphviz.Source(dot).render(outfile=path, format=format, cleanup=True)
    except graphviz.ExecutableNotFound:
        return None

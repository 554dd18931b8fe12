"""Plain data passed between the stages: Profile -> Tags -> Decision -> Plan.

Nothing here holds an ``fx.Node``: every value is keyed by node name, so a stage
can be tested with data made by hand and printed without a graph.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Mapping

from torch.utils.checkpoint import CheckpointPolicy

from .options import format_bytes

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class NodeProfile:
    """What the planner needs to know of one value of the joint graph."""

    name: str
    op: str                      # printable target, e.g. "aten.mm.default"
    phase: str                   # FORWARD or BACKWARD
    inputs: tuple[str, ...]      # names of the nodes this one reads
    bytes: int                   # bytes this node allocates (0 for views, non-tensors)
    storage: str                 # name of the node whose allocation this value lives in
    flops: int = 0
    cost: float = 0.0            # estimated seconds to compute (flops + memory traffic)
    is_input: bool = False       # a placeholder (primal or tangent)
    is_static: bool = False      # a parameter or buffer: alive for the whole step anyway
    # An input the step mutates in place (a BatchNorm running stat): it can be
    # neither saved (autograd's version check would fail) nor read by a recompute.
    is_mutated_input: bool = False
    is_tensor: bool = True
    device: str = ""             # device type of the value ("cpu", "cuda", ...)
    is_symbolic: bool = False    # a SymInt/SymFloat/SymBool (or plain number) value
    is_view: bool = False
    is_pointwise: bool = False
    is_random: bool = False
    replay_bytes: int = 0        # generator state saved if this random op is recomputed
    workspace: int = 0           # scratch bytes the op holds while it runs
    is_compute_intensive: bool = False
    # Why this value cannot be recomputed ("" when it can).
    not_recomputable: str = ""
    source: str = ""             # the user's source line that produced this op
    module_path: str = ""        # e.g. "blocks.0.attn" from nn_module_stack
    # The module whose forward op this node belongs to: module_path, or, for
    # nodes AOTAutograd adds for backward, the module of the op they serve
    # (fwd_nn_module_stack); "" when the graph records neither.
    owner_module_path: str = ""

    @property
    def recomputable(self) -> bool:
        return not self.not_recomputable


@dataclass(frozen=True)
class Profile:
    """The joint graph as numbers. ``nodes`` is in graph (topological) order."""

    nodes: Mapping[str, NodeProfile]
    # Forward values read directly by a backward node, or returned to backward's
    # caller: the values the backward needs, saved or recomputed.
    needed_by_backward: frozenset[str]
    forward_outputs: tuple[str, ...]
    backward_outputs: tuple[str, ...]

    def forward_nodes(self) -> list[NodeProfile]:
        return [n for n in self.nodes.values() if n.phase == FORWARD]

    def storage_bytes(self, names) -> int:
        """Bytes held by ``names``, counting each storage once and no static input."""
        seen: dict[str, int] = {}
        for name in names:
            owner = self.nodes[self.nodes[name].storage]
            if not owner.is_static:
                seen[owner.name] = owner.bytes
        return sum(seen.values())


@dataclass(frozen=True)
class Tag:
    policy: CheckpointPolicy | None   # None: no preference, the solver decides
    reason: str                       # why, in words
    # Who asked: "op" (what the op allows), "region" (a checkpoint region in the
    # model), "policy" (the policy option) or "default". Default preferences are
    # hints the planner may trade for fewer saved bytes; the others are followed
    # unless a budget forces otherwise.
    origin: str = "default"


Tags = Mapping[str, Tag]


@dataclass(frozen=True)
class Decision:
    """The solver's answer, before rewriting: which forward values backward gets
    saved, and which it recomputes."""

    saved: frozenset[str]
    recomputed: frozenset[str]
    solver: str
    solve_seconds: float = 0.0
    gap: float | None = None          # relative optimality gap (0 = proven optimal)
    overrides: tuple[str, ...] = ()   # PREFER_* tags the budget overrode, with reasons
    budget_bytes: int | None = None   # the budget it was solved for, resolved to bytes
    # Saved values kept in host memory between forward and backward.
    offloaded: frozenset[str] = frozenset()
    # Bytes per second one way between device and host that priced offload
    # (None when nothing could be offloaded).
    offload_bandwidth: float | None = None


@dataclass(frozen=True)
class PlanEntry:
    name: str
    action: str        # "saved", "offloaded", "recomputed" or "deferred"
    op: str
    bytes: int
    cost: float
    flops: int
    tag: str
    reason: str
    source: str


@dataclass(frozen=True)
class Plan:
    """What a graph saves and recomputes, why, and what it costs."""

    saved: tuple[str, ...]
    recomputed: tuple[str, ...]   # forward values run in forward and again in backward
    deferred: tuple[str, ...]     # forward-side values only backward needs: run once, there
    saved_bytes: int            # activation bytes held between forward and backward
    peak_bytes: int             # predicted peak of non-parameter memory, fwd + bwd
    peak_at: str                # the node at which that peak happens
    recompute_flops: int
    recompute_cost: float       # estimated seconds of extra work in backward
    solver: str
    solve_seconds: float
    budget_bytes: int | None
    entries: tuple[PlanEntry, ...] = ()
    overrides: tuple[str, ...] = ()
    gap: float | None = None
    graph_id: int = 0
    notes: tuple[str, ...] = field(default=())
    timeline: object = None     # memory.MemoryTimeline of the planned schedule
    plan_seconds: float = 0.0   # profile + tag + solve + rewrite, wall time
    offloaded: tuple[str, ...] = ()   # saved values kept in host memory meanwhile
    offloaded_bytes: int = 0
    offload_seconds: float = 0.0      # their copies out and back, at offload_bandwidth
    offload_bandwidth: float | None = None   # bytes per second one way

    def __repr__(self) -> str:
        return (f"Plan(graph={self.graph_id}, solver={self.solver!r}, "
                f"saved={len(self.saved)} values / {self.saved_bytes} B, "
                f"recomputed={len(self.recomputed)}, peak={self.peak_bytes} B at "
                f"{self.peak_at!r}, budget={self.budget_bytes})")

    def __str__(self) -> str:
        from .render import plan_summary_rows

        lines = [f"fxckpt plan (graph {self.graph_id})"]
        for label, value in plan_summary_rows(self):
            lines.append(f"  note: {value}" if label == "note" else f"  {label:<14} {value}")
        if self.entries:
            header = f"  {'action':<10} {'value':<28} {'op':<34} {'bytes':>11} {'cost ms':>8}  {'tag':<18} reason"
            lines += ["", header, "  " + "-" * (len(header) + 10)]
            for e in self.entries:
                lines.append(
                    f"  {e.action:<10} {e.name[:28]:<28} {e.op[:34]:<34} "
                    f"{format_bytes(e.bytes):>11} {e.cost * 1e3:>8.4f}  {e.tag[:18]:<18} {e.reason}"
                    + (f"  [{e.source}]" if e.source else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from .render import plan_html

        return plan_html(self)

    def plot_memory(self, ax=None):
        """Live bytes over the planned forward and backward schedule, with the
        budget and the peak marked: a matplotlib Figure (see fxckpt.render)."""
        from .render import plot_memory

        return plot_memory(self, ax=ax)

    def to_dot(self, path: str | None = None, *, planned_only: bool = False) -> str:
        """Graphviz DOT source of the planned schedule, saved / recomputed /
        deferred / offloaded values coloured. With ``path``, also rendered
        there (SVG) when the graphviz package is installed."""
        from .render import render_dot, to_dot

        dot = to_dot(self, planned_only=planned_only)
        if path is not None:
            render_dot(dot, path)
        return dot

    # --- comparing plans across processes (ranks) ---------------------------

    @property
    def fingerprint(self) -> str:
        """A hex digest of what this plan decides: which values are saved,
        offloaded, recomputed or deferred, each entry's op and bytes, and the
        predicted saved and peak bytes. Two processes that plan alike get the
        same digest: it is sha256 over JSON, not Python's ``hash()`` (salted per
        process for strings), and leaves out timings, the solver's gap and the
        graph id (a per-process counter)."""
        decided = {
            "saved": self.saved, "offloaded": self.offloaded,
            "recomputed": self.recomputed, "deferred": self.deferred,
            "entries": [(e.action, e.name, e.op, e.bytes) for e in self.entries],
            "saved_bytes": self.saved_bytes, "offloaded_bytes": self.offloaded_bytes,
            "peak_bytes": self.peak_bytes,
        }
        text = json.dumps(decided, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

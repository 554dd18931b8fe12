"""What a graph saves and recomputes, why, and what it costs: the Plan, made
from a profiled, tagged graph, the solver's Decision and the rewrite
(``make_plan``); one Plan for the several graphs of a split model
(``merge_plans``); a digest two processes can compare (``Plan.fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.report import render
from fxckpt.options import format_bytes
from fxckpt.solve.common import run_in_forward
from fxckpt.types import RNG_STATE_OP, Action, Decision, Profile, Tag


@dataclass(frozen=True)
class PlanEntry:
    name: str
    action: Action
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
    # plan_seconds by phase, (phase, seconds) in pipeline order (fxckpt/planning/phases.py)
    phase_seconds: tuple[tuple[str, float], ...] = ()
    offloaded: tuple[str, ...] = ()   # saved values kept in host memory meanwhile
    offloaded_bytes: int = 0
    offload_seconds: float = 0.0      # their copies out and back, at offload_bandwidth
    # Where peak_bytes was read from the compiled code (fxckpt/memory/compiled_peak.py):
    # the memory model's figure for the same plan; None otherwise.
    model_peak_bytes: int | None = None
    offload_bandwidth: float | None = None   # bytes per second one way
    # Recomputed values backward computes more than once, with how many
    # times (Decision.copy_steps).
    recomputed_again: tuple[tuple[str, int], ...] = ()

    def __repr__(self) -> str:
        return (f"Plan(graph={self.graph_id}, solver={self.solver!r}, "
                f"saved={len(self.saved)} values / {self.saved_bytes} B, "
                f"recomputed={len(self.recomputed)}, peak={self.peak_bytes} B at "
                f"{self.peak_at!r}, budget={self.budget_bytes})")

    def __str__(self) -> str:
        lines = [f"fxckpt plan (graph {self.graph_id})"]
        for label, value in render.plan_summary_rows(self):
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
        return render.plan_html(self)

    def plot_memory(self, ax=None):
        """Live bytes over the planned forward and backward schedule, with the
        budget and the peak marked: a matplotlib Figure (see fxckpt.report.render)."""
        return render.plot_memory(self, ax=ax)

    def to_dot(self, path: str | None = None, *, planned_only: bool = False) -> str:
        """Graphviz DOT source of the planned schedule, saved / recomputed /
        deferred / offloaded values coloured. With ``path``, also rendered
        there (SVG) when the graphviz package is installed."""
        dot = render.to_dot(self, planned_only=planned_only)
        if path is not None:
            render.render_dot(dot, path)
        return dot

    # --- comparing plans across processes (ranks) ---------------------------

    @property
    def fingerprint(self) -> str:
        """A hex digest of what this plan decides: which values are saved,
        offloaded, recomputed or deferred, each entry's op and bytes, and the
        predicted saved and peak bytes (the memory model's, also where the
        compiled code's peak replaced it, so a plan is recognised before it
        is compiled), and the values recomputed more than once, where there
        are any. Two processes that plan alike get the
        same digest: it is sha256 over JSON, not Python's ``hash()`` (salted per
        process for strings), and leaves out timings, the solver's gap and the
        graph id (a per-process counter)."""
        decided = {
            "saved": self.saved, "offloaded": self.offloaded,
            "recomputed": self.recomputed, "deferred": self.deferred,
            "entries": [(str(e.action), e.name, e.op, e.bytes) for e in self.entries],
            "saved_bytes": self.saved_bytes, "offloaded_bytes": self.offloaded_bytes,
            "peak_bytes": self.peak_bytes if self.model_peak_bytes is None
            else self.model_peak_bytes,
        }
        if self.recomputed_again:
            decided["recomputed_again"] = self.recomputed_again
        text = json.dumps(decided, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def make_plan(profile: Profile, tags: dict[str, Tag], decision: Decision, rewritten,
              timeline, *, budget_bytes: int | None, graph_id: int,
              seconds: float, phase_seconds: tuple[tuple[str, float], ...] = ()) -> Plan:
    saved = tuple(sorted(decision.saved, key=list(profile.nodes).index))
    # Of the forward values backward computes, those forward also ran are
    # recomputed; the rest (say a cos only sin's gradient reads) run once,
    # in backward, and cost nothing extra.
    in_forward = run_in_forward(profile, decision.saved)
    recomputed = tuple(n for n in profile.nodes if n in decision.recomputed and n in in_forward)
    deferred = tuple(n for n in profile.nodes
                     if n in decision.recomputed and n not in in_forward)
    entries = [_entry(profile, tags, name, Action.SAVED) for name in saved
               if profile.nodes[name].is_tensor and name not in decision.offloaded]
    entries += [_offloaded_entry(profile, tags, name, decision.offload_bandwidth)
                for name in saved if name in decision.offloaded]
    entries += [_entry(profile, tags, name, Action.RECOMPUTED) for name in recomputed]
    entries += [_entry(profile, tags, name, Action.DEFERRED) for name in deferred]
    entries += [PlanEntry(name, Action.SAVED, RNG_STATE_OP, rewritten.rng_state_bytes[name], 0.0, 0,
                          "-", "generator state a recomputed random op replays", "")
                for name in rewritten.rng_states]
    steps = dict(decision.copy_steps)
    again = tuple((n, 1 + len(steps[n])) for n in recomputed if n in steps)
    extra = [n for n, times in again for _ in range(times - 1)]
    notes = []
    if again:
        notes.append(f"{len(again)} value(s) recomputed more than once ({len(extra)} extra "
                     "copies): a copy is freed after an idle stretch and made again "
                     "when backward next needs it")
    if rewritten.rng_states:
        notes.append(f"{len(rewritten.rng_states)} random op(s) recomputed with their "
                     "RNG state replayed")
    return Plan(
        saved=saved + tuple(rewritten.rng_states),
        recomputed=recomputed,
        deferred=deferred,
        saved_bytes=saved_bytes_of(profile, decision, rewritten),
        offloaded=tuple(n for n in saved if n in decision.offloaded),
        offloaded_bytes=profile.storage_bytes(decision.offloaded),
        offload_seconds=_transfer_seconds(profile.storage_bytes(decision.offloaded),
                                          decision.offload_bandwidth),
        offload_bandwidth=decision.offload_bandwidth,
        peak_bytes=timeline.peak_bytes,
        peak_at=timeline.peak_at,
        recompute_flops=sum(profile.nodes[n].flops for n in (*recomputed, *extra)),
        recompute_cost=sum(profile.nodes[n].cost for n in (*recomputed, *extra)),
        recomputed_again=again,
        solver=decision.solver,
        solve_seconds=decision.solve_seconds,
        budget_bytes=budget_bytes,
        entries=tuple(entries),
        overrides=decision.overrides,
        gap=decision.gap,
        graph_id=graph_id,
        notes=tuple(notes),
        timeline=timeline,
        plan_seconds=seconds,
        phase_seconds=phase_seconds,
    )


def saved_bytes_of(profile: Profile, decision: Decision, rewritten) -> int:
    """Activation bytes a plan holds between forward and backward: the saved
    values kept on the device and the generator states random ops replay."""
    return (profile.storage_bytes(decision.saved - decision.offloaded)
            + sum(rewritten.rng_state_bytes.values()))


def _entry(profile: Profile, tags: dict[str, Tag], name: str, action: Action) -> PlanEntry:
    node = profile.nodes[name]
    tag = tags[name]
    owner = profile.nodes[node.storage]
    bytes_held = 0 if owner.is_static else owner.bytes
    return PlanEntry(name=name, action=action, op=node.op, bytes=bytes_held,
                     cost=node.cost, flops=node.flops,
                     tag=tag.policy.name if tag.policy is not None else "-",
                     reason=_reason(tag, action), source=node.source)


def _offloaded_entry(profile: Profile, tags: dict[str, Tag], name: str,
                     bandwidth: float | None) -> PlanEntry:
    """An offloaded value costs its copies to host and back."""
    entry = _entry(profile, tags, name, Action.OFFLOADED)
    return replace(entry, cost=_transfer_seconds(entry.bytes, bandwidth), flops=0)


def _transfer_seconds(nbytes: int, bandwidth: float | None) -> float:
    return 2.0 * nbytes / bandwidth if bandwidth else 0.0


def _reason(tag: Tag, action: Action) -> str:
    if action == Action.DEFERRED:
        return "only backward reads it: computed there, once"
    followed = {
        Action.SAVED: (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE),
        Action.OFFLOADED: (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD),
        Action.RECOMPUTED: (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE),
    }[action]
    if tag.policy in followed:
        return tag.reason
    if action == Action.SAVED:
        return "solver: holding it costs less than what recomputing it needs"
    return "solver: recomputed from saved values to hold fewer bytes"



def merge_plans(plans: list[Plan]) -> Plan:
    """Names are prefixed with their graph ("g1.addmm"); bytes, costs and
    FLOPs add up. The peak is the step's as the budget split reads it: while
    graph k runs, the graphs before it still hold what they saved."""
    held, peak, peak_at = 0, 0, ""
    for plan in plans:
        if held + plan.peak_bytes > peak:
            peak, peak_at = held + plan.peak_bytes, f"g{plan.graph_id}.{plan.peak_at}"
        held += plan.saved_bytes

    def names(attribute: str) -> tuple[str, ...]:
        return tuple(f"g{p.graph_id}.{n}" for p in plans for n in getattr(p, attribute))

    budgets = [p.budget_bytes for p in plans if p.budget_bytes is not None]
    return Plan(
        saved=names("saved"), recomputed=names("recomputed"), deferred=names("deferred"),
        offloaded=names("offloaded"),
        recomputed_again=tuple((f"g{p.graph_id}.{n}", times) for p in plans
                               for n, times in p.recomputed_again),
        saved_bytes=sum(p.saved_bytes for p in plans),
        offloaded_bytes=sum(p.offloaded_bytes for p in plans),
        peak_bytes=peak, peak_at=peak_at,
        recompute_flops=sum(p.recompute_flops for p in plans),
        recompute_cost=sum(p.recompute_cost for p in plans),
        solver="+".join(sorted({p.solver for p in plans})),
        solve_seconds=sum(p.solve_seconds for p in plans),
        budget_bytes=budgets[0] if budgets else None,
        entries=tuple(e for p in plans for e in p.entries),
        overrides=tuple(o for p in plans for o in p.overrides),
        graph_id=-1,
        notes=(f"{len(plans)} graphs (Dynamo split the model); names are prefixed "
               "with their graph",) + tuple(n for p in plans for n in p.notes),
        plan_seconds=sum(p.plan_seconds for p in plans),
        phase_seconds=_summed_phases(plans),
    )


def _summed_phases(plans: list[Plan]) -> tuple[tuple[str, float], ...]:
    total: dict[str, float] = {}
    for plan in plans:
        for phase, seconds in plan.phase_seconds:
            total[phase] = total.get(phase, 0.0) + seconds
    return tuple(total.items())

"""One Plan standing for the several graphs Dynamo split a model into."""

from __future__ import annotations

from .types import Plan


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
    )

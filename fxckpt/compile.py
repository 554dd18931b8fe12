"""``fxckpt.compile``: torch.compile with fxckpt's backend, and a checkpointed
eager fallback where Dynamo breaks a submodule's forward.

On the first call, before anything compiles:
1. one forward under Dynamo finds the graph breaks (``fallback.find_breaks``);
2. each submodule whose forward holds a break becomes a fallback region: its
   forward runs eagerly under ``fxckpt.checkpoint`` with the same policy;
3. the real step runs. Graphs compile as their forwards first run, so by
   the time a graph after a region compiles, the region's saved bytes have
   been measured, and a byte budget is shared: each graph is planned for
   the budget less what earlier graphs and regions hold.

``compiled.fxckpt_report`` says which modules fell back and why, what each
region and each graph saves, and the plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

from fxckpt.backend import Backend
from fxckpt.eager.fallback import (BreakSite, Ledger, Region, attribute, describe_frame, find_breaks,
                       outermost)
from fxckpt.options import Budget, Options, format_bytes
from fxckpt.plan import Plan


def compile(model: nn.Module, *, budget=None, policy=None, compiler: str = "inductor",
            solver: str = "auto", offload_bandwidth=None) -> "CompiledModule":
    """``torch.compile(model, backend=fxckpt.backend(...))``, and the
    submodules whose forward Dynamo cannot compile in one graph run under
    ``fxckpt.checkpoint`` with the same ``policy``. Options are those of
    ``fxckpt.backend``; a byte budget covers the compiled graphs and the
    eager regions together."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxckpt.compile takes an nn.Module, got {type(model).__name__}; "
                        "for a function use torch.compile(fn, backend=fxckpt.backend(...))")
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth)
    fallback = Fallback(model, options)
    compiled = torch.compile(model, backend=fallback.backend)
    return CompiledModule(model, compiled.dynamo_ctx, fallback)


class CompiledModule(OptimizedModule):
    """What ``torch.compile`` returns, plus the fallback: regions are found
    on the first call, and ``fxckpt_report`` describes them and the plans."""

    _fxckpt: "Fallback | None" = None

    def __init__(self, mod: nn.Module, dynamo_ctx, fallback: "Fallback | None" = None) -> None:
        super().__init__(mod, dynamo_ctx)
        self._fxckpt = fallback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fallback = self._fxckpt
        if fallback is None:  # unpickled: a plain compiled module
            return super().__call__(*args, **kwargs)
        fallback.prepare(args, kwargs)
        with fallback.ledger.step():
            return super().__call__(*args, **kwargs)

    @property
    def fxckpt_report(self) -> "FallbackReport":
        if self._fxckpt is None:
            raise RuntimeError("this module was unpickled; its fxckpt report is gone")
        return self._fxckpt.report()


@dataclass(frozen=True)
class GraphRecord:
    """One graph the backend compiled: the frame Dynamo compiled it from,
    the line where it ended and why, and its plan (None without backward)."""

    frame: str
    ended_by: str
    plan: Plan | None


@dataclass(frozen=True)
class RegionRecord:
    module: str
    module_type: str
    breaks: tuple[BreakSite, ...]
    saved_bytes: int | None       # measured on the first step with grad
    calls: int
    enclosed_calls: int           # calls inside an enclosing checkpoint, left to it


@dataclass(frozen=True)
class FallbackReport:
    """Which modules fell back to eager checkpointing and why, what they
    hold, and the compiled graphs with their plans."""

    budget: Budget | None
    policy: Any
    regions: tuple[RegionRecord, ...]
    kept: tuple[BreakSite, ...]      # breaks left to the compiled graphs
    graphs: tuple[GraphRecord, ...]

    @property
    def plans(self) -> list[Plan]:
        return [g.plan for g in self.graphs if g.plan is not None]

    @property
    def fallback_modules(self) -> list[str]:
        return [r.module for r in self.regions]

    @property
    def region_bytes(self) -> int:
        return sum(r.saved_bytes or 0 for r in self.regions)

    @property
    def graph_bytes(self) -> int:
        return sum(p.saved_bytes for p in self.plans)

    def __str__(self) -> str:
        lines = [f"fxckpt.compile: {len(self.graphs)} compiled graph(s), "
                 f"{len(self.regions)} fallback region(s), budget "
                 f"{self.budget if self.budget is not None else 'none'}, "
                 f"policy {self.policy!r}",
                 f"  saved for backward: {format_bytes(self.graph_bytes)} by graphs + "
                 f"{format_bytes(self.region_bytes)} by fallback regions"]
        if self.regions:
            lines += ["", "fallback regions (eager, under fxckpt.checkpoint):"]
        for r in self.regions:
            if r.saved_bytes is not None:
                saved = f"saved {format_bytes(r.saved_bytes)} on the first step"
            elif r.calls and r.calls == r.enclosed_calls:
                saved = "ran inside an enclosing checkpoint, which keeps its activations"
            else:
                saved = "not run with grad yet"
            lines.append(f"  {r.module} ({r.module_type}): {saved}, {r.calls} call(s)")
            lines += [f"      break: {site.reason}  [{site.where}]" for site in r.breaks]
        if self.kept:
            lines += ["", "breaks left to the compiled graphs:"]
            lines += [f"  {site}" for site in self.kept]
        if self.graphs:
            lines += ["", "compiled graphs:"]
        for i, g in enumerate(self.graphs):
            plan = (f"saves {format_bytes(g.plan.saved_bytes)}, {len(g.plan.recomputed)} "
                    f"recomputed (plan graph {g.plan.graph_id}, {g.plan.solver})"
                    if g.plan is not None else "no backward")
            lines.append(f"  #{i} {g.frame}: {plan}; ended by {g.ended_by}")
        return "\n".join(lines)


class Fallback:
    """The state of one ``fxckpt.compile``'d model: its backend, regions and
    ledger, and the graphs compiled so far."""

    def __init__(self, model: nn.Module, options: Options) -> None:
        self.model = model
        self.options = options
        self.ledger = Ledger(budget=options.budget)
        self.backend = Backend(options,
                               reserved_bytes=self.ledger.held_bytes,
                               on_graph=self._record_graph)
        self.prepared = False
        self.regions: list[Region] = []
        self.kept: list[BreakSite] = []
        self.graphs: list[GraphRecord] = []

    def prepare(self, args: tuple, kwargs: dict) -> None:
        """Find the breaks with these inputs and wrap the regions (once)."""
        if self.prepared:
            return
        self.prepared = True
        sites = attribute(find_breaks(self.model, args, kwargs), self.model)
        self.kept = [s for s in sites if s.note]
        chosen = outermost([s.module for s in sites if not s.note])
        modules = dict(self.model.named_modules())
        for name in chosen:
            inside = [s for s in sites if not s.note
                      and (s.module == name or s.module.startswith(name + "."))]
            self.regions.append(Region(name, modules[name], inside, policy=self.options.policy,
                                       ledger=self.ledger, live=self.model))

    def _record_graph(self, gm: fx.GraphModule, plans: list[Plan]) -> None:
        reason = getattr(gm, "compile_subgraph_reason", None)
        stack = list(reason.user_stack) if reason is not None else []
        frame = describe_frame(stack[0], source=False) if stack else "?"
        ended_by = ("a graph break: " + reason.reason.strip().splitlines()[0]
                    if reason is not None and reason.graph_break else "return")
        self.graphs.append(GraphRecord(frame, ended_by, plans[0] if plans else None))

    def report(self) -> FallbackReport:
        regions = tuple(RegionRecord(r.name, r.module_type, tuple(r.breaks),
                                     self.ledger.bytes_of(r.name), r.calls, r.enclosed_calls)
                        for r in self.regions)
        return FallbackReport(self.options.budget, self.options.policy, regions,
                              tuple(self.kept), tuple(self.graphs))

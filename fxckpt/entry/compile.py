"""``fxckpt.compile``: torch.compile with fxckpt's backend, and a checkpointed
eager fallback where Dynamo breaks a submodule's forward.

On the first call, before anything compiles:
1. one forward under Dynamo finds the graph breaks (``fallback.find_breaks``);
2. each submodule whose forward holds a break becomes a fallback region: its
   forward runs eagerly under ``fxckpt.checkpoint`` with the user's policy,
   or less of it where the budget requires (below);
3. the real step runs. Graphs compile as their forwards first run, so by
   the time a graph after a region compiles, the region's saved bytes have
   been measured, and a byte budget is shared: each graph is planned for
   the budget less what earlier graphs and regions hold.

A region's policy (fxckpt/eager/region_policy.py) lies between its floor
(its inputs and the user's MUST saves; everything else recomputed) and the
user's policy:
- no budget, or a fraction of 1: the user's policy;
- a byte budget: the user's policy on the first step. Where that step is
  over the budget, the second step begins by planning regions and graphs
  together (``Backend.replan``, ``ledger.allocate_step``): regions move to
  their floor, the one that frees most first, only as far as the graphs
  cannot make room; BudgetError names the step's floor (regions and graphs
  at theirs) where nothing fits;
- a fraction f < 1: the floor on the first step; from the second, the
  user's first optional saves (in forward order) that keep it within f of
  the way from its floor to the user's policy (0: the floor).
A region whose policy changed is measured again on the step after.

``compiled.fxckpt_report`` says which modules fell back and why, what each
region and each graph saves, and the plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from fxckpt.compat.dynamo import OptimizedModule
from fxckpt.entry.backend import Backend, gradient_bytes
from fxckpt.eager.fallback import (BreakSite, Ledger, Region, attribute, describe_frame,
                                   find_breaks, outermost)
from fxckpt.eager.region_policy import RegionPolicy
from fxckpt.budget.ledger import LedgerEntry, RegionChoice
from fxckpt.options import Budget, Options, format_bytes
from fxckpt.report.plan import Plan


def compile(model: nn.Module, *, budget=None, policy=None, compiler: str = "inductor",
            solver: str = "auto", offload_bandwidth=None,
            mode: str | None = None) -> "CompiledModule":
    """``torch.compile(model, backend=fxckpt.backend(...))``, and the
    submodules whose forward Dynamo cannot compile in one graph run under
    ``fxckpt.checkpoint`` with ``policy``, or with less of it where the
    budget requires (the module docstring says how).

    Args:
        model: the ``nn.Module`` to train.
        budget, policy, compiler, solver, offload_bandwidth, mode: as
            ``fxckpt.backend``'s; a budget covers the compiled graphs and
            the eager regions together.

    Returns:
        A ``CompiledModule`` (a ``torch.compile`` module); its
        ``fxckpt_report`` lists the plans and the eager regions with why
        each runs with the policy it does.

    Example:
        >>> compiled = fxckpt.compile(model, budget="2GB")
        >>> loss_fn(compiled(x)).backward()
        >>> print(compiled.fxckpt_report)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fxckpt.compile takes an nn.Module, got {type(model).__name__}; "
                        "for a function use torch.compile(fn, backend=fxckpt.backend(...))")
    options = Options.create(budget=budget, policy=policy, compiler=compiler, solver=solver,
                             offload_bandwidth=offload_bandwidth, mode=mode)
    return compiled_with(model, options)


def compiled_with(model: nn.Module, options: Options) -> "CompiledModule":
    """``fxckpt.compile`` with its options read; what unpickling calls."""
    fallback = Fallback(model, options)
    compiled = torch.compile(model, backend=fallback.backend)
    return CompiledModule(model, compiled.dynamo_ctx, fallback)


class CompiledModule(OptimizedModule):
    """What ``torch.compile`` returns, plus the fallback: regions are found
    on the first call, and ``fxckpt_report`` describes them and the plans."""

    # A class attribute, so that OptimizedModule's __setattr__ keeps it here
    # rather than on the user's model.
    _fxckpt: "Fallback | None" = None

    def __init__(self, mod: nn.Module, dynamo_ctx, fallback: "Fallback") -> None:
        super().__init__(mod, dynamo_ctx)
        self._fxckpt = fallback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fallback = self._fxckpt
        fallback.prepare(args, kwargs)
        fallback.begin_step()
        with fallback.ledger.step():
            return super().__call__(*args, **kwargs)

    @property
    def fxckpt_report(self) -> "FallbackReport":
        return self._fxckpt.report()

    def __reduce__(self):
        """Pickled as its model and options, as torch.compile's modules are
        as their model and compile settings: the module unpickled compiles
        afresh, planning at its first step what this one planned at its."""
        return (compiled_with, (self._orig_mod, self._fxckpt.options))


@dataclass(frozen=True)
class GraphRecord:
    """One graph the backend compiled: the frame Dynamo compiled it from,
    the line where it ended and why, and its plan as it runs now (after the
    first step, a re-plan's; None without backward)."""

    frame: str
    ended_by: str
    plan: Plan | None


@dataclass(frozen=True)
class RegionRecord:
    """One fallback region: the policy it runs with and why, and what it
    holds, measured on the first step with grad and again on the step after
    its policy changed: as it ran, at its floor, with the user's policy."""

    module: str
    module_type: str
    breaks: tuple[BreakSite, ...]
    saved_bytes: int | None       # as it ran (None: not measured)
    calls: int
    enclosed_calls: int           # calls inside an enclosing checkpoint, left to it
    policy: str = ""
    why: str = ""
    floor_bytes: int | None = None
    policy_bytes: int | None = None


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
                saved = (f"saved {format_bytes(r.saved_bytes)} as measured (at its floor "
                         f"{format_bytes(r.floor_bytes)}, with the user's policy "
                         f"{format_bytes(r.policy_bytes)})")
            elif r.calls and r.calls == r.enclosed_calls:
                saved = "ran inside an enclosing checkpoint, which keeps its activations"
            else:
                saved = "not run with grad yet"
            lines.append(f"  {r.module} ({r.module_type}): {saved}, {r.calls} call(s)")
            lines.append(f"      policy: {r.policy}: {r.why}")
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
    ledger, and the graphs compiled so far. It is the backend's
    ``ledger.StepRegions``: the regions as the step's budget plans them."""

    def __init__(self, model: nn.Module, options: Options) -> None:
        self.model = model
        self.options = options
        self.backend = Backend(options, regions=self, on_graph=self._record_graph)
        self.ledger = Ledger(position=self._graph_runs)
        self.prepared = False
        self.settled = False          # the first step's choice of region policies made
        self.regions: list[Region] = []
        self.kept: list[BreakSite] = []
        self.graphs: list[tuple[str, str, LedgerEntry]] = []   # frame, ended by, entry
        self._planned: list[Region] = []

    def prepare(self, args: tuple, kwargs: dict) -> None:
        """Find the breaks with these inputs and wrap the regions (once)."""
        if self.prepared:
            return
        self.prepared = True
        sites = attribute(find_breaks(self.model, args, kwargs), self.model)
        self.kept = [s for s in sites if s.note]
        chosen = outermost([s.module for s in sites if not s.note])
        modules = dict(self.model.named_modules())
        choice, why = self._first_choice()
        for name in chosen:
            inside = [s for s in sites if not s.note
                      and (s.module == name or s.module.startswith(name + "."))]
            self.regions.append(Region(name, modules[name], inside, choice=choice, why=why,
                                       ledger=self.ledger, live=self.model))

    def _graph_runs(self) -> int:
        """A region's place in the step: how many graph runs came before it."""
        return len(self.backend.ledger.counting)

    def _first_choice(self) -> tuple[RegionPolicy, str]:
        user, budget = self.options.policy, self.options.budget
        if user is None:
            return RegionPolicy(None), "no policy was given"
        if budget is None:
            return RegionPolicy(user), "no budget"
        if budget.fraction is None:
            return RegionPolicy(user), ("a byte budget: the first step runs the user's "
                                        "policy, then the step is planned with it measured")
        if budget.fraction >= 1.0:
            return RegionPolicy(user), "budget fraction 1"
        if budget.fraction == 0.0:
            return RegionPolicy(user, keep=0), "budget fraction 0"
        return RegionPolicy(user, keep=0), (
            f"budget fraction {budget.fraction:g}: the floor on the first step, from the "
            "second as many optional saves as that fraction holds")

    def begin_step(self) -> None:
        """Before a step with grad: once the first has been measured, choose
        the regions' policies for the steps after it (see the module
        docstring); BudgetError where the step cannot fit its byte budget."""
        if self.settled or not self.ledger.measured or not torch.is_grad_enabled():
            return
        budget = self.backend.options.budget
        if budget is not None and budget.bytes is not None:
            before = [r.choice for r in self.regions]
            self.settled = True
            if not self.backend.step_ended():   # no backward yet: the next call
                self.settled = False
                return
            for region, choice in zip(self.regions, before):
                if region.choice is choice and choice.user is not None:
                    region.choose(choice, f"a byte budget of {format_bytes(budget.bytes)}: "
                                  "the first step fits it with the user's policy here")
            return
        self.settled = True
        if budget is not None and budget.fraction is not None and 0.0 < budget.fraction < 1.0:
            self._settle_fraction(budget.fraction)

    def _settle_fraction(self, fraction: float) -> None:
        for region in self.regions:
            measured = self.ledger.bytes_of(region.name)
            if measured is None or region.choice.user is None:
                continue
            keep = measured.keep_for(fraction)
            span = measured.policy - measured.floor
            self._choose(region, RegionPolicy(region.choice.user, keep=keep), (
                f"budget fraction {fraction:g}: {keep} of its {measured.saves} optional "
                f"save(s) per call, {format_bytes(measured.at(keep) - measured.floor)} of "
                f"the {format_bytes(span)} between its floor and the user's policy"))

    def _choose(self, region: Region, choice: RegionPolicy, why: str) -> None:
        if choice != region.choice:
            self.ledger.measure_again()
        region.choose(choice, why)

    # --- ledger.StepRegions -------------------------------------------------

    def held_bytes(self) -> int:
        return self.ledger.held_bytes()

    def choices(self) -> list[RegionChoice]:
        """Each measured region, its own peak taken as what it holds, plus
        what autograd saved inside it (which its recomputation re-creates at
        most), plus the most one op's backward adds to that while it runs,
        plus its parameters' gradients."""
        measured = [(r, self.ledger.bytes_of(r.name)) for r in self.regions]
        self._planned = [r for r, m in measured if m is not None]
        choices = []
        for region, m in measured:
            if m is None:
                continue
            grads = gradient_bytes(region.parameters())
            extra = m.activations + m.temporaries + grads
            choices.append(RegionChoice(self.ledger.position_of(region.name), grads,
                                        (m.policy + extra, m.policy), (m.floor + extra, m.floor),
                                        at_floor=region.choice.keep == 0))
        return choices

    def choose(self, at_floor: list[bool]) -> None:
        budget = format_bytes(self.backend.options.budget.bytes)
        for region, low in zip(self._planned, at_floor):
            if region.choice.user is None:
                continue
            measured = self.ledger.bytes_of(region.name)
            if low:
                self._choose(region, RegionPolicy(region.choice.user, keep=0), (
                    f"a byte budget of {budget}: the first step was over it, and with the "
                    "user's policy here no plans for the graphs fit; its floor frees "
                    f"{format_bytes(measured.policy - measured.floor)}"))
            else:
                self._choose(region, RegionPolicy(region.choice.user), (
                    f"a byte budget of {budget}: the graphs' plans make room for the "
                    "user's policy here"))

    # --- the report ---------------------------------------------------------

    def _record_graph(self, gm: fx.GraphModule, entry: LedgerEntry) -> None:
        reason = getattr(gm, "compile_subgraph_reason", None)
        stack = list(reason.user_stack) if reason is not None else []
        frame = describe_frame(stack[0], source=False) if stack else "?"
        ended_by = ("a graph break: " + reason.reason.strip().splitlines()[0]
                    if reason is not None and reason.graph_break else "return")
        self.graphs.append((frame, ended_by, entry))

    def report(self) -> FallbackReport:
        regions = []
        for r in self.regions:
            measured = self.ledger.bytes_of(r.name)
            regions.append(RegionRecord(
                r.name, r.module_type, tuple(r.breaks),
                measured.held if measured is not None else None, r.calls, r.enclosed_calls,
                r.choice.describe(), r.why,
                measured.floor if measured is not None else None,
                measured.policy if measured is not None else None))
        # A graph re-planned after the first step shows its current plan.
        graphs = tuple(GraphRecord(frame, ended_by, entry.plan)
                       for frame, ended_by, entry in self.graphs)
        return FallbackReport(self.backend.options.budget, self.options.policy, tuple(regions),
                              tuple(self.kept), graphs)

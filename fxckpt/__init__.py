"""fxckpt: automatic, budgeted, correct activation checkpointing for PyTorch."""

from fxckpt.compat.releases import warn_if_untested

warn_if_untested()

from fxckpt import policies  # noqa: E402
from fxckpt.entry.backend import backend
from fxckpt.entry.compile import compile
from fxckpt.eager.checkpoint import checkpoint, checkpoint_sequential
from fxckpt.errors import BudgetError, FxckptError, PlanError, PolicyError
from fxckpt.entry.explain import explain
from fxckpt.naming import name
from fxckpt.options import parse_budget
from fxckpt.entry.pareto import pareto
from fxckpt.entry.transform import transform
from fxckpt.report.plan import Plan

__all__ = [
    "backend", "compile", "transform", "checkpoint", "checkpoint_sequential", "explain",
    "Plan", "parse_budget",
    "BudgetError", "FxckptError", "PlanError", "PolicyError", "policies", "name",
    "pareto",
]

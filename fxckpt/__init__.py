"""fxckpt: automatic, budgeted, correct activation checkpointing for PyTorch."""

from . import policies
from .backend import backend
from .compile import compile
from .eager import checkpoint, checkpoint_sequential
from .errors import BudgetError, FxckptError, PlanError, PolicyError
from .explain import explain
from .naming import name
from .options import parse_budget
from .pareto import pareto
from .transform import transform
from .types import Plan

__all__ = [
    "backend", "compile", "transform", "checkpoint", "checkpoint_sequential", "explain", "Plan", "parse_budget",
    "BudgetError", "FxckptError", "PlanError", "PolicyError", "policies", "name",
    "pareto",
]

"""fxckpt: automatic, budgeted, correct activation checkpointing for PyTorch."""

from .backend import backend
from .errors import BudgetError, FxckptError, PlanError, PolicyError
from .explain import explain
from .options import parse_budget
from .transform import transform
from .types import Plan

__all__ = [
    "backend", "transform", "explain", "Plan", "parse_budget",
    "BudgetError", "FxckptError", "PlanError", "PolicyError",
]

"""Errors fxckpt raises. Each message names the problem and the fix."""

from __future__ import annotations

import warnings


class FxckptError(RuntimeError):
    """Base class for errors raised by fxckpt."""


class BudgetError(FxckptError):
    """A memory budget cannot be met by any plan for this graph.

    ``floor_bytes`` is the smallest budget that can be met; ``dominated_by``
    says what that floor is made of.
    """

    def __init__(self, message: str, *, floor_bytes: int | None = None,
                 dominated_by: str = "") -> None:
        super().__init__(message)
        self.floor_bytes = floor_bytes
        self.dominated_by = dominated_by


class PolicyError(FxckptError, ValueError):
    """A policy asked for something that cannot be done (for example to
    recompute an op with side effects)."""


class PlanError(FxckptError):
    """A plan or a rewritten graph failed verification. This is a bug in
    fxckpt: the plan never runs."""


_SURFACED: dict[type, type] = {}


def surface_through_dynamo(error: FxckptError) -> FxckptError:
    """The same error, of a class Dynamo re-raises as it is instead of wrapping
    it in BackendCompilerFailed, so ``except fxckpt.BudgetError`` works
    around ``torch.compile``. Still an instance of the original class."""
    from fxckpt.compat.dynamo import surfacing_error_class

    cls = type(error)
    if cls not in _SURFACED:
        _SURFACED[cls] = type(cls.__name__, (cls, surfacing_error_class()),
                              {"__module__": cls.__module__})
    surfaced = Exception.__new__(_SURFACED[cls])
    surfaced.args = error.args
    surfaced.__dict__.update(error.__dict__)
    surfaced.first_useful_frame = None
    return surfaced


_warned: set[str] = set()


def warn_once(key: str, message: str, *, stacklevel: int = 2) -> None:
    """Warn ``message`` the first time ``key`` is warned about in this process."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=stacklevel + 1)

"""User options, validated once at the entry points and passed down explicitly."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from fxckpt.policies.api import PolicyFactory
from fxckpt.policies.resolve import resolve_policy

COMPILERS = ("inductor", "eager")
OPTION_NAMES = ("budget", "policy", "compiler", "solver", "offload_bandwidth", "mode")
SOLVERS = ("auto", "ilp", "fast", "mincut", "save_all", "recompute_all", "per_block", "sqrt_n")

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BUDGET_FORMS = (
    "a budget is None, a positive number of bytes (int), a string with units "
    "such as '512MiB', '2GB' or '1.5GiB', or a fraction in [0, 1] (a float, or "
    "a string such as '0.5' or '50%') read as torch's activation_memory_budget: "
    "0 is the lowest peak any plan reaches, 1 the runtime-optimal plan's peak; "
    "or 'fit' on a CUDA device: its free memory at the first compile, less 10% "
    "and 64 MiB"
)

# budget="fit" (fxckpt/budget/fit.py): the share of the device's free memory kept
# back for what the memory model does not see, and the bytes kept back besides
# for the caching allocator's rounding (it takes 1 to 10 MiB blocks out of
# 20 MiB segments, and a nearly full device leaves the rest fragmented).
FIT_MARGIN = 0.10
FIT_SLACK = 64 * 2**20
FIT_ALTERNATIVES = ("pass a byte budget (an int, or a string such as '512MiB') or a "
                    "fraction (0.5 or '50%': from the floor to the runtime-optimal "
                    "peak) instead")


@dataclass(frozen=True)
class Budget:
    """A memory budget: absolute bytes (a hard limit), or a fraction read as
    torch's ``activation_memory_budget``: 0 is the floor (the lowest peak any
    plan reaches), 1 the runtime-optimal plan's peak, values between
    interpolate the peak. A fraction is always feasible and monotone.

    ``fit``: ``budget="fit"``, the free memory of the CUDA device the first
    graph runs on, less ``FIT_MARGIN`` (fxckpt/budget/fit.py); ``bytes`` is None
    until the backend reads it there, then a byte budget like any other."""

    bytes: int | None = None
    fraction: float | None = None
    fit: bool = False

    def resolve(self, runtime_optimal_peak: int, floor: int | None = None) -> int:
        """Bytes, given the runtime-optimal peak and (for fractions) the floor;
        without a floor a fraction is read against zero."""
        if self.bytes is not None:
            return self.bytes
        if self.fraction is None:
            raise ValueError("budget='fit' is read off the device when the backend "
                             "compiles a graph; here it is not known: "
                             + FIT_ALTERNATIVES)
        low = min(floor or 0, runtime_optimal_peak)
        return int(low + self.fraction * (runtime_optimal_peak - low))

    def __str__(self) -> str:
        fit = (f"the CUDA device's free memory at the first compile, less "
               f"{FIT_MARGIN:.0%} and {format_bytes(FIT_SLACK)}")
        if self.fit:
            return f"{format_bytes(self.bytes)} ({fit})" if self.bytes is not None else \
                f"'fit' ({fit})"
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{self.fraction:g} of the way from the floor to the runtime-optimal peak"


def parse_budget(value: Any) -> Budget | None:
    """Read a user budget.

    Args:
        value: None, a positive number of bytes (int), a string with units
            ("512MiB", "2GB"), a fraction in [0, 1] (a float, "0.5" or
            "50%"), "fit", or a ``Budget``.

    Returns:
        The ``Budget``, or None for no budget.

    Raises:
        ValueError: ``value`` is none of those; the message names the forms.

    Example:
        >>> fxckpt.parse_budget("512MiB").bytes
        536870912
    """
    if value is None:
        return None
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise ValueError(f"budget={value!r} is not a budget: {_BUDGET_FORMS}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"budget={value!r} must be positive: {_BUDGET_FORMS}")
        return Budget(bytes=_checked_bytes(value, value))
    if isinstance(value, float):
        return Budget(fraction=_fraction(value, value))
    if isinstance(value, str):
        return _parse_budget_text(value)
    raise ValueError(f"budget={value!r} has type {type(value).__name__}: {_BUDGET_FORMS}")


def _fraction(fraction: float, asked: Any) -> float:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(
            f"budget={asked!r} is a fraction outside [0, 1]: {_BUDGET_FORMS}; "
            "for an absolute budget pass an int or a string like '512MiB'")
    return fraction


def _parse_budget_text(value: str) -> Budget:
    text = value.strip()
    if text.lower() == "fit":
        if not torch.cuda.is_available():
            raise ValueError(
                f"budget={value!r} plans to the free memory of a CUDA device, and this "
                f"machine has none (torch.cuda.is_available() is False); "
                + FIT_ALTERNATIVES)
        return Budget(fit=True)
    if text.endswith("%"):
        try:
            return Budget(fraction=_fraction(float(text[:-1]) / 100, value))
        except ValueError as error:
            if "outside" in str(error):
                raise
            raise ValueError(f"budget={value!r} is not understood: {_BUDGET_FORMS}") from None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"budget={value!r} is not understood: {_BUDGET_FORMS}")
    if not unit and "." in match.group(1):   # "0.5": a fraction, as the float would be
        return Budget(fraction=_fraction(float(match.group(1)), value))
    amount = int(float(match.group(1)) * _UNITS[unit])
    if amount <= 0:
        raise ValueError(f"budget={value!r} must be positive: {_BUDGET_FORMS}")
    return Budget(bytes=_checked_bytes(amount, value))


def _checked_bytes(amount: int, asked: Any) -> int:
    """Warn about a byte budget larger than any memory here: a unit slip
    ("512GiB" for "512MiB") would otherwise pass as "no limit" silently."""
    largest = _largest_memory()
    if largest and amount > largest:
        warnings.warn(f"budget={asked!r} ({format_bytes(amount)}) is more than any memory "
                      f"on this machine holds (the largest is {format_bytes(largest)}); "
                      "it will never bind. Did you mean a smaller unit?", stacklevel=4)
    return amount


def _largest_memory() -> int:
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    if torch.cuda.is_available():
        sizes += [torch.cuda.get_device_properties(i).total_memory
                  for i in range(torch.cuda.device_count())]
    return max(sizes, default=0)


def parse_bandwidth(value: Any) -> float | None:
    """Read ``offload_bandwidth``: bytes per second (a positive number) or a
    string such as '12GB/s' or '10GiB/s'; None measures it."""
    if value is None:
        return None
    forms = ("offload_bandwidth is None (measured on the device), a positive number "
             "of bytes per second, or a string such as '12GB/s'")
    if isinstance(value, bool):
        raise ValueError(f"offload_bandwidth={value!r} is not a bandwidth: {forms}")
    if isinstance(value, (int, float)):
        if not value > 0 or value != value or value == float("inf"):
            raise ValueError(f"offload_bandwidth={value!r} must be positive and finite: {forms}")
        return float(value)
    if isinstance(value, str) and value.strip().lower().endswith("/s"):
        try:
            return float(parse_budget(value.strip()[:-2]).bytes)
        except ValueError:
            pass
    raise ValueError(f"offload_bandwidth={value!r} is not understood: {forms}")


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


# torch.compile modes that capture CUDA graphs: their memory pool holds the
# step's tensors where the caching allocator, and so the budget, cannot see them.
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def checked_mode(mode: str | None, compiler: str) -> str:
    """``mode`` as fxckpt compiles with it; ValueError naming the mode where
    fxckpt cannot honour it."""
    from fxckpt.compat.inductor import modes

    if mode is None or mode == "default":
        return "default"
    if mode not in modes():
        raise ValueError(f"mode={mode!r} is not a torch.compile mode on this torch; the "
                         f"modes are {', '.join(map(repr, modes()))}")
    if compiler != "inductor":
        raise ValueError(f"mode={mode!r} configures Inductor, and fxckpt compiles with "
                         f"compiler={compiler!r} (no Inductor): drop mode, or pass "
                         "compiler='inductor'")
    if mode in _CUDA_GRAPH_MODES:
        raise ValueError(
            f"mode={mode!r} captures CUDA graphs, whose private memory pool holds the "
            "step's tensors outside what fxckpt plans and measures, so no budget could "
            "be kept: use mode='max-autotune-no-cudagraphs' for autotuned kernels, or "
            "compile without fxckpt for CUDA graphs")
    return mode


# What fxckpt.backend() compiles with; explain and pareto default to it too.
DEFAULT_COMPILER = "inductor"


@dataclass(frozen=True)
class Options:
    """Everything a user can set; built once, passed to every stage that needs it."""

    budget: Budget | None = None
    # What ``policy=`` asked for, resolved once (fxckpt.policies.resolve);
    # None: no policy, the planner's defaults.
    policy: PolicyFactory | None = None
    compiler: str = DEFAULT_COMPILER
    solver: str = "auto"
    # Bytes per second one way between device and pinned host memory, which
    # prices CPU offload; None: measured on the device the first time a plan
    # can offload (fxckpt/bandwidth.py).
    offload_bandwidth: float | None = None
    # torch.compile's ``mode``: the Inductor configuration fxckpt's own
    # compiles run under ("default" adds none).
    mode: str = "default"
    # Set by the backend, not by users: how many times per step the graph
    # being planned runs (one block graph serving every block). A byte budget
    # then bounds its peak plus what its other runs hold.
    runs_per_step: int = 1

    @staticmethod
    def create(*, budget: Any = None, policy: Any = None, compiler: str = DEFAULT_COMPILER,
               solver: str = "auto", offload_bandwidth: Any = None,
               mode: str | None = None) -> "Options":
        if compiler not in COMPILERS:
            raise ValueError(
                f"compiler={compiler!r} is not known; choose one of {COMPILERS} "
                "('eager' runs the planned graphs without a code generator, for "
                "debugging and bitwise checks)")
        if solver not in SOLVERS:
            raise ValueError(f"solver={solver!r} is not known; choose one of {SOLVERS}")
        return Options(budget=parse_budget(budget), policy=resolve_policy(policy),
                       compiler=compiler, solver=solver,
                       offload_bandwidth=parse_bandwidth(offload_bandwidth),
                       mode=checked_mode(mode, compiler))

    @staticmethod
    def from_mapping(options: dict | None, **defaults: Any) -> "Options":
        """Build from ``torch.compile(..., options={...})``; unknown keys are errors."""
        merged = dict(defaults)
        for key, value in (options or {}).items():
            if key not in OPTION_NAMES:
                raise ValueError(
                    f"unknown fxckpt option {key!r}; the options are "
                    + ", ".join(repr(name) for name in OPTION_NAMES))
            merged[key] = value
        return Options.create(**merged)

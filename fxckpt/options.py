"""User options, validated once at the entry points and passed down explicitly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

COMPILERS = ("inductor", "eager")
OPTION_NAMES = ("budget", "policy", "compiler", "solver", "offload_bandwidth")
SOLVERS = ("auto", "ilp", "fast", "mincut", "save_all", "recompute_all", "per_block", "sqrt_n")

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BUDGET_FORMS = (
    "a budget is None, a positive number of bytes (int), a string with units "
    "such as '512MiB', '2GB' or '1.5GiB', or a float in (0, 1] read as a "
    "fraction of the runtime-optimal plan's peak"
)


@dataclass(frozen=True)
class Budget:
    """A memory budget: absolute bytes, or a fraction of the runtime-optimal peak."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, runtime_optimal_peak: int) -> int:
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return int(self.fraction * runtime_optimal_peak)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{self.fraction:g} x runtime-optimal peak"


def parse_budget(value: Any) -> Budget | None:
    """Read a user budget; raise ValueError naming the accepted forms."""
    if value is None:
        return None
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise ValueError(f"budget={value!r} is not a budget: {_BUDGET_FORMS}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"budget={value!r} must be positive: {_BUDGET_FORMS}")
        return Budget(bytes=value)
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(
                f"budget={value!r} is a float outside (0, 1]: {_BUDGET_FORMS}; "
                "for an absolute budget pass an int or a string like '512MiB'")
        return Budget(fraction=value)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"budget={value!r} is not understood: {_BUDGET_FORMS}")
        amount = int(float(match.group(1)) * _UNITS[unit])
        if amount <= 0:
            raise ValueError(f"budget={value!r} must be positive: {_BUDGET_FORMS}")
        return Budget(bytes=amount)
    raise ValueError(f"budget={value!r} has type {type(value).__name__}: {_BUDGET_FORMS}")


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


# What fxckpt.backend() compiles with; explain and pareto default to it too.
DEFAULT_COMPILER = "inductor"


@dataclass(frozen=True)
class Options:
    """Everything a user can set; built once, passed to every stage that needs it."""

    budget: Budget | None = None
    policy: Any = None
    compiler: str = DEFAULT_COMPILER
    solver: str = "auto"
    # Bytes per second one way between device and pinned host memory, which
    # prices CPU offload; None: measured on the device the first time a plan
    # can offload (fxckpt/bandwidth.py).
    offload_bandwidth: float | None = None

    @staticmethod
    def create(*, budget: Any = None, policy: Any = None, compiler: str = DEFAULT_COMPILER,
               solver: str = "auto", offload_bandwidth: Any = None) -> "Options":
        if compiler not in COMPILERS:
            raise ValueError(
                f"compiler={compiler!r} is not known; choose one of {COMPILERS} "
                "('eager' runs the planned graphs without a code generator, for "
                "debugging and bitwise checks)")
        if solver not in SOLVERS:
            raise ValueError(f"solver={solver!r} is not known; choose one of {SOLVERS}")
        return Options(budget=parse_budget(budget), policy=policy,
                       compiler=compiler, solver=solver,
                       offload_bandwidth=parse_bandwidth(offload_bandwidth))

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

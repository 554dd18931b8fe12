"""BENCHMARKS.md as a pure function of ``fxckpt bench --all``'s results."""

from __future__ import annotations


def render(results: dict) -> str:
    return "# Benchmarks\n\n(placeholder)\n"

"""Frontier and step searches run with some of their effort changed
(solve/effort.py), to see what a stage or a move adds."""

from __future__ import annotations

import importlib
from dataclasses import replace

_SEARCHES = ("fxckpt.solve.frontier.build", "fxckpt.solve.local_search")


def with_effort(patch, **fields) -> None:
    """Under ``patch`` (a pytest MonkeyPatch), every frontier built and
    every budget's step searched reads its effort with ``fields`` changed."""
    for name in _SEARCHES:
        module = importlib.import_module(name)
        real = module.effort_for
        patch.setattr(module, "effort_for",
                      lambda values, real=real: replace(real(values), **fields))

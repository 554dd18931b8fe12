"""Dynamo internals fxckpt builds on (see fxckpt/compat/__init__.py)."""

from __future__ import annotations

import copy
import inspect

import torch
import torch.fx as fx
from torch._dynamo.eval_frame import OptimizedModule

__all__ = ["OptimizedModule", "surfacing_error_class", "graph_break_reasons",
           "compile_isolated", "copy_of_dynamo_graph", "ISOLATES_RECOMPILES",
           "is_boxed", "mark_boxed"]

# torch.compile(isolate_recompiles=True): compiles that neither replace nor
# count against other compiles of the same code (torch 2.13 and newer).
ISOLATES_RECOMPILES = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def surfacing_error_class():
    """The exception class Dynamo re-raises from a backend as it is, rather
    than wrapped in BackendCompilerFailed."""
    from torch._dynamo.exc import ShortenTraceback

    return ShortenTraceback


def graph_break_reasons() -> list | None:
    """Dynamo's log of the graph breaks it met in this process (the breaks
    whose graph was empty included), or None where it keeps none."""
    from torch._dynamo import utils as dynamo_utils

    return getattr(dynamo_utils, "graph_break_reasons", None)


def compile_isolated(model, *, backend, dynamic=None):
    """``torch.compile(model, backend=backend, dynamic=dynamic)`` whose
    compiles neither replace nor count against the user's compiles of the
    same code. Before torch 2.13 compiles cannot be kept apart: said once,
    as they then count against Dynamo's recompile limit for that code."""
    if ISOLATES_RECOMPILES:
        return torch.compile(model, backend=backend, dynamic=dynamic, isolate_recompiles=True)
    from fxckpt.errors import warn_once

    warn_once("isolate_recompiles", (
        f"fxckpt: on torch {torch.__version__}, a capture that plans without training "
        "(fxckpt.explain, fxckpt.pareto) compiles the model's code as a compile of your "
        "own would, and counts against Dynamo's recompile limit for it "
        "(torch._dynamo.config.recompile_limit); torch 2.13 and newer keep them apart"),
        stacklevel=3)
    return torch.compile(model, backend=backend, dynamic=dynamic)


def is_boxed(compiled) -> bool:
    """Whether a compiled graph takes its inputs as one list it may clear
    (AOTAutograd's boxed calling convention)."""
    return getattr(compiled, "_boxed_call", False)


def mark_boxed(function, boxed: bool) -> None:
    """Say of ``function`` whether it takes its inputs boxed (``is_boxed``)."""
    function._boxed_call = boxed


def copy_of_dynamo_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A deep copy of a graph Dynamo made, with what AOTAutograd reads off
    it to tell parameters from activations (the inputs' sources), which a
    deep copy leaves behind."""
    copied = copy.deepcopy(gm)
    for old, new in zip(gm.graph.find_nodes(op="placeholder"),
                        copied.graph.find_nodes(op="placeholder")):
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    if hasattr(gm, "_param_name_to_source"):
        copied._param_name_to_source = gm._param_name_to_source
    return copied

"""GraphModule + example inputs -> a callable whose forward and backward follow
fxckpt's plan. AOTAutograd traces the joint graph (make_fx, with fake tensors
on every node) and hands it to the Planner as its partition function; the two
graphs it returns go to the inner compiler.

``capture_once`` runs a model once under a backend without training it, for
explain, pareto and the benchmarks."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from fxckpt.pipeline import Planner


def compile_planned(gm: fx.GraphModule, example_inputs: list[Any], planner: Planner):
    if planner.options.compiler == "eager":
        # Dynamo's aot_autograd wrapper rather than aot_module_simplified: DDP's
        # graph splitter counts its calls to tell that a bucket's graph went
        # through AOTAutograd; uncounted, the first real call returns fake tensors.
        return aot_autograd(
            # The planned graphs run as their generated code, as aot_eager
            # runs its own (not through fx.Interpreter, which costs Python
            # time per op).
            fw_compiler=boxed_nop,
            bw_compiler=boxed_nop,
            partition_fn=planner,
        )(gm, example_inputs)
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    # A cached compile would skip the partitioner, and with it the plan.
    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, config_patches={
            "custom_partitioner_fn": _InductorPartitioner(planner),
            "fx_graph_cache": False,
        })


class _InductorPartitioner(CustomPartitionerFn):
    """Inductor runs its joint-graph passes, then asks us to partition."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs):
        kwargs.pop("compiler", None)
        return self.planner(gm, joint_inputs, **kwargs)

    def uuid(self):
        # The plan depends on options and policies that do not hash reliably;
        # returning None keeps Inductor from reusing a cached partition, so the
        # Planner always runs and always records its plan.
        return None



def capture_once(model, example_inputs, backend: Callable) -> None:
    """Run one forward of ``model`` (a copy of it, when it is an nn.Module:
    its buffers stay untouched) under ``backend`` with the caller's RNG
    state left as it was, so the backend sees the graphs training would.
    Other compiled models in the process are left as they were."""
    target = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    devices = sorted({t.device for t in example_inputs
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"}, key=str)
    # Its own recompile region: the entries compiled here neither replace
    # nor count against those of models compiled elsewhere in the process
    # (no global reset), and a different backend never reuses theirs.
    with torch.random.fork_rng(devices=devices):
        torch.compile(target, backend=backend, isolate_recompiles=True)(*example_inputs)

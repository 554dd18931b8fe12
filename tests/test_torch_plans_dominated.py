"""Torch's own plans under ``activation_memory_budget`` are in fxckpt's plan
space once made bitwise (their dropout replayed from saved generator states
rather than drawn again): fxckpt's budget frontier has, for each of them, a
plan that peaks no higher and recomputes no more.

Torch's plan is taken from its partitioner on the same joint graph (the
values its forward saves) and followed through fxckpt's own pipeline by a
policy that saves exactly those values and recomputes the rest. Tiny HF
Llama and GPT-2 (transformers configurations, no weights), where before
the cut plans of solve/frontier the frontier had no plan as cheap as
torch's at its peak (HF Llama at 0.5: torch's plan 130,632 B and 5.8 us,
the frontier 124,232 B at 8.46 us, then 134,792 B at 2.87 us).

Not yet held, so not asserted here: on the bench's tiny zoo GPT torch's
plan at 0.5, made bitwise, peaks at 163,144 B costing 3.93 us, and the
frontier's nearest plans are 153,736 B at 6.47 us and 166,024 B at
4.18 us (its plans at 0.25 and 0 are dominated)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.fx as fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.bench.solvers import capture_joint
from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner
from fxckpt.policies.api import OpCall, Policy


class _SaveExactly(Policy):
    """Save these values; recompute everything else backward needs."""

    def __init__(self, names) -> None:
        self.names = frozenset(names)

    def __call__(self, call: OpCall):
        return CheckpointPolicy.MUST_SAVE if call.name in self.names \
            else CheckpointPolicy.PREFER_RECOMPUTE


@functools.lru_cache(maxsize=None)
def _joint(name: str):
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    model, inputs, loss_fn = make_bench_model(name, size="tiny")
    return capture_joint(Step(model, loss_fn), inputs)


def _torch_saved(joint, joint_inputs, kwargs, budget: float) -> frozenset:
    with torch._functorch.config.patch(activation_memory_budget=budget):
        forward, _ = min_cut_rematerialization_partition(copy.deepcopy(joint), joint_inputs,
                                                         **kwargs)
    outputs = forward.graph.output_node().args[0]
    return frozenset(o.name for o in outputs[kwargs["num_fwd_outputs"]:]
                     if isinstance(o, fx.Node))


@pytest.mark.parametrize("name", ["hf_llama", "hf_gpt2"])
def test_every_torch_budget_plan_made_bitwise_is_dominated_by_the_frontier(name):
    joint, joint_inputs, kwargs = _joint(name)
    planner = Planner(Options.create(compiler="eager", budget=0.0))
    planner(joint, joint_inputs, **kwargs)
    frontier = planner.frontiers_seen[0]
    compared = 0
    for budget in (0.5, 0.25, 0.0):
        saved = _torch_saved(joint, joint_inputs, kwargs, budget)
        follower = Planner(Options.create(compiler="eager", policy=_SaveExactly(saved)))
        follower(joint, joint_inputs, **kwargs)
        plan = follower.plans[0]
        # Torch's plan, followed: what it saves is what torch's forward
        # saves, besides the generator states of the random ops it recomputes
        # and parameters (no bytes) its recomputes read.
        assert {n for n in plan.saved
                if not n.startswith(("rng_state_", "primals"))} <= saved
        peak, cost = plan.peak_bytes, plan.recompute_cost
        better = [(p, c) for p, _, c in frontier if p <= peak and c <= cost * (1 + 1e-9)]
        assert better, (budget, peak, cost, frontier)
        compared += 1
    assert compared == 3

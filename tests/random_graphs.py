"""Random planning problems: a Profile and Tags made from numbers, no torch
graph, so solvers and the memory proxy can be driven by hypothesis."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.solve.candidates import masks
from fxckpt.solve.frontier import pareto_frontier
from fxckpt.solve.runtime_optimal import runtime_optimal
from fxckpt.types import BACKWARD, FORWARD, NodeProfile, Profile, Tag


def random_profile(seed: int, *, n_inputs: int = 3, n_forward: int = 20,
                   n_backward: int = 15, offload: bool = False
                   ) -> tuple[Profile, dict[str, Tag]]:
    """With ``offload``, a fifth of the values a policy would save are
    tagged PREFER_CPU_OFFLOAD instead and one in twenty MUST_CPU_OFFLOAD."""
    rng = random.Random(seed)
    nodes: dict[str, NodeProfile] = {}
    tags: dict[str, Tag] = {}
    forward: list[str] = []
    for i in range(n_inputs):
        name = f"primals_{i + 1}"
        static = rng.random() < 0.5
        nodes[name] = NodeProfile(name=name, op="input", phase=FORWARD, inputs=(),
                                  bytes=rng.randint(1, 64) * 64, storage=name,
                                  is_input=True, is_static=static,
                                  not_recomputable="graph input")
        tags[name] = Tag(CheckpointPolicy.MUST_SAVE, "graph input", "op")
        forward.append(name)
    for i in range(n_forward):
        name = f"f{i}"
        parents = tuple(dict.fromkeys(rng.sample(forward, k=min(len(forward),
                                                                 rng.randint(1, 3)))))
        kind = rng.random()
        view = kind < 0.15
        impure = 0.15 <= kind < 0.2
        random_op = 0.2 <= kind < 0.3
        storage = nodes[parents[0]].storage if view else name
        nodes[name] = NodeProfile(
            name=name, op="aten.view.default" if view else "aten.op.default",
            phase=FORWARD, inputs=parents, bytes=0 if view else rng.randint(1, 256) * 64,
            storage=storage, cost=0.0 if view else rng.uniform(1e-6, 1e-3),
            is_view=view, is_random=random_op, replay_bytes=64 if random_op else 0,
            not_recomputable="has side effects" if impure else "")
        if impure:
            tags[name] = Tag(CheckpointPolicy.MUST_SAVE, "cannot be recomputed", "op")
        elif view:
            tags[name] = Tag(CheckpointPolicy.PREFER_RECOMPUTE, "view", "default")
        elif offload and rng.random() < 0.05:
            tags[name] = Tag(CheckpointPolicy.MUST_CPU_OFFLOAD, "policy", "policy")
        elif offload and rng.random() < 0.2:
            tags[name] = Tag(CheckpointPolicy.PREFER_CPU_OFFLOAD, "policy", "policy")
        elif rng.random() < 0.3:
            tags[name] = Tag(CheckpointPolicy.PREFER_SAVE, "matmul", "default")
        else:
            tags[name] = Tag(None, "default", "default")
        forward.append(name)
    op_names = [n for n in forward if not nodes[n].is_input]
    previous = "tangents_1"
    nodes[previous] = NodeProfile(name=previous, op="input", phase=BACKWARD, inputs=(),
                                  bytes=64, storage=previous, is_input=True,
                                  not_recomputable="graph input")
    backward = []
    for j in range(n_backward):
        name = f"b{j}"
        reads = tuple(dict.fromkeys(rng.sample(op_names, k=rng.randint(1, 2)) + [previous]))
        nodes[name] = NodeProfile(name=name, op="aten.grad.default", phase=BACKWARD,
                                  inputs=reads, bytes=rng.randint(1, 128) * 64,
                                  storage=name, cost=rng.uniform(1e-6, 1e-3))
        backward.append(name)
        previous = name
    needed = frozenset(p for b in backward for p in nodes[b].inputs
                       if nodes[p].phase == FORWARD)
    profile = Profile(nodes=nodes, needed_by_backward=needed,
                      forward_outputs=(op_names[-1],),
                      backward_outputs=tuple(backward[-3:]))
    return profile, tags


def proxy_evaluate(problem):
    """An evaluate() (solve/frontier) whose exact model is the proxy
    itself, so the budgeted driver and the frontier can be checked without
    graphs."""
    def mask(names):
        return np.array([n in names for n in problem.names])

    def evaluate(decision):
        peak = problem.peak(mask(decision.saved), mask(decision.recomputed),
                            mask(decision.offloaded))
        return None, SimpleNamespace(peak_bytes=int(np.ceil(peak)), peak_at="x")
    return evaluate


def proxy_frontier(problem, solver, **options):
    """The whole frontier of ``problem`` with ``proxy_evaluate`` as its exact
    model, started from the runtime-optimal plan; ``options`` as
    pareto_frontier's (effort, stages)."""
    evaluate = proxy_evaluate(problem)
    optimal = runtime_optimal(problem)
    return pareto_frontier(problem, evaluate, solver, (optimal, *evaluate(optimal)),
                           **options)


def cost_at(frontier, budget):
    """The least cost of a plan of ``frontier`` within ``budget`` (None: none fits)."""
    costs = [c.cost for c in frontier if c.peak <= budget]
    return min(costs) if costs else None


def assert_runnable_and_never_costlier(problem, richer, plain):
    """Every plan of frontier ``richer`` runnable, and at every budget a plan
    of either fits, ``richer``'s least cost there no more than ``plain``'s."""
    for c in richer:
        assert problem.is_feasible(*masks(problem, c.decision)) == ""
    for budget in sorted({c.peak for c in richer + plain}):
        with_more, without = cost_at(richer, budget), cost_at(plain, budget)
        assert (with_more is None) == (without is None)
        if without is not None:
            assert with_more <= without + 1e-15

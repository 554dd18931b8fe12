"""One process of tests/test_cache.py: compiles a small model and prints what
the plan cache made of it as one JSON line.

    python tests/cache_worker.py key [POLICY]    the plan key of its Dynamo graph
    python tests/cache_worker.py step BUDGET     one training step under Inductor

The model and the policy functions live here so that a test's own process
and these processes see the same source lines (the key holds them)."""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def small():
    torch.manual_seed(0)
    return Small(), torch.randn(32, 16)


SAVED_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
SAVED_OPS_LIST = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]


def save_matmuls_fn(ctx, op, *args, **kwargs):
    """Keyable: reads a tuple of ops."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def save_listed_fn(ctx, op, *args, **kwargs):
    """Not keyable: reads a list, which may change between calls."""
    return op in SAVED_OPS_LIST


def dynamo_graph(model, x):
    """The graph and example inputs Dynamo hands a backend for ``model(x)``."""
    seen = []

    def keep(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(model, backend=keep)(x)
    return seen[0]


def key(policy_name: str | None):
    from fxckpt.planning.cache import plan_key
    from fxckpt.options import Options

    gm, example_inputs = dynamo_graph(*small())
    policy = {"save_matmuls_fn": save_matmuls_fn, None: None}[policy_name]
    return {"key": plan_key(gm, example_inputs, Options.create(policy=policy)).digest}


def step(budget: int):
    import fxckpt
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)    # reductions in one order: gradients bit for bit
    planned = []

    class Count(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("fxckpt: planning graph"):
                planned.append(record.getMessage())

    logging.getLogger("fxckpt").addHandler(Count())
    logging.getLogger("fxckpt").setLevel(logging.INFO)
    model, x = small()
    backend = fxckpt.backend(compiler="inductor", budget=budget)
    torch.compile(model, backend=backend)(x).square().mean().backward()
    entries = backend.ledger.live()
    return {"planned": len(planned),
            "fingerprints": [plan.fingerprint for plan in backend.plans],
            "notes": [list(plan.notes) for plan in backend.plans],
            "frontiers": [list(map(list, entry.frontier)) for entry in entries],
            "ledger_plans": [entry.plan.fingerprint for entry in entries],
            "explained": str(backend.plans[0]),
            "autograd_cache": dict(counters["aot_autograd"]),
            "grads": [p.grad.flatten().tolist() for p in model.parameters()]}


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if os.environ.get("CACHE_WORKER_THREADS"):
        # The key reads the thread count: the parent's, not this process's default.
        torch.set_num_threads(int(os.environ["CACHE_WORKER_THREADS"]))
    result = key(rest[0] if rest else None) if mode == "key" else step(int(rest[0]))
    print(json.dumps(result))

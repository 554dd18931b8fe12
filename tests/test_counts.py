"""Exact counts: a recomputed op runs exactly twice (forward, then backward's
recompute), a saved one once. Measured with a dispatch-mode counter against
the same model planned with save_all, which recomputes nothing."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxckpt

try:
    from tests.harness import fresh
    from tests.opcount import OpCounter
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover
    from harness import fresh
    from opcount import OpCounter
    from zoo import ZOO

pytestmark = pytest.mark.releases

# Ops whose aten packet does not identify one graph node: detach is emitted by
# autograd itself, getitem is not an aten op.
IGNORE = {torch.ops.aten.detach}


def _counted_step(model, inputs, loss_fn, solver):
    torch._dynamo.reset()
    be = fxckpt.backend(compiler="eager", solver=solver)
    compiled = torch.compile(model, backend=be)
    loss_fn(compiled(*inputs)).backward()          # compile outside the counter
    with OpCounter(ignore=IGNORE) as counter:
        torch.manual_seed(0)
        counter.phase("forward")
        loss = loss_fn(compiled(*inputs))
        counter.phase("backward")
        loss.backward()
    return counter, be.plans


def _recomputed_ops(plans) -> Counter:
    ops = Counter()
    for plan in plans:
        for entry in plan.entries:
            # aten ops, and fxckpt's halves of a host dropout (passes/dropout.py).
            if entry.action == "recomputed" and entry.op.startswith(("aten.", "fxckpt.")):
                namespace, name = entry.op.split(".")[:2]
                packet = getattr(getattr(torch.ops, namespace), name)
                if packet not in IGNORE:
                    ops[packet] += 1
    return ops


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = F.dropout(h.sin(), 0.25, self.training)
        return self.fc2(h).tanh()


def _chain():
    torch.manual_seed(0)
    return Chain(), (torch.randn(8, 32, requires_grad=True),), lambda y: y.square().sum()


@pytest.mark.parametrize("make", [_chain, lambda: fresh(ZOO["gpt"])], ids=["chain", "gpt"])
@pytest.mark.parametrize("solver", ["auto", "recompute_all"])
def test_recomputed_ops_run_exactly_twice(make, solver):
    baseline, base_plans = _counted_step(*make(), "save_all")
    counted, plans = _counted_step(*make(), solver)
    assert not any(p.recomputed for p in base_plans)
    recomputed = _recomputed_ops(plans)
    assert recomputed, "the plan recomputes nothing; the test would prove nothing"
    # Every op runs as often as under save_all, plus once more per recomputed
    # node; values only backward reads (deferred) move, they do not repeat.
    ops = set(counted.counts["forward"]) | set(counted.counts["backward"]) \
        | set(baseline.counts["forward"]) | set(baseline.counts["backward"])
    for op in ops:
        if isinstance(op, torch._ops.HigherOrderOperator):
            continue
        extra = counted.total(op) - baseline.total(op)
        assert extra == recomputed[op], (op, extra, recomputed[op])
        assert counted.counts["backward"][op] >= recomputed[op]
        assert counted.counts["forward"][op] <= baseline.counts["forward"][op]


def test_chain_default_plan_exact_counts():
    """Golden counts for the chain under the runtime-optimal plan: matmuls
    are never recomputed; relu, sin and the dropout are, once each."""
    counted, plans = _counted_step(*_chain(), "auto")
    bw = counted.counts["backward"]
    aten = torch.ops.aten
    assert bw[aten.addmm] == 0
    assert _recomputed_ops(plans)[aten.addmm] == 0
    assert counted.counts["forward"][aten.addmm] == 2
    assert counted.total(aten.native_dropout) in (1, 2)
    assert counted.total(aten.native_dropout, "forward") == 1

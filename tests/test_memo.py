"""A graph planned again at another budget selects from the frontier built
the first time (fxckpt/planning/memo.py): the frontier is built once, and the plans
are those planning afresh makes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import fxckpt
import fxckpt.planning.pipeline as pipeline
from fxckpt.bench.compile import gpt_step
import fxckpt.planning.memo as memo_module
from fxckpt.options import Options
from fxckpt.planning.memo import FRONTIERS, FrontierMemo, frontier_key
from fxckpt.memory.schedule import Simulated


@pytest.fixture
def built(monkeypatch):
    """Counts the frontiers built (the memo starts empty: conftest)."""
    calls = []
    original = pipeline.pareto_frontier

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(pipeline, "pareto_frontier", counted)
    return calls


def _explain(step, inputs, budget, **options):
    return fxckpt.explain(step, *inputs, budget=budget, compiler="eager", **options)


def test_other_budgets_select_from_the_frontier_built_once(built, monkeypatch):
    step, inputs = gpt_step(2)
    fractions = (0.5, 0.0, 0.3, 1.0)
    plans = [_explain(step, inputs, f) for f in fractions]
    assert len(built) == 1
    assert not any("memo" in note for note in plans[0].notes)
    assert all(any("planning/memo.py" in note for note in p.notes) for p in plans[1:])
    # The same plans as planning each budget afresh.
    monkeypatch.setattr(pipeline.Planner, "memoizes", False)
    fresh = [_explain(step, inputs, f) for f in fractions]
    assert len(built) == 1 + len(fractions)
    assert [p.fingerprint for p in plans] == [p.fingerprint for p in fresh]
    assert [p.peak_bytes for p in plans] == [p.peak_bytes for p in fresh]
    # A byte budget below the floor is refused with the same floor.
    monkeypatch.setattr(pipeline.Planner, "memoizes", True)
    with pytest.raises(fxckpt.BudgetError) as refused:
        _explain(step, inputs, 1)
    assert refused.value.floor_bytes == plans[1].peak_bytes
    assert len(built) == 1 + len(fractions)


def test_another_policy_or_graph_builds_its_own(built):
    step, inputs = gpt_step(2)
    _explain(step, inputs, 0.5)
    _explain(step, inputs, 0.5, policy=fxckpt.policies.save_matmuls())
    assert len(built) == 2
    _explain(*gpt_step(3), 0.5)
    assert len(built) == 3


def test_the_memo_keeps_no_graphs_and_only_the_last_few(built):
    memo = FrontierMemo(keep=2)
    step, inputs = gpt_step(2)
    _explain(step, inputs, 0.5)
    (key, frontier), = memo_module.FRONTIERS._kept.items()
    assert all(isinstance(c.rewritten, Simulated) for c in frontier)
    for k in ("a", "b", key):
        memo.remember(k, frontier)
    assert len(memo) == 2 and memo.recall("a") is None and memo.recall(key) is not None
    assert FRONTIERS is not memo_module.FRONTIERS   # conftest's, for this test


class _Scaled(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return (x * self.factor).sin()


def test_the_key_reads_every_node_and_its_arguments():
    """The key digests each node's op, target and arguments (what the
    graph's code says): graphs that differ only in a constant get their own
    frontiers, the same graph traced again the same one."""
    profile = SimpleNamespace(nodes={}, needed_by_backward=frozenset(), forward_outputs=(),
                              backward_outputs=())
    options = Options.create(compiler="eager")
    keys = [frontier_key(torch.fx.symbolic_trace(_Scaled(f)), profile, {}, options)
            for f in (2.0, 2.0, 3.0)]
    assert keys[0] == keys[1] != keys[2]

"""Models drawn by hypothesis from a grammar of ops, planned at drawn
budgets under both compilers: gradients equal the reference (bitwise eager
PyTorch under compiler="eager"; Inductor without fxckpt, within fp32
rounding, under Inductor), and the only error fxckpt may raise is a
BudgetError below the floor, which names a floor that is then met.

The grammar: linear layers (with and without bias, one tied to another),
batched matmuls with a softmax, 1-d convolutions, layer norms, dropout and
``rand_like`` (random ops), ``topk`` + ``scatter``, ``gather``,
``index_add``, ``index_select``, in-place ops, views, residual branches, a
buffer mutated in forward, and one or two outputs. In CI the examples are
the same each run (tests/conftest.py); ``HYPOTHESIS_PROFILE=explore`` draws
new ones.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.compat.inductor import inductor_config

try:
    from tests.harness import assert_bitwise_equal, assert_close, run_step
except ImportError:  # pragma: no cover - run from inside tests/
    from harness import assert_bitwise_equal, assert_close, run_step

B, T, D = 2, 6, 8
OPS = ("linear", "linear_nobias", "tied", "bmm_softmax", "conv1d", "layer_norm", "dropout",
       "rand_mul", "topk_scatter", "gather", "index_add", "index_select", "inplace", "view",
       "buffer")


class Drawn(nn.Module):
    """A linear projection, then the ops in order on the (B, T, D)
    activation, each optionally as a residual branch; one output, or two
    (the second from the middle)."""

    def __init__(self, ops: list[tuple[str, bool]], two_outputs: bool, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.ops = ops
        self.two_outputs = two_outputs
        self.layers = nn.ModuleList()
        first_linear = None
        for i, (op, _) in enumerate(ops):
            if op in ("linear", "linear_nobias"):
                layer = nn.Linear(D, D, bias=op == "linear")
                first_linear = first_linear or layer
            elif op == "tied":
                layer = first_linear or nn.Linear(D, D)
                first_linear = first_linear or layer
            elif op == "conv1d":
                layer = nn.Conv1d(D, D, 3, padding=1)
            elif op == "layer_norm":
                layer = nn.LayerNorm(D)
            else:
                layer = nn.Identity()
            self.layers.append(layer)
            self.register_buffer(f"index_{i}", torch.randint(0, T, (T,), generator=generator))
            self.register_buffer(f"gather_{i}", torch.randint(0, D, (B, T, D), generator=generator))
        self.register_buffer("running", torch.zeros(D))
        self.project = nn.Linear(D, D)   # so that every drawn model has a gradient

    def _op(self, i: int, op: str, h: torch.Tensor) -> torch.Tensor:
        layer = self.layers[i]
        if op in ("linear", "linear_nobias", "layer_norm"):
            return layer(h)
        if op == "tied":
            return F.linear(h, layer.weight)
        if op == "bmm_softmax":
            return torch.bmm(torch.bmm(h, h.transpose(1, 2)).softmax(-1), h)
        if op == "conv1d":
            return layer(h.transpose(1, 2)).transpose(1, 2)
        if op == "dropout":
            return F.dropout(h, 0.3, self.training)
        if op == "rand_mul":
            return h * torch.rand_like(h)
        if op == "topk_scatter":
            values, index = h.topk(3, dim=-1)
            return torch.zeros_like(h).scatter(-1, index, values.tanh())
        if op == "gather":
            return h.gather(-1, getattr(self, f"gather_{i}"))
        if op == "index_add":
            return torch.zeros_like(h).index_add(1, getattr(self, f"index_{i}"), h.sin())
        if op == "index_select":
            return h.index_select(1, getattr(self, f"index_{i}")) * 0.5
        if op == "inplace":
            # In place, each op on what no earlier op saved for backward.
            out = h * 2
            out.add_(1.0).mul_(0.5)
            return out.tanh_()
        if op == "view":
            return h.view(B, T, 2, D // 2).transpose(2, 3).reshape(B, T, D).sigmoid()
        if op == "buffer":
            self.running.mul_(0.9).add_(h.detach().mean(dim=(0, 1)), alpha=0.1)
            return h - self.running
        raise AssertionError(op)

    def forward(self, x):
        h, middle = self.project(x), None
        for i, (op, residual) in enumerate(self.ops):
            out = self._op(i, op, h)
            h = h + out if residual else out
            if i == len(self.ops) // 2:
                middle = h
        if self.two_outputs:
            return h.pow(2).mean(), middle.sum(-1).tanh().mean()
        return h.pow(2).mean()


def _loss(out):
    return out[0] + 0.5 * out[1] if isinstance(out, tuple) else out


models = st.builds(
    lambda ops, two, seed: (ops, two, seed),
    st.lists(st.tuples(st.sampled_from(OPS), st.booleans()), min_size=2, max_size=7),
    st.booleans(), st.integers(0, 2**16))
budgets = st.one_of(st.just("floor"), st.sampled_from([0.0, 0.5, 1.0]),
                    st.floats(0.0, 1.0))


def _fresh(drawn):
    ops, two, seed = drawn
    torch.manual_seed(seed)
    model = Drawn(ops, two, seed)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed + 1))
    return model, (x,)


def _planned_step(drawn, budget, compiler, reference):
    """The gradients of one step under fxckpt at ``budget`` against
    ``reference``'s; at "floor", first budget=1, whose BudgetError names
    the floor, then that floor, met as measured."""
    model, inputs = _fresh(drawn)
    expected = reference(copy.deepcopy(model), inputs)
    if budget == "floor":
        torch._dynamo.reset()
        backend = fxckpt.backend(budget=1, compiler=compiler)
        with pytest.raises(fxckpt.BudgetError) as refused:
            run_step(torch.compile(copy.deepcopy(model), backend=backend), inputs, _loss)
        budget = refused.value.floor_bytes
        assert budget is not None, str(refused.value)
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    compiled = torch.compile(planned, backend=fxckpt.backend(budget=budget, compiler=compiler))
    got = run_step(compiled, inputs, _loss)
    if isinstance(budget, int):
        def step():
            planned.zero_grad(set_to_none=True)
            torch.manual_seed(0)
            _loss(compiled(*inputs)).backward()
        step()
        measured = measure_peak_bytes(step)
        assert measured <= budget, (measured, budget)
    torch._dynamo.reset()
    return expected, got


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(models, budgets)
def test_drawn_models_train_bitwise_under_the_eager_compiler(reset_dynamo, drawn, budget):
    torch.set_num_threads(1)
    expected, got = _planned_step(drawn, budget, "eager",
                                  lambda model, inputs: run_step(model, inputs, _loss))
    assert_bitwise_equal(expected, got)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(models, budgets)
def test_drawn_models_match_inductor_under_inductor(reset_dynamo, drawn, budget):
    torch.set_num_threads(1)

    def reference(model, inputs):
        torch._dynamo.reset()
        return run_step(torch.compile(model), inputs, _loss)

    with inductor_config.patch(fallback_random=True):
        expected, got = _planned_step(drawn, budget, "inductor", reference)
    assert_close(expected, got, rtol=1e-5, atol=1e-6)

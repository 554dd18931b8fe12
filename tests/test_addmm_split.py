"""fxckpt/inductor/addmm.py: an ``addmm`` whose add comes late is split back into a
matmul made as soon as its operands are and an add where the ``addmm`` was,
where that holds fewer bytes; under Inductor, a tied head's gradient
matmul then runs at the start of the backward, not at its end, in fxckpt's
own plans (torch's partition, the default plan, compiles as torch's)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fxckpt
from fxckpt.inductor.addmm import SplitLateAddmm

_aten = torch.ops.aten


def _late_addmm(a, b, c):
    g, h = a.relu(), b.relu()
    late = c.sin()               # made after both operands
    return torch.addmm(late, g, h)


def _traced(fn, *shapes):
    inputs = [torch.randn(*shape) for shape in shapes]
    return make_fx(fn, tracing_mode="fake")(*inputs), inputs


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_late_addmm_is_split_with_the_matmul_after_its_operands():
    gm, _ = _traced(_late_addmm, (8, 256), (256, 8), (8, 8))
    SplitLateAddmm()(gm.graph)
    gm.recompile()
    targets = _targets(gm)
    assert _aten.addmm.default not in targets
    assert targets.index(_aten.mm.default) < targets.index(_aten.sin.default) \
        < targets.index(_aten.add.Tensor)
    a, b, c = torch.randn(8, 256), torch.randn(256, 8), torch.randn(8, 8)
    torch.testing.assert_close(gm(a, b, c), _late_addmm(a, b, c))


def test_addmm_kept_where_splitting_holds_more_or_its_input_comes_first():
    # The product (256 x 256) is larger than the operands it frees.
    gm, _ = _traced(_late_addmm, (256, 8), (8, 256), (256, 256))
    SplitLateAddmm()(gm.graph)
    assert _aten.addmm.default in _targets(gm)

    # A linear layer's addmm: its bias is an input, ready before the operands.
    def linear(x, w, bias):
        return torch.addmm(bias, x.relu(), w.relu())
    gm, _ = _traced(linear, (8, 256), (256, 8), (8,))
    SplitLateAddmm()(gm.graph)
    assert _aten.addmm.default in _targets(gm)


class _TiedLM(torch.nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mid = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        return self.head(F.gelu(self.mid(self.embed(idx))))


def _late_addmms(solver: str) -> list[str]:
    """The zoo-like tied LM compiled by fxckpt under Inductor with
    ``solver``: the addmm nodes of its backward code that add a value the
    backward made (not an input: a bias)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model, idx = _TiedLM(), torch.randint(0, 64, (4, 32))
    step = torch.compile(lambda: F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()),
                         backend=fxckpt.backend(solver=solver))
    _, codes = run_and_get_code(lambda: step().backward())
    backward = [code for code in codes if "tangents_1" in code]
    assert backward, "no backward code captured"
    assert model.embed.weight.grad is not None
    inputs = re.search(r"^\s*(.*) = args$", backward[0], re.M)[1].split(", ")
    added = re.findall(r"extern_kernels\.addmm\((\w+),", backward[0])
    return [name for name in added if name not in inputs]


@pytest.mark.slow
def test_tied_head_gradient_is_not_accumulated_at_the_end_of_backward(reset_dynamo):
    # fxckpt's own plans: the embedding's gradient, made last, is added to
    # a head gradient made at the start.
    assert _late_addmms("save_all") == []
    # torch's own partition (the default plan) compiles as torch.compile
    # does, the head's gradient fused into one addmm at the end.
    torch._dynamo.reset()
    assert len(_late_addmms("auto")) == 1

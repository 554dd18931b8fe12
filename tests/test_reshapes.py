"""F.linear's output reshape is planned as the view it is on every release
(fxckpt/passes/reshapes.py): torch 2.15 writes ``_unsafe_view(addmm)``
where earlier releases write ``view(addmm)``."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import fxckpt
from fxckpt.passes.reshapes import linear_views

pytestmark = pytest.mark.releases
aten = torch.ops.aten


def _graph(after: str) -> fx.GraphModule:
    graph = fx.Graph()
    x, w, b = (graph.placeholder(name) for name in ("x", "w", "b"))
    made = {"addmm": lambda: graph.call_function(aten.addmm.default, (b, x, w)),
            "mm": lambda: graph.call_function(aten.mm.default, (x, w)),
            "clone": lambda: graph.call_function(aten.clone.default, (x,))}[after]()
    graph.output(graph.call_function(aten._unsafe_view.default, (made, [2, 3, 4])))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_an_addmm_reshaped_by_unsafe_view_becomes_a_view():
    gm = _graph("addmm")
    viewed = linear_views(gm)
    assert viewed is not gm
    targets = [n.target for n in viewed.graph.nodes if n.op == "call_function"]
    assert targets == [aten.addmm.default, aten.view.default]
    # The graph given is not edited.
    assert aten._unsafe_view.default in [n.target for n in gm.graph.nodes]
    x, w, b = torch.randn(6, 5), torch.randn(5, 4), torch.randn(4)
    assert torch.equal(viewed(x, w, b), gm(x, w, b))


@pytest.mark.parametrize("after", ["mm", "clone"])
def test_other_unsafe_views_stay_as_every_release_writes_them(after):
    gm = _graph(after)
    assert linear_views(gm) is gm


def test_the_demo_gpts_floor_is_the_same_on_every_release():
    """The demo's GPT (4 layers, n_embd 128, sequence 128): its floor under
    compiler="eager" is 9,275,776 B, as torch 2.13 traces it; on 2.15, with
    F.linear's _unsafe_view priced as a copy, it was 11,046,720 B."""
    from fxckpt.models import make_model

    model, inputs, _ = make_model("gpt", size="small")
    with pytest.raises(fxckpt.BudgetError) as refused:
        fxckpt.explain(model, *inputs, budget=1, compiler="eager")
    assert refused.value.floor_bytes == 9_275_776

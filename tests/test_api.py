"""The public API: options, transform, explain, the registered backend, and
clear answers to bad input."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxckpt
from fxckpt.options import Budget, parse_budget

try:
    from tests.harness import assert_bitwise_equal, run_step
except ImportError:  # pragma: no cover
    from harness import assert_bitwise_equal, run_step


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.2, self.training))


def _net():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 16),)


def _loss(y):
    return y.square().mean()


pytestmark = [pytest.mark.usefixtures("reset_dynamo"), pytest.mark.releases]


# -- budgets ---------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (1024, Budget(bytes=1024)),
    ("512MiB", Budget(bytes=512 * 2**20)),
    ("2GB", Budget(bytes=2 * 10**9)),
    ("1.5 GiB", Budget(bytes=int(1.5 * 2**30))),
    ("4096", Budget(bytes=4096)),
    (0.5, Budget(fraction=0.5)),
    (1.0, Budget(fraction=1.0)),
    (0.0, Budget(fraction=0.0)),
    ("0.5", Budget(fraction=0.5)),
    ("50%", Budget(fraction=0.5)),
    ("100%", Budget(fraction=1.0)),
    (None, None),
])
def test_budget_forms(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", [-1, 0, "lots", "12 parsecs", 1.5, -0.1, True, [1],
                                   "1.5", "150%", "x%"])
def test_bad_budgets_say_what_is_accepted(value):
    with pytest.raises(ValueError, match="512MiB"):
        fxckpt.backend(budget=value)


def test_unknown_compiler_and_solver():
    with pytest.raises(ValueError, match="inductor"):
        fxckpt.backend(compiler="nope")
    with pytest.raises(ValueError, match="auto"):
        fxckpt.backend(solver="nope")


def test_unknown_option_key_through_torch_compile():
    model, inputs = _net()
    compiled = torch.compile(model, backend="fxckpt", options={"budjet": 1})
    with pytest.raises(Exception, match="budjet"):
        compiled(*inputs)


# -- entry points ------------------------------------------------------------

def test_registered_backend_by_name_matches_eager():
    model, inputs = _net()
    ref = run_step(model, inputs, _loss)
    model2, _ = _net()
    compiled = torch.compile(model2, backend="fxckpt", options={"compiler": "eager"})
    assert_bitwise_equal(ref, run_step(compiled, inputs, _loss))


def test_transform_symbolic_traced_module_same_gradients():
    model, inputs = _net()
    ref = run_step(model, inputs, _loss)
    traced = torch.fx.symbolic_trace(_net()[0])
    transformed = fxckpt.transform(traced, *inputs, solver="recompute_all")
    assert isinstance(transformed, nn.Module)
    assert transformed.plan is not None and transformed.plan.recomputed
    got = run_step(transformed, inputs, _loss)
    got.grads = {k.removeprefix("module."): v for k, v in got.grads.items()}
    assert_bitwise_equal(ref, got, check_buffers=False)
    # The transformed module trains the traced module's own parameters.
    assert {n for n, _ in transformed.named_parameters()} == \
        {"module." + n for n, _ in traced.named_parameters()}


def test_transform_keeps_output_structure():
    class TwoOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return {"a": y.relu(), "b": (y.sin(), y.cos())}

    torch.manual_seed(0)
    m = TwoOut()
    x = torch.randn(2, 4)
    out = fxckpt.transform(torch.fx.symbolic_trace(m), x)(x)
    ref = m(x)
    assert set(out) == {"a", "b"} and torch.equal(out["a"], ref["a"])
    assert torch.equal(out["b"][1], ref["b"][1])


def test_transform_rejects_plain_module():
    with pytest.raises(TypeError, match="symbolic_trace"):
        fxckpt.transform(_net()[0], torch.randn(8, 16))


def test_explain_returns_a_readable_plan_without_touching_the_model():
    model, inputs = _net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    plan = fxckpt.explain(model, *inputs)
    assert isinstance(plan, fxckpt.Plan)
    assert plan.saved_bytes > 0 and plan.peak_bytes >= plan.saved_bytes
    assert plan.saved and isinstance(plan.recompute_flops, int)
    text = str(plan)
    assert "saved" in text and "predicted peak" in text and "addmm" in text
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


def test_explain_graph_module_matches_explain_module():
    model, inputs = _net()
    a = fxckpt.explain(model, *inputs)
    b = fxckpt.explain(torch.fx.symbolic_trace(model), *inputs)
    assert a.saved_bytes == b.saved_bytes


# -- bad input -----------------------------------------------------------------

def test_nothing_requires_grad_runs_without_a_plan():
    """Documented: with no backward there is nothing to save; the graph runs
    as compiled, no plan is recorded, and explain says why."""
    model, inputs = _net()
    for p in model.parameters():
        p.requires_grad_(False)
    be = fxckpt.backend(compiler="eager")
    model.eval()
    out = torch.compile(model, backend=be)(*inputs)
    assert torch.equal(out, model(*inputs))
    assert be.plans == [] and be.graphs_without_backward == 1
    with pytest.raises(fxckpt.FxckptError, match="nothing requires grad"):
        fxckpt.explain(model, *inputs)


def test_no_grad_mode_runs_without_a_plan():
    model, inputs = _net()
    model.eval()
    be = fxckpt.backend(compiler="eager")
    with torch.no_grad():
        out = torch.compile(model, backend=be)(*inputs)
    assert torch.equal(out, model(*inputs)) and be.plans == []


def test_model_dynamo_cannot_capture_is_reported_by_explain():
    class Opaque(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        @torch._dynamo.disable
        def forward(self, x):
            return (self.w * x).sum()

    with pytest.raises(fxckpt.FxckptError, match="captured no graph"):
        fxckpt.explain(Opaque(), torch.ones(3))


calls_of_double = []


@torch.library.custom_op("fxckpt_test::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    calls_of_double.append(1)
    return x * 2


_double.register_fake(lambda x: torch.empty_like(x))
_double.register_autograd(lambda ctx, g: g * 2)


class _CustomBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return _double(self.fc(x)).tanh()


def _custom_blocks(checkpointed: bool) -> nn.Module:
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(_CustomBlock(), _CustomBlock(), _CustomBlock())
    if checkpointed:
        for block in model:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def test_custom_op_is_not_recomputed_outside_a_checkpoint_region():
    """An op fxckpt knows nothing about could be impure: it is saved, never
    run twice (even by solver="recompute_all"), and gradients stay exact."""
    model = _custom_blocks(False)
    x = torch.randn(4, 8)
    ref = run_step(model, (x,), _loss)
    be = fxckpt.backend(compiler="eager", solver="recompute_all")
    compiled = torch.compile(model, backend=be)
    run_step(compiled, (x,), _loss)
    calls_of_double.clear()
    got = run_step(compiled, (x,), _loss)
    assert len(calls_of_double) == 3
    assert_bitwise_equal(ref, got)
    custom = [e for e in be.plans[0].entries if "double" in e.op]
    assert custom and all(e.action == "saved" for e in custom)
    assert "custom op" in custom[0].reason


@pytest.mark.parametrize("where", ["region", "per_block"])
def test_custom_op_runs_again_where_torch_would_run_it_again(where):
    """Inside a torch.utils.checkpoint region the user asked for its ops to
    run again, and torch.compile runs a custom op there again; so does
    fxckpt, and so does solver="per_block", which stands for such a region
    around each block: as many calls as torch.compile makes (one more than
    the forward's three: the last block's, the others' outputs being saved
    at the boundaries), and gradients bitwise."""
    x = torch.randn(4, 8)
    reference = run_step(_custom_blocks(False), (x,), _loss)

    def calls(model, backend) -> int:
        compiled = torch.compile(model, backend=backend)
        run_step(compiled, (x,), _loss)
        calls_of_double.clear()
        got = run_step(compiled, (x,), _loss)
        assert_bitwise_equal(reference, got)
        return len(calls_of_double)

    torch._dynamo.reset()
    torchs = calls(_custom_blocks(True), "aot_eager")
    torch._dynamo.reset()
    be = fxckpt.backend(compiler="eager", **({"solver": "per_block"} if where == "per_block" else {}))
    ours = calls(_custom_blocks(where == "region"), be)
    assert torchs > 3 and ours == torchs
    double = [e for e in be.plans[0].entries if "double" in e.op]
    assert any(e.action == "recomputed" for e in double)


def test_must_recompute_on_impossible_value_names_node(tmp_path):
    from fxckpt.errors import PolicyError
    from fxckpt.passes.tag import _tag_one
    from fxckpt.types import NodeProfile
    from torch.utils.checkpoint import CheckpointPolicy

    node = NodeProfile(name="add_", op="aten.add_.Tensor", phase="forward", inputs=(),
                       bytes=4, storage="add_", not_recomputable="mutates its input in place",
                       source="model.py:3 x.add_(1)")
    with pytest.raises(PolicyError, match=r"add_.*model.py:3"):
        _tag_one(node, None, CheckpointPolicy.MUST_RECOMPUTE)


def test_explain_merges_the_plans_of_a_model_split_by_a_graph_break():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            torch._dynamo.graph_break()
            return self.fc2(h).sin()

    torch.manual_seed(0)
    model, x = Broken(), torch.randn(8, 16)
    plan = fxckpt.explain(model, x)
    assert plan.graph_id == -1 and "2 graphs" in plan.notes[0]
    assert any(n.startswith("g") and "." in n for n in plan.saved)
    assert plan.saved_bytes > 0 and plan.peak_bytes >= plan.saved_bytes
    assert "predicted peak" in str(plan)

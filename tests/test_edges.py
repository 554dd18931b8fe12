"""Edges a user reaches: torch.compile's ``mode``, pickling a compiled
module, a ``policy=`` keyword meant for the user's function, and models on
the meta device."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

import fxckpt
from fxckpt.compat.inductor import CustomGraphPass, inductor_config


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _ReadsAutotune(CustomGraphPass):
    """A user's post-grad pass that notes Inductor's max_autotune setting
    as each graph compiles."""

    def __init__(self):
        self.seen: list[bool] = []

    def __call__(self, graph) -> None:
        self.seen.append(bool(inductor_config.max_autotune))

    def uuid(self):
        return None


def _autotune_seen(make_compiled) -> list[bool]:
    torch.manual_seed(0)
    model = _Mlp()
    reads = _ReadsAutotune()
    with inductor_config.patch(post_grad_custom_post_pass=reads):
        make_compiled(model)(torch.randn(4, 8)).sum().backward()
    return reads.seen


@pytest.mark.slow
def test_mode_reaches_fxckpts_inductor_compiles_under_both_backend_forms(reset_dynamo):
    mode = "max-autotune-no-cudagraphs"
    default = _autotune_seen(lambda m: torch.compile(m, backend=fxckpt.backend(budget=0.5)))
    assert default and not any(default)
    torch._dynamo.reset()
    seen = _autotune_seen(lambda m: torch.compile(m, backend=fxckpt.backend(budget=0.5),
                                                  mode=mode))
    assert seen and all(seen)
    torch._dynamo.reset()
    seen = _autotune_seen(lambda m: torch.compile(m, backend="fxckpt", mode=mode))
    assert seen and all(seen)
    torch._dynamo.reset()
    seen = _autotune_seen(lambda m: torch.compile(
        m, backend="fxckpt", options={"budget": 0.5, "mode": mode}))
    assert seen and all(seen)


def test_modes_fxckpt_cannot_honour_are_refused_naming_why():
    with pytest.raises(ValueError, match="configures Inductor.*compiler='eager'"):
        fxckpt.backend(compiler="eager", mode="max-autotune-no-cudagraphs")
    with pytest.raises(ValueError, match="captures CUDA graphs"):
        fxckpt.backend(mode="reduce-overhead")
    with pytest.raises(ValueError, match="not a torch.compile mode"):
        fxckpt.backend(mode="fastest")
    with pytest.raises(TypeError, match="fxckpt's options go to fxckpt.backend"):
        fxckpt.backend()(torch.fx.symbolic_trace(_Mlp()), [torch.randn(2, 8)],
                         options={"budget": 1})


def test_mode_through_torch_compile_under_the_eager_compiler_is_refused(reset_dynamo):
    compiled = torch.compile(_Mlp(), backend=fxckpt.backend(compiler="eager"),
                             mode="max-autotune-no-cudagraphs")
    with pytest.raises(Exception, match="configures Inductor"):
        compiled(torch.randn(4, 8))


def test_a_compiled_module_pickles_and_trains_as_the_original(reset_dynamo):
    torch.manual_seed(0)
    model = _Mlp()
    x = torch.randn(4, 8)
    compiled = fxckpt.compile(model, budget=0.5, compiler="eager")
    compiled(x).sum().backward()
    again = pickle.loads(pickle.dumps(compiled))
    assert type(again) is type(compiled)
    assert again.fxckpt_report.budget == compiled.fxckpt_report.budget
    grads = [p.grad.clone() for p in model.parameters()]
    again(x).sum().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(again._orig_mod.parameters(), grads))
    assert len(again.fxckpt_report.plans) == 1


def test_a_policy_keyword_meant_for_the_function_names_the_collision():
    def scaled(x, policy):
        return x * policy

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"takes the keyword policy= for itself.*"
                                        r"functools.partial\(.*scaled, policy=\.\.\.\)"):
        fxckpt.checkpoint(scaled, x, policy=2.0)
    bound = fxckpt.checkpoint(functools.partial(scaled, policy=2.0), x)
    assert torch.equal(bound, x * 2.0)


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_a_model_on_the_meta_device_is_planned_under_a_byte_budget(reset_dynamo, compiler):
    """The meta device holds no values and no memory: the memory model
    plans it, and nothing is read off its tensors."""
    model = _Mlp().to("meta")
    backend = fxckpt.backend(budget=100_000, compiler=compiler)
    out = torch.compile(model, backend=backend)(torch.randn(4, 8, device="meta"))
    out.sum().backward()
    assert model.up.weight.grad.device.type == "meta"
    assert len(backend.plans) == 1 and backend.plans[0].peak_bytes <= 100_000

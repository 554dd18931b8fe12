"""fxckpt.compile on models Dynamo cannot compile in one graph.

Four kinds of deliberate break inside a submodule (``Body``): an
``.item()``-driven branch, a ``print``, a ``requires_grad`` setattr, and a
Dynamo-disabled forward pre-hook (like FSDP2's); and a Hugging Face Llama
with activation checkpointing whose attention kernel Dynamo cannot trace.

Each is compared with plain eager (loss and every gradient bit for bit,
dropout included) and, for memory, with ``torch.compile(backend="aot_eager")``
and with torch's own fallback (``torch.utils.checkpoint`` around the
breaking submodule, which Dynamo then runs eagerly): bytes saved for
backward are measured with saved-tensor hooks over one forward, parameters
excluded. The numbers are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import fxckpt
from fxckpt.bench.measure import measure_saved_bytes
from fxckpt.policies import recompute_all, save_matmuls

try:  # run as package ``tests``
    from tests.harness import assert_bitwise_equal, run_step
    from tests.zoo import ZOO
except ImportError:  # tests/ itself on sys.path
    from harness import assert_bitwise_equal, run_step  # type: ignore
    from zoo import ZOO  # type: ignore

D, BATCH = 64, 64
KINDS = ["item", "print", "requires_grad", "disabled_hook"]


pytestmark = [pytest.mark.usefixtures("reset_dynamo"), pytest.mark.releases]


@pytest.fixture(autouse=True)
def _quiet_graph_break_warnings():
    torch._logging.set_logs(graph_breaks=False)
    yield
    torch._logging.set_logs()


@torch._dynamo.disable
def _count_call(module, args):
    """A forward pre-hook with a side effect, Dynamo-disabled like FSDP2's:
    it must run once per forward, never again in a recomputation."""
    module.hook_calls += 1


class Body(nn.Module):
    """The submodule Dynamo breaks: an MLP with dropout and a residual."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc1 = nn.Linear(D, 4 * D)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(4 * D, D)
        self.hook_calls = 0
        if kind == "disabled_hook":
            self.register_forward_pre_hook(_count_call)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.gelu(self.fc1(x)))
        if self.kind == "item":
            if h.mean().item() > 0:
                h = h * 2
        elif self.kind == "print":
            print("Body.forward: a graph break")
        elif self.kind == "requires_grad":
            self.fc2.weight.requires_grad = True
        return x + self.fc2(h)


class Net(nn.Module):
    """A compiled stem and head around the body."""

    def __init__(self, kind: str, *, torch_checkpoint: bool = False, checkpoint=None) -> None:
        super().__init__()
        self.checkpoint = (checkpoint if checkpoint is not None
                           else torch.utils.checkpoint.checkpoint if torch_checkpoint else None)
        self.stem = nn.Sequential(nn.Linear(32, 4 * D), nn.GELU(), nn.Dropout(0.1),
                                  nn.Linear(4 * D, D), nn.Tanh())
        self.body = Body(kind)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        if self.checkpoint is not None:
            h = self.checkpoint(self.body, h, use_reentrant=False)
        else:
            h = self.body(h)
        return self.head(self.norm(h))


def make_net(kind: str, **kwargs):
    torch.manual_seed(0)
    model = Net(kind, **kwargs).train()
    x = torch.randn(BATCH, 32)
    target = torch.randint(0, 10, (BATCH,))
    return model, (x,), lambda out: F.cross_entropy(out, target)


def saved_bytes(module: nn.Module, inputs: tuple, loss_fn, *, compiled: bool = False) -> int:
    """Bytes one forward saves for backward, measured once a first step has
    compiled the module (run here unless ``compiled``)."""
    if not compiled:
        loss_fn(module(*inputs)).backward()
    report = measure_saved_bytes(lambda: module(*inputs),
                                 exclude=[*module.parameters(), *module.buffers()])
    loss_fn(report.output).backward()
    return report.total_bytes


# ---------------------------------------------------------------------------
# Four kinds of break
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_breaks_fall_back_bitwise_and_save_less(kind, capsys):
    """Without a budget the compiled graphs run fxckpt's runtime-optimal plan
    (under compiler="eager": recompute only what costs nothing, or what no
    reader needs materialised) and the breaking body runs at its floor: no
    more saved than aot_eager, nor than torch's fallback where the body is a
    region as torch's checkpoint is (with the disabled hook the body compiles
    whole and only torch's fallback checkpoints it). With a policy that
    recomputes what it can (``recompute_all()``) the graphs trade recompute
    for memory too, and the step saves less than both. (A floor budget would
    minimise the step's peak, not its saved bytes.)"""
    model, inputs, loss_fn = make_net(kind)
    reference = run_step(copy.deepcopy(model), inputs, loss_fn)
    compiled = fxckpt.compile(copy.deepcopy(model), compiler="eager")
    assert_bitwise_equal(reference, run_step(compiled, inputs, loss_fn))
    recomputing = fxckpt.compile(copy.deepcopy(model), compiler="eager",
                                 policy=recompute_all())
    assert_bitwise_equal(reference, run_step(recomputing, inputs, loss_fn))

    for report in (compiled.fxckpt_report, recomputing.fxckpt_report):
        if kind == "disabled_hook":
            # The hook breaks the caller's graph; the body's forward compiles
            # whole, and no checkpoint is put around the hook.
            assert report.fallback_modules == []
            assert [s.module for s in report.kept] == [""] and "hooks" in report.kept[0].note
        else:
            assert report.fallback_modules == ["body"]
            assert report.regions[0].saved_bytes == BATCH * D * 4  # only its input
        text = str(report)
        assert "body" in text and report.graphs and all(g.plan for g in report.graphs)

    default = saved_bytes(compiled, inputs, loss_fn, compiled=True)
    ours = saved_bytes(recomputing, inputs, loss_fn, compiled=True)
    aot_eager = saved_bytes(torch.compile(copy.deepcopy(model), backend="aot_eager"),
                            inputs, loss_fn)
    fallback_model, _, _ = make_net(kind, torch_checkpoint=True)
    torch_fallback = saved_bytes(torch.compile(fallback_model, backend="aot_eager"),
                                 inputs, loss_fn)
    with capsys.disabled():
        print(f"\n[{kind}] saved for backward: fxckpt.compile {default} B "
              f"(recompute_all: {ours} B), aot_eager {aot_eager} B, torch checkpoint "
              f"fallback {torch_fallback} B")
    assert default <= aot_eager
    if kind != "disabled_hook":
        assert default <= torch_fallback
    assert ours < 0.8 * aot_eager
    assert ours < torch_fallback
    if kind == "disabled_hook":
        # Once per step under fxckpt; torch's checkpoint runs it again in backward.
        assert hook_calls_per_step(compiled, inputs, loss_fn) == 1
        assert hook_calls_per_step(recomputing, inputs, loss_fn) == 1
        assert hook_calls_per_step(torch.compile(fallback_model, backend="aot_eager"),
                                   inputs, loss_fn) == 2


class TwiceNet(Net):
    """The breaking body runs twice: once plain, once under the model's own
    checkpoint (torch's or fxckpt's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.stem(x))
        h = self.checkpoint(self.body, h, use_reentrant=False)
        return self.head(self.norm(h))


@pytest.mark.parametrize("checkpoint", [torch.utils.checkpoint.checkpoint, fxckpt.checkpoint],
                         ids=["torch", "fxckpt"])
def test_region_call_inside_the_models_own_checkpoint_is_left_to_it(checkpoint):
    """The breaking body becomes a fallback region (its plain call breaks);
    its call under the model's own checkpoint is recognised as enclosed and
    left to that checkpoint, not checkpointed a second time inside it."""
    torch.manual_seed(0)
    model = TwiceNet("item", checkpoint=checkpoint).train()
    _, inputs, loss_fn = make_net("item")
    reference = run_step(copy.deepcopy(model), inputs, loss_fn)
    compiled = fxckpt.compile(copy.deepcopy(model), compiler="eager")
    assert_bitwise_equal(reference, run_step(compiled, inputs, loss_fn))
    (region,) = compiled.fxckpt_report.regions
    assert region.module == "body"
    # Per step: the plain call, the call under the checkpoint and its
    # recomputation in backward.
    assert (region.calls, region.enclosed_calls) == (3, 2)


def hook_calls_per_step(module: nn.Module, inputs: tuple, loss_fn) -> int:
    before = module.body.hook_calls
    loss_fn(module(*inputs)).backward()
    return module.body.hook_calls - before


def test_byte_budget_is_shared_with_the_fallback_region():
    """The graph after the region is planned for the budget less what the
    graph before it and the region hold."""
    model, inputs, loss_fn = make_net("item")
    budget = 600_000
    compiled = fxckpt.compile(model, compiler="eager", budget=budget)
    loss_fn(compiled(*inputs)).backward()
    report = compiled.fxckpt_report
    before, after = report.plans
    region = report.regions[0].saved_bytes
    assert before.budget_bytes == budget
    assert after.budget_bytes == budget - before.saved_bytes - region


def test_region_follows_the_policy_and_its_saved_outputs_are_counted():
    """With save_matmuls the region keeps fc1's and fc2's outputs besides
    its input; the bytes it reports include them."""
    model, inputs, loss_fn = make_net("print")
    reference = run_step(copy.deepcopy(model), inputs, loss_fn)
    compiled = fxckpt.compile(model, compiler="eager", policy=save_matmuls())
    got = run_step(compiled, inputs, loss_fn)
    assert_bitwise_equal(reference, got)
    region = compiled.fxckpt_report.regions[0]
    assert region.saved_bytes == BATCH * D * 4 + BATCH * 4 * D * 4 + BATCH * D * 4


def test_report_reads_and_a_deep_copy_has_its_own_region():
    model, inputs, loss_fn = make_net("requires_grad")
    reference = run_step(copy.deepcopy(model), inputs, loss_fn)
    compiled = fxckpt.compile(model, compiler="eager")
    loss_fn(compiled(*inputs)).backward()
    text = str(compiled.fxckpt_report)
    assert "body (Body): saved 16.00 KiB as measured" in text
    assert "policy: everything recomputed (no policy: its floor)" in text
    assert "setattr() on Tensor.requires_grad" in text and "compiled graphs:" in text

    # The region is the module's own forward attribute: the bare model and
    # a deep copy of it run the body checkpointed, each with its own weights.
    twin = copy.deepcopy(model)
    assert twin.body.forward.wrapped.__self__ is twin.body
    assert_bitwise_equal(reference, run_step(twin, inputs, loss_fn))


# ---------------------------------------------------------------------------
# Hugging Face: activation checkpointing around a layer Dynamo breaks
# ---------------------------------------------------------------------------


def _hf_llama(*, gradient_checkpointing: bool):
    """The zoo's tiny Llama, its attention run by a kernel Dynamo cannot trace."""
    pytest.importorskip("transformers")
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    @torch._dynamo.disable
    def untraceable_attention(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("fxckpt_untraceable", untraceable_attention)
    model, inputs, loss_fn = ZOO["hf_llama"].make()
    model.model.set_attn_implementation("fxckpt_untraceable")
    if gradient_checkpointing:  # gradient_checkpointing_enable's new name
        model.model.activation_checkpointing_enable()
    return model, inputs, loss_fn


@pytest.mark.slow
def test_hf_llama_whose_attention_breaks_the_graph(capsys):
    """With gradient checkpointing on, the break inside each checkpointed
    layer makes Dynamo run torch's checkpoint eagerly (torch's fallback);
    the attention regions then leave their activations to it, and fxckpt's
    gain can only be in the compiled graphs: the default plan (under
    compiler="eager" it recomputes only what torch's partitioner would) saves
    no more than torch's fallback, and a policy that recomputes what it can
    saves less. Without it, the regions are what keeps the attention's
    activations from being saved in full: the default plan saves less than
    aot_eager, and with that policy less than half."""
    attention = [f"model.model.layers.{i}.self_attn" for i in range(2)]
    model, inputs, loss_fn = _hf_llama(gradient_checkpointing=True)
    reference = run_step(copy.deepcopy(model), inputs, loss_fn)
    compiled = fxckpt.compile(copy.deepcopy(model), compiler="eager")
    assert_bitwise_equal(reference, run_step(compiled, inputs, loss_fn), check_outputs=False)
    assert compiled.fxckpt_report.fallback_modules == attention
    recomputing = fxckpt.compile(copy.deepcopy(model), compiler="eager",
                                 policy=recompute_all())
    assert_bitwise_equal(reference, run_step(recomputing, inputs, loss_fn), check_outputs=False)
    assert recomputing.fxckpt_report.fallback_modules == attention
    default = saved_bytes(compiled, inputs, loss_fn, compiled=True)
    ours = saved_bytes(recomputing, inputs, loss_fn, compiled=True)
    torch_fallback = saved_bytes(torch.compile(model, backend="aot_eager"), inputs, loss_fn)

    # Without gradient checkpointing, the graph breaks make aot_eager itself
    # differ from eager in the last bits (gradients summed in another order
    # across graphs); fxckpt.compile matches aot_eager bit for bit. Dynamo
    # starts afresh: three more compiles of the same layers' code would pass
    # its recompile limit, and a frame past it runs uncompiled.
    torch._dynamo.reset()
    plain, inputs, loss_fn = _hf_llama(gradient_checkpointing=False)
    aot = torch.compile(copy.deepcopy(plain), backend="aot_eager")
    aot_step = run_step(aot, inputs, loss_fn)
    compiled_plain = fxckpt.compile(copy.deepcopy(plain), compiler="eager")
    assert_bitwise_equal(aot_step, run_step(compiled_plain, inputs, loss_fn), check_outputs=False)
    plain_recomputing = fxckpt.compile(plain, compiler="eager", policy=recompute_all())
    assert_bitwise_equal(aot_step, run_step(plain_recomputing, inputs, loss_fn), check_outputs=False)
    for report in (compiled_plain.fxckpt_report, plain_recomputing.fxckpt_report):
        assert report.fallback_modules == attention
        assert all(r.saved_bytes for r in report.regions)
    default_plain = saved_bytes(compiled_plain, inputs, loss_fn, compiled=True)
    ours_plain = saved_bytes(plain_recomputing, inputs, loss_fn, compiled=True)
    aot_eager = saved_bytes(aot, inputs, loss_fn, compiled=True)
    with capsys.disabled():
        print(f"\n[hf_llama, gradient checkpointing] saved for backward: fxckpt.compile "
              f"{default} B (recompute_all: {ours} B), torch checkpoint fallback (aot_eager) "
              f"{torch_fallback} B")
        print(f"[hf_llama, no checkpointing] saved for backward: fxckpt.compile "
              f"{default_plain} B (recompute_all: {ours_plain} B), aot_eager {aot_eager} B")
    assert default <= torch_fallback and ours < torch_fallback
    assert default_plain < aot_eager
    assert ours_plain < 0.5 * aot_eager

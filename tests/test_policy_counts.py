"""Policies change what runs: exact op counts on the zoo's GPT.

Each test compiles a model with ``fxckpt.backend(compiler="eager", policy=...)``,
checks loss and gradients bitwise against plain eager, then counts the aten ops
one more step runs. What backward recomputes is the backward count minus the
backward count under ``save_all()`` (nothing recomputed), which
``test_save_all_recomputes_nothing`` pins to plain ``aot_eager``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import fxckpt
from fxckpt import policies as pol

try:
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.opcount import DEFAULT_IGNORE, OpCounter, as_torch_counts
    from tests.zoo import GPT, ZOO
except ImportError:  # pragma: no cover - run from inside tests/
    from harness import assert_bitwise_equal, fresh, run_step
    from opcount import DEFAULT_IGNORE, OpCounter, as_torch_counts
    from zoo import GPT, ZOO

aten = torch.ops.aten
MATMULS = (aten.mm, aten.addmm, aten.bmm)
RNG_HOPS = ("run_and_save_rng_state", "run_with_rng_state")


pytestmark = pytest.mark.usefixtures("reset_dynamo")


def _gpt():
    return fresh(ZOO["gpt"])


def _step(model, inputs, loss_fn, counter: OpCounter) -> OpCounter:
    """One seeded step of ``model`` under ``counter``, phase by phase."""
    with counter:
        torch.manual_seed(0)
        counter.phase("forward")
        loss = loss_fn(model(*inputs))
        counter.phase("backward")
        loss.backward()
    return counter


def _step_counts(compiled, inputs, loss_fn) -> OpCounter:
    return _step(compiled, inputs, loss_fn, OpCounter(DEFAULT_IGNORE))


def run_policy(policy, make=_gpt):
    """Compile ``make()``'s model under ``policy``, check a step bitwise against
    eager, and return (op counts of a second step, the backend)."""
    ref_model, inputs, loss_fn = make()
    ref = run_step(ref_model, inputs, loss_fn, seed=0)
    model, inputs, loss_fn = make()
    be = fxckpt.backend(compiler="eager", policy=policy)
    compiled = torch.compile(model, backend=be)
    assert_bitwise_equal(ref, run_step(compiled, inputs, loss_fn, seed=0))
    return _step_counts(compiled, inputs, loss_fn), be


_BASELINES: dict = {}


def baseline(make=_gpt) -> OpCounter:
    """Op counts of a step under save_all(), whose plan recomputes nothing."""
    if make not in _BASELINES:
        counts, be = run_policy(pol.save_all(), make)
        assert not any(plan.recomputed for plan in be.plans)
        _BASELINES[make] = counts
        torch._dynamo.reset()
    return _BASELINES[make]


def rerun(counter: OpCounter, make=_gpt) -> dict[str, int]:
    """Ops backward ran beyond the save-all backward: the recomputed forward ops."""
    extra = Counter(counter.counts["backward"])
    extra.subtract(baseline(make).counts["backward"])
    return dict(as_torch_counts(Counter({str(op): n for op, n in extra.items() if n})))


def compute(extra: dict[str, int]) -> dict[str, int]:
    """``extra`` without views (free) and the RNG replay wrappers."""
    return {op: n for op, n in extra.items()
            if op not in RNG_HOPS and not _is_view(op)}


def _is_view(op_name: str) -> bool:
    packet = getattr(aten, op_name.split(".", 1)[1])
    return any(getattr(packet, o).is_view for o in packet.overloads())


def _matmuls(extra: dict[str, int]) -> dict[str, int]:
    return {op: n for op, n in extra.items() if op in {str(m) for m in MATMULS}}


def _saved_values(plan) -> set[str]:
    """Saved activations: not graph inputs (parameters, tokens), not RNG states."""
    return {e.name for e in plan.entries
            if e.action == "saved" and e.op not in ("input", "rng state")}


class Recorder(pol.Policy):
    """No opinion on anything; records the calls it is asked about, in order."""

    def __init__(self):
        self.calls = []

    def __call__(self, call):
        self.calls.append(call)
        return None


# -- the baseline ----------------------------------------------------------

def test_save_all_recomputes_nothing():
    """save_all()'s backward runs exactly plain aot_eager's matmuls, and its
    forward runs each matmul once."""
    model, inputs, loss_fn = _gpt()
    aot = _step_counts(torch.compile(model, backend="aot_eager"), inputs, loss_fn)
    ours = baseline()
    for op in MATMULS:
        assert ours.counts["backward"][op] == aot.counts["backward"][op], op
        assert ours.counts["forward"][op] == aot.counts["forward"][op], op
    assert ours.counts["forward"][aten.addmm] == 8 and ours.counts["forward"][aten.bmm] == 4


# -- save_matmuls ------------------------------------------------------------

def test_save_matmuls_recomputes_everything_but_matmuls():
    counts, be = run_policy(pol.save_matmuls())
    extra = rerun(counts)
    assert _matmuls(extra) == {}
    # The rest is recomputed: every layer norm, GELU, softmax and dropout.
    assert extra["aten.native_layer_norm"] == 5
    assert extra["aten.gelu"] == 2 and extra["aten._safe_softmax"] == 2
    assert extra["aten.native_dropout"] == 7
    saved_ops = {e.op for e in be.plans[0].entries
                 if e.name in _saved_values(be.plans[0])}
    assert saved_ops == {"aten.addmm.default", "aten.bmm.default"}


def test_save_matmuls_without_batch_dims_recomputes_the_attention_bmms():
    counts, _ = run_policy(pol.save_matmuls(no_batch_dims=True))
    # Both bmms of each layer (scores, and weights x values) run again.
    assert _matmuls(rerun(counts)) == {"aten.bmm": 4}


# -- megatron_selective ----------------------------------------------------

def test_megatron_selective_recomputes_exactly_core_attention():
    counts, be = run_policy(pol.megatron_selective())
    # Per layer: the score bmm, the causal-mask add, the softmax and the
    # attention dropout. The bmm with the values is not needed by backward
    # (its output reaches backward through the saved projection input).
    assert compute(rerun(counts)) == {
        "aten.bmm": 2, "aten.add": 2, "aten._safe_softmax": 2, "aten.native_dropout": 2}
    saved = be.plans[0].saved
    assert not any(name.startswith("_safe_softmax") for name in saved)


class HandAttention(nn.Module):
    """Attention as many models write it: matmul, scale, mask, softmax, dropout."""

    def __init__(self, d=32, heads=4, p=0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        probs = F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), self.p,
                          self.training)
        return x + self.out((probs @ v).transpose(1, 2).reshape(B, T, C))


def _hand_attention():
    torch.manual_seed(0)
    model = nn.Sequential(HandAttention(), HandAttention()).train()
    x = torch.randn(2, 8, 32)
    return model, (x,), lambda y: y.square().mean()


def test_megatron_selective_finds_hand_written_attention():
    counts, _ = run_policy(pol.megatron_selective(), _hand_attention)
    assert compute(rerun(counts, _hand_attention)) == {
        "aten.bmm": 2, "aten.div": 2, "aten.masked_fill": 2, "aten._softmax": 2,
        "aten.native_dropout": 2}


def _gpt_without_dropout():
    torch.manual_seed(0)
    model = GPT(p=0.0).train()
    idx = torch.randint(0, 128, (2, 32))
    return model, (idx,), lambda logits: logits.float().square().mean()


def test_megatron_selective_recomputes_fused_attention():
    """Without dropout, CPU attention stays one fused op in the graph."""
    counts, _ = run_policy(pol.megatron_selective(), _gpt_without_dropout)
    assert compute(rerun(counts, _gpt_without_dropout)) == {
        "aten._scaled_dot_product_flash_attention_for_cpu": 2}


# -- every_nth_matmul --------------------------------------------------------

def test_every_nth_matmul_recomputes_every_second_matmul():
    recorder = Recorder()
    counts, be = run_policy(pol.first(recorder, pol.every_nth_matmul(2)))
    in_order = [c.name for c in recorder.calls if pol.is_matmul(c.op)]
    assert len(in_order) == 13                      # 6 per layer, and the head
    recomputed = {n for n in be.plans[0].recomputed if n in in_order}
    assert recomputed == set(in_order[1::2])        # the 2nd, 4th, ... 12th
    assert sum(_matmuls(rerun(counts)).values()) == 6
    assert _matmuls(rerun(counts)) == {"aten.addmm": 4, "aten.bmm": 2}


# -- save_names --------------------------------------------------------------

class NamedAttention(nn.Module):
    """The zoo's attention, naming the value its output projection reads."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x):
        a = self.attn
        B, T, C = x.shape
        q, k, v = (t.view(B, T, a.n_head, C // a.n_head).transpose(1, 2)
                   for t in a.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=a.p if self.training else 0.0,
                                           is_causal=True)
        y = fxckpt.name(y.transpose(1, 2).contiguous().view(B, T, C), "attn_out")
        return a.resid_drop(a.proj(y))


class NamedMLP(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        m = self.mlp
        return m.drop(m.proj(fxckpt.name(m.act(m.fc(x)), "mlp_hidden")))


def _named_gpt():
    model, inputs, loss_fn = _gpt()
    for block in model.blocks:
        block.attn = NamedAttention(block.attn)
        block.mlp = NamedMLP(block.mlp)
    return model, inputs, loss_fn


def test_save_names_saves_only_the_named_values():
    recorder = Recorder()
    counts, be = run_policy(pol.first(recorder, pol.save_names("attn_out")), _named_gpt)
    named = {c.name for c in recorder.calls if "attn_out" in c.value_names}
    hidden = {c.name for c in recorder.calls if "mlp_hidden" in c.value_names}
    assert len(named) == 2 and len(hidden) == 2
    assert _saved_values(be.plans[0]) == named
    # Everything else is recomputed, the GELU that mlp_hidden names included.
    assert rerun(counts, _named_gpt)["aten.gelu"] == 2


# -- torch's selective checkpointing, unchanged ------------------------------

class Block(nn.Module):
    """A llama-style block without biases, so every linear is an aten.mm; seven
    of them, so that every second mm falls on different projections in each
    block, and the recomputed mms' widths tell which they are."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.wq, self.wk = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.wv, self.wo = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, 3 * d, bias=False)
        self.w2 = nn.Linear(3 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(B, T, self.heads, -1).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TitanNet(nn.Module):
    def __init__(self, vocab=48, d=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _titan_net():
    torch.manual_seed(0)
    idx = torch.randint(0, 48, (2, 16))
    return TitanNet().train(), (idx,), lambda logits: F.cross_entropy(
        logits.flatten(0, 1), idx.flatten())


# torchtitan's selective op checkpointing policy, as users write it for
# torch.utils.checkpoint (plus the CPU flash-attention op).
_save_list = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def _get_custom_policy(meta):
    def _custom_policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        mm_count_key = f"{mode}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[mm_count_key] += 1
        # Saves output of all compute ops, except every second mm
        to_save = func in _save_list and not (
            func == torch.ops.aten.mm.default and meta[mm_count_key] % 2 == 0
        )
        return (
            CheckpointPolicy.MUST_SAVE
            if to_save
            else CheckpointPolicy.PREFER_RECOMPUTE
        )
    return _custom_policy


def _logged(policy_fn, log):
    """``policy_fn``, logging its answer for every mm and attention op."""
    def logging_policy(ctx, func, *args, **kwargs):
        answer = policy_fn(ctx, func, *args, **kwargs)
        if func in _save_list:
            log.append((str(func), answer))
        return answer
    return logging_policy


def whole_model_sac(model, make_policy):
    """torch's eager selective checkpointing around the whole forward, wrapped
    as torchtitan wraps its blocks: one region, one counter, the scope of
    fxckpt's single graph. Each forward gets a fresh policy from ``make_policy``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper)

    return checkpoint_wrapper(
        model, context_fn=lambda: create_selective_checkpoint_contexts(make_policy()))


class ShapeCounter(OpCounter):
    """Counts (op, output shape) of the backward's mm and attention ops."""

    def __init__(self):
        super().__init__()
        self.shapes = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.current == "backward" and func in _save_list:
            first = out if isinstance(out, torch.Tensor) else out[0]
            self.shapes[(str(func), tuple(first.shape))] += 1
        return out


def _matmuls_rerun(model, no_recompute_model, inputs, loss_fn) -> Counter:
    """(op, output shape) of the mms and attention ops ``model``'s backward
    runs beyond the backward of a model that recomputes nothing."""
    extra = _step(model, inputs, loss_fn, ShapeCounter()).shapes
    extra.subtract(_step(no_recompute_model, inputs, loss_fn, ShapeCounter()).shapes)
    return +extra


def test_torchtitan_policy_function_matches_torch_eager_sac():
    from collections import defaultdict

    ref_model, inputs, loss_fn = _titan_net()
    ref = run_step(ref_model, inputs, loss_fn)

    eager_log, fx_log = [], []
    eager_model, _, _ = _titan_net()
    sac = whole_model_sac(eager_model,
                          lambda: _logged(_get_custom_policy(defaultdict(int)), eager_log))
    assert_bitwise_equal(ref, run_step(sac, inputs, loss_fn))

    model, _, _ = _titan_net()
    be = fxckpt.backend(compiler="eager",
                        policy=_logged(_get_custom_policy(defaultdict(int)), fx_log))
    compiled = torch.compile(model, backend=be)
    assert_bitwise_equal(ref, run_step(compiled, inputs, loss_fn))

    # The same ops in the same order get the same answers: 15 mms (7 a block
    # and the head), every second one recomputed; attention saved.
    assert fx_log == eager_log
    answers = [a for op, a in fx_log if op == "aten.mm.default"]
    assert len(answers) == 15
    assert answers[1::2] == [CheckpointPolicy.PREFER_RECOMPUTE] * 7
    assert answers[0::2] == [CheckpointPolicy.MUST_SAVE] * 8

    # And backward runs the same matmuls again, shape for shape.
    eager_rerun = _matmuls_rerun(sac, _titan_net()[0], inputs, loss_fn)
    save_all = torch.compile(_titan_net()[0],
                             backend=fxckpt.backend(compiler="eager", policy=pol.save_all()))
    fx_rerun = _matmuls_rerun(compiled, save_all, inputs, loss_fn)
    assert fx_rerun == eager_rerun
    # Block 0's wk, wo, w3; block 1's wq, wv, w1, w2 (2 x 16 tokens a row).
    assert fx_rerun == {("aten.mm.default", (32, 32)): 5, ("aten.mm.default", (32, 96)): 2}
    attention = [a for op, a in fx_log if "attention" in op]
    assert attention == [CheckpointPolicy.MUST_SAVE] * 2
    # fxckpt keeps the saved mms backward reads: all but the head's, whose
    # output (the logits) backward never reads.
    saved_mms = [e for e in be.plans[0].entries
                 if e.action == "saved" and e.op == "aten.mm.default"]
    assert len(saved_mms) == 7

"""``fxckpt.checkpoint`` as a drop-in for ``torch.utils.checkpoint.checkpoint``.

Each behaviour is compared with torch's non-reentrant checkpoint on the same
function: outputs and gradients bitwise, random ops replayed, and how many
times ops run again in backward (``OpCounter``).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

import fxckpt
from fxckpt.eager import RecomputeMismatchError
from fxckpt.errors import FxckptError
from fxckpt.policies import save_matmuls

from opcount import OpCounter

pytestmark = pytest.mark.releases

aten = torch.ops.aten


def run(ckpt, fn, *inputs, seed: int = 0, **kwargs):
    """(output, input grads, op counter) of ``ckpt(fn, *inputs, **kwargs)``
    followed by a backward of its sum."""
    torch.manual_seed(seed)
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    with OpCounter() as counter:
        counter.phase("forward")
        out = ckpt(fn, *xs, **kwargs)
        counter.phase("backward")
        out.sum().backward()
    return out.detach(), [x.grad for x in xs], counter


def plain(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def assert_same(a, b) -> None:
    out_a, grads_a, _ = a
    out_b, grads_b, _ = b
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b)
    for ga, gb in zip(grads_a, grads_b):
        assert ga is not None and gb is not None
        assert torch.equal(ga, gb)


def torch_ckpt(fn, *args, **kwargs):
    return tuc.checkpoint(fn, *args, use_reentrant=False, **kwargs)


def compare(fn, *inputs, fn_kwargs=None, **kwargs):
    """fxckpt, torch and no checkpoint on ``fn``: all equal; returns the
    fxckpt and torch runs for their op counts. ``fn_kwargs`` go to ``fn``
    through the checkpoint's ``**kwargs``."""
    fn_kwargs = fn_kwargs or {}
    ours = run(fxckpt.checkpoint, fn, *inputs, use_reentrant=False, **kwargs, **fn_kwargs)
    theirs = run(tuc.checkpoint, fn, *inputs, use_reentrant=False, **kwargs, **fn_kwargs)
    assert_same(ours, theirs)
    assert_same(ours, run(plain, fn, *inputs, **fn_kwargs))
    return ours, theirs


def dropout_mlp(x, w, *, scale=1.0):
    h = torch.nn.functional.dropout(torch.relu(x @ w), p=0.3, training=True)
    return (h @ w.t()).tanh() * scale


def chain(x):
    # sin and cos save tensors; the add and mul after the last save do not,
    # so an early-stopped recomputation never runs them.
    return (x.sin().cos() + 1) * 2


X = torch.randn(8, 16)
W = torch.randn(16, 16)


# ---------------------------------------------------------------------------
# 1. Signature: torch's arguments are checkpoint's, the rest go to the function
# ---------------------------------------------------------------------------


def test_torch_arguments_are_not_passed_to_the_function():
    ours, theirs = compare(dropout_mlp, X, W, fn_kwargs={"scale": 3.0}, context_fn=tuc.noop_context_fn,
                           determinism_check="default", debug=False, early_stop=True,
                           preserve_rng_state=True)
    # Equal to no checkpoint: dropout's recomputation drew the forward's mask.
    assert ours[2].counts["backward"] == theirs[2].counts["backward"]


def test_use_reentrant_true_raises_and_names_the_fix():
    x = X.clone().requires_grad_()
    with pytest.raises(FxckptError, match="torch.utils.checkpoint.checkpoint"):
        fxckpt.checkpoint(torch.sin, x, use_reentrant=True)


def test_use_reentrant_left_out_is_non_reentrant_without_warning():
    x = X.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fxckpt.checkpoint(chain, x)
    out.sum().backward()
    theirs = run(tuc.checkpoint, chain, X, use_reentrant=False)
    assert torch.equal(out.detach(), theirs[0]) and torch.equal(x.grad, theirs[1][0])


def test_checkpoint_sequential_use_reentrant_true_raises():
    with pytest.raises(FxckptError, match="use_reentrant"):
        fxckpt.checkpoint_sequential(make_sequential(), 2, X, use_reentrant=True)


def test_unknown_determinism_check_raises():
    with pytest.raises(ValueError, match="determinism_check"):
        fxckpt.checkpoint(torch.sin, X.clone().requires_grad_(), determinism_check="x")


def test_selective_checkpoint_context_fn_is_the_policy():
    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, [aten.mm.default])
    ours, theirs = compare(dropout_mlp, X, W, context_fn=context_fn)
    assert ours[2].counts["backward"][aten.mm] == theirs[2].counts["backward"][aten.mm]
    # The mm outputs are saved: backward runs only the gradient mms, not the
    # forward's again (as without context_fn).
    _, _, full = run(fxckpt.checkpoint, dropout_mlp, X, W, use_reentrant=False)
    assert ours[2].counts["backward"][aten.mm] == full.counts["backward"][aten.mm] - 2


def test_selective_checkpoint_policy_fn():
    def policy_fn(ctx, op, *args, **kwargs):
        if op is aten.tanh.default:
            return tuc.CheckpointPolicy.MUST_SAVE
        return tuc.CheckpointPolicy.PREFER_RECOMPUTE

    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, policy_fn)
    ours, theirs = compare(dropout_mlp, X, W, context_fn=context_fn)
    assert ours[2].counts["backward"][aten.tanh] == theirs[2].counts["backward"][aten.tanh]


def test_selective_context_fn_and_policy_together_raise():
    context_fn = functools.partial(tuc.create_selective_checkpoint_contexts, [aten.mm.default])
    with pytest.raises(ValueError, match="pass one of them"):
        fxckpt.checkpoint(torch.sin, X.clone().requires_grad_(), context_fn=context_fn,
                          policy=save_matmuls())


class _Entered:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def __enter__(self):
        self.log.append(self.name)

    def __exit__(self, *exc):
        return None


def test_other_context_fn_contexts_are_entered_as_in_torch():
    logs = {}
    for ckpt in (fxckpt.checkpoint, tuc.checkpoint):
        log = logs[ckpt] = []
        def context_fn(log=log):
            return _Entered(log, "forward"), _Entered(log, "recompute")
        run(ckpt, dropout_mlp, X, W, use_reentrant=False, context_fn=context_fn)
    assert logs[fxckpt.checkpoint] == ["forward", "recompute"]
    assert logs[fxckpt.checkpoint] == logs[tuc.checkpoint]


# ---------------------------------------------------------------------------
# early_stop
# ---------------------------------------------------------------------------


def nested(x):
    return tuc.checkpoint(chain, x.exp(), use_reentrant=False) * 3


def nested_ours(x):
    return fxckpt.checkpoint(chain, x.exp(), use_reentrant=False) * 3


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_argument(early_stop):
    ours, theirs = compare(chain, X, early_stop=early_stop)
    counts = ours[2].counts["backward"]
    assert counts[aten.add] == theirs[2].counts["backward"][aten.add]
    assert counts[aten.add] == (0 if early_stop else 1)


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_nested(early_stop):
    ours = run(fxckpt.checkpoint, nested_ours, X, use_reentrant=False, early_stop=early_stop)
    theirs = run(tuc.checkpoint, nested, X, use_reentrant=False, early_stop=early_stop)
    assert_same(ours, theirs)
    for op in (aten.sin, aten.exp, aten.add):
        assert ours[2].counts["backward"][op] == theirs[2].counts["backward"][op], op
    # Without early stop the outer recomputation runs the inner function too.
    # (cos's derivative runs one sin in either case)
    assert ours[2].counts["backward"][aten.sin] == (2 if early_stop else 3)


def test_torch_set_checkpoint_early_stop_is_honoured():
    with tuc.set_checkpoint_early_stop(False):
        ours = run(fxckpt.checkpoint, nested_ours, X, use_reentrant=False)
        theirs = run(tuc.checkpoint, nested, X, use_reentrant=False)
        # The context manager overrides the argument, in torch as here.
        overridden = run(fxckpt.checkpoint, chain, X, use_reentrant=False, early_stop=True)
    assert_same(ours, theirs)
    assert ours[2].counts["backward"][aten.sin] == theirs[2].counts["backward"][aten.sin] == 3
    assert overridden[2].counts["backward"][aten.add] == 1


# ---------------------------------------------------------------------------
# debug, determinism_check
# ---------------------------------------------------------------------------


def make_flaky():
    """Adds the first time and subtracts after: the same tensors are saved."""
    calls = []

    def flaky(x):
        calls.append(1)
        y = x + 1 if len(calls) == 1 else x - 1
        return y.sin() * 2
    return flaky


def test_debug_lists_the_ops_of_both_runs():
    x = X.clone().requires_grad_()
    with pytest.raises(RecomputeMismatchError) as error:
        fxckpt.checkpoint(make_flaky(), x, use_reentrant=False, debug=True).sum().backward()
    text = str(error.value)
    assert "Ops of the forward:" in text and "Ops of the recomputation:" in text
    forward, recomputed = text.split("Ops of the recomputation:")
    assert "aten.add" in forward.split("Ops of the forward:")[1]
    assert "aten.sub" in recomputed and "aten.add" not in recomputed


def test_debug_off_gives_no_trace():
    x = X.clone().requires_grad_()
    with pytest.raises(RecomputeMismatchError) as error:
        fxckpt.checkpoint(make_flaky(), x, use_reentrant=False).sum().backward()
    assert "Ops of the forward" not in str(error.value)


def test_torch_set_checkpoint_debug_enabled_is_honoured():
    x = X.clone().requires_grad_()
    with tuc.set_checkpoint_debug_enabled(True):
        with pytest.raises(RecomputeMismatchError, match="Ops of the recomputation"):
            fxckpt.checkpoint(make_flaky(), x, use_reentrant=False).sum().backward()


def test_determinism_check_none_skips_the_check_as_torch_does():
    ours = run(fxckpt.checkpoint, make_flaky(), X, use_reentrant=False,
               determinism_check="none")
    theirs = run(tuc.checkpoint, make_flaky(), X, use_reentrant=False,
                 determinism_check="none")
    assert_same(ours, theirs)


def make_saves_more():
    calls = []

    def saves_more(x):
        calls.append(1)
        y = x.sin()
        if len(calls) > 1:
            y = y.sin()
        return y * 2
    return saves_more


@pytest.mark.parametrize("check", ["default", "none"])
def test_saving_more_without_early_stop_raises_as_torch_does(check):
    x = X.clone().requires_grad_()
    with pytest.raises(tuc.CheckpointError, match="more tensors"):
        tuc.checkpoint(make_saves_more(), x, use_reentrant=False, early_stop=False,
                       determinism_check=check).sum().backward()
    x = X.clone().requires_grad_()
    with pytest.raises(RecomputeMismatchError):
        fxckpt.checkpoint(make_saves_more(), x, use_reentrant=False, early_stop=False,
                          determinism_check=check).sum().backward()
    if check == "none":
        x = X.clone().requires_grad_()
        with pytest.raises(RecomputeMismatchError, match="more tensors"):
            fxckpt.checkpoint(make_saves_more(), x, use_reentrant=False, early_stop=False,
                              determinism_check=check).sum().backward()


# ---------------------------------------------------------------------------
# 2. Profiler ranges and autograd.grad inside the function
# ---------------------------------------------------------------------------


def profiled(x, w):
    with torch.autograd.profiler.record_function("block"):
        h = torch.relu(x @ w)
        with torch.profiler.record_function("inner"):
            h = h.sin()
        out = h @ w
    return out * 2


@pytest.mark.parametrize("early_stop", [True, False])
def test_record_function_is_not_a_mismatch(early_stop):
    ours, theirs = compare(profiled, X, W, early_stop=early_stop)
    assert ours[2].counts["backward"][aten.mm] == theirs[2].counts["backward"][aten.mm]


def test_data_parallel_on_cpu():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))
    wrapped = nn.DataParallel(module)  # enters record_function in forward
    ours, theirs = compare(wrapped, X)
    assert ours[2].counts["backward"][aten.addmm] == theirs[2].counts["backward"][aten.addmm]


def with_inner_grad(x, w):
    # Dropout before and after: the recomputation that the inner grad runs
    # within the forward must leave the forward's random stream alone.
    y = torch.nn.functional.dropout((x @ w).sin(), p=0.3, training=True)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    return torch.nn.functional.dropout(g * y, p=0.3, training=True)


@pytest.mark.parametrize("early_stop", [True, False])
def test_autograd_grad_inside_the_function(early_stop):
    ours, theirs = compare(with_inner_grad, X, W, early_stop=early_stop)
    assert ours[2].counts["backward"][aten.sin] == theirs[2].counts["backward"][aten.sin]


def test_autograd_grad_inside_with_a_policy():
    plain_run = run(plain, with_inner_grad, X, W)
    ours = run(fxckpt.checkpoint, with_inner_grad, X, W, use_reentrant=False,
               policy=save_matmuls())
    assert_same(ours, plain_run)


# ---------------------------------------------------------------------------
# 3. checkpoint_sequential
# ---------------------------------------------------------------------------


def make_sequential() -> nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.2)]
    return nn.Sequential(*layers)


def run_sequential(fn, model, segments, **kwargs):
    torch.manual_seed(1)
    model.zero_grad()
    x = X.clone().requires_grad_()
    with OpCounter() as counter:
        counter.phase("forward")
        out = fn(model, segments, x, use_reentrant=False, **kwargs)
        counter.phase("backward")
        out.sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in model.parameters()]
    return out.detach(), grads, counter


@pytest.mark.parametrize("segments", [1, 2, 4])
def test_checkpoint_sequential_matches_torch(segments):
    model = make_sequential()
    ours = run_sequential(fxckpt.checkpoint_sequential, model, segments)
    theirs = run_sequential(tuc.checkpoint_sequential, model, segments)
    assert_same(ours, theirs)
    for op in (aten.addmm, aten.bernoulli_):
        assert ours[2].counts["backward"][op] == theirs[2].counts["backward"][op], op


def test_checkpoint_sequential_policy():
    model = make_sequential()
    full = run_sequential(fxckpt.checkpoint_sequential, model, 2)
    saved = run_sequential(fxckpt.checkpoint_sequential, model, 2, policy=save_matmuls())
    assert_same(saved, full)
    # The first segment's two addmm are saved instead of recomputed.
    assert saved[2].counts["backward"][aten.addmm] == full[2].counts["backward"][aten.addmm] - 2


def test_checkpoint_sequential_bad_segments():
    with pytest.raises(ValueError, match="segments"):
        fxckpt.checkpoint_sequential(make_sequential(), 13, X, use_reentrant=False)


# ---------------------------------------------------------------------------
# 4. Hugging Face transformers' checkpoint function
# ---------------------------------------------------------------------------


def _hf_grads(make, checkpoint_func):
    model, (ids, labels), loss_fn = make()
    with pytest.warns(FutureWarning):
        model.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    if checkpoint_func is not None:
        for module in model.modules():
            if hasattr(module, "gradient_checkpointing"):
                module._gradient_checkpointing_func = checkpoint_func
    torch.manual_seed(2)
    with OpCounter() as counter:
        counter.phase("forward")
        loss = loss_fn(model(ids, labels))
        counter.phase("backward")
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], counter


@pytest.mark.parametrize("make", ["make_hf_llama", "make_hf_gpt2"])
def test_hf_gradient_checkpointing_func(make):
    pytest.importorskip("transformers")
    import zoo
    builder = getattr(zoo, make)
    ours = _hf_grads(builder, functools.partial(fxckpt.checkpoint, use_reentrant=False))
    theirs = _hf_grads(builder, None)  # transformers' own: torch.utils.checkpoint
    assert_same(ours, theirs)
    assert ours[2].counts["backward"] == theirs[2].counts["backward"]
    with_policy = _hf_grads(builder, functools.partial(
        fxckpt.checkpoint, use_reentrant=False, policy=save_matmuls()))
    assert_same(with_policy, theirs)
    def matmuls(counter):  # GPT-2's Conv1D runs addmm, Llama's Linear mm
        return counter.total(aten.mm, "backward") + counter.total(aten.addmm, "backward")
    assert matmuls(with_policy[2]) < matmuls(ours[2])


# ---------------------------------------------------------------------------
# Where fxckpt differs from torch on purpose, and where it does not
# ---------------------------------------------------------------------------


def test_batchnorm_statistics_are_updated_once():
    x = torch.randn(8, 4)
    bns = {}
    for name, ckpt in (("ours", fxckpt.checkpoint), ("torch", tuc.checkpoint), ("plain", None)):
        torch.manual_seed(0)
        bn = bns[name] = nn.BatchNorm1d(4)
        out = bn(x) if ckpt is None else ckpt(bn, x, use_reentrant=False)
        (out * torch.arange(4.0)).sum().backward()
    assert bns["ours"].num_batches_tracked.item() == bns["plain"].num_batches_tracked.item() == 1
    assert torch.equal(bns["ours"].running_mean, bns["plain"].running_mean)
    assert torch.equal(bns["ours"].running_var, bns["plain"].running_var)
    # torch's recomputation runs BatchNorm again in training mode.
    assert bns["torch"].num_batches_tracked.item() == 2
    assert torch.equal(bns["ours"].weight.grad, bns["plain"].weight.grad)


def test_second_backward_with_retain_graph_as_in_torch():
    runs = {}
    for ckpt in (fxckpt.checkpoint, tuc.checkpoint):
        torch.manual_seed(0)
        x = X.clone().requires_grad_()
        with OpCounter() as counter:
            loss = ckpt(dropout_mlp, x, W, use_reentrant=False).sum()
            counter.phase("backward")
            loss.backward(retain_graph=True)
            first = x.grad.clone()
            loss.backward()
        runs[ckpt] = first, x.grad, counter.counts["backward"]
    ours, theirs = runs[fxckpt.checkpoint], runs[tuc.checkpoint]
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert torch.equal(ours[1], 2 * ours[0])
    assert ours[2][aten.bernoulli_] == theirs[2][aten.bernoulli_] == 2  # one per backward

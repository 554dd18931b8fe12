"""``fxckpt.checkpoint`` where torch's checkpoint is used with other machinery:
inside ``torch.compile(fullgraph=True)``, under an enclosing
``save_on_cpu()``, with a partial ``autograd.grad(inputs=...)`` and under
``torch.func``. Each compares gradients with ``torch.utils.checkpoint`` on the
same function and policy (bitwise), and the step's measured peak with torch's.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.policies import save_matmuls

pytestmark = pytest.mark.releases

aten = torch.ops.aten
_MATMULS = (aten.mm.default, aten.addmm.default)


def _torch_save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def _torch(fn, *args, policy=None):
    if policy is None:
        return tuc.checkpoint(fn, *args, use_reentrant=False)
    return tuc.checkpoint(fn, *args, use_reentrant=False, context_fn=functools.partial(
        create_selective_checkpoint_contexts, _torch_save_matmuls))


# Made outside the compiled functions: Dynamo takes a region's context_fn only
# as a partial of values that exist before tracing (README, drop-in table).
_SAVE_MATMULS = save_matmuls()


def _ours(fn, *args, policy=None):
    return fxckpt.checkpoint(fn, *args, policy=None if policy is None else _SAVE_MATMULS)


def _params(seed=0):
    torch.manual_seed(seed)
    return [torch.randn(*s, requires_grad=True) for s in ((64, 128), (128,), (128, 64))]


def _block(x, w1, b1, w2):
    h = F.dropout(torch.addmm(b1, x, w1).relu(), 0.3, training=True)
    return (h @ w2).tanh().sin()


def _grads(ckpt, *, policy, wrap=None, inputs=None, seed=3):
    params = _params()
    x = torch.randn(32, 64, requires_grad=True)

    def forward(x):
        return ckpt(_block, x, *params, policy=policy)

    f = wrap(forward) if wrap is not None else forward
    torch.manual_seed(seed)
    loss = f(x).square().sum()
    wanted = [x, *params] if inputs is None else [([x, *params])[i] for i in inputs]
    return [loss.detach(), *torch.autograd.grad(loss, wanted)]


def _assert_bitwise(a, b):
    assert len(a) == len(b)
    for i, (p, q) in enumerate(zip(a, b)):
        assert torch.equal(p, q), f"value {i} differs by {(p - q).abs().max()}"


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
@pytest.mark.parametrize("backend", ["aot_eager", "fxckpt"])
def test_inside_a_fullgraph_compile_as_torchs_checkpoint(backend, policy):
    """Under fullgraph=True the call is a checkpoint region of the graph, as
    torch's is (it raised Unsupported while Dynamo skipped it), with the
    policy as the region's selective-checkpoint contexts."""
    def compiled(forward):
        torch._dynamo.reset()  # each form compiles from scratch
        return torch.compile(forward, fullgraph=True, backend=backend)

    ours = _grads(_ours, policy=policy, wrap=compiled)
    theirs = _grads(_torch, policy=policy, wrap=compiled)
    _assert_bitwise(ours, theirs)
    # Random ops replay in the region's recomputation: gradients are those
    # of the step without checkpointing.
    _assert_bitwise(ours, _grads(lambda fn, *a, policy: fn(*a), policy=None, wrap=compiled))


def test_a_policy_in_a_compiled_region_is_asked_per_phase():
    """torch asks the policy while tracing forward and again while tracing the
    recomputation; a counting policy counts each afresh, so both see the same
    answers (every other matmul saved)."""
    from fxckpt.policies.torch_regions import policy_fn_for
    from fxckpt.policies import every_nth_matmul, resolve_policy
    from torch.utils.checkpoint import SelectiveCheckpointContext

    fn = policy_fn_for(resolve_policy(every_nth_matmul(2)))
    forward = SelectiveCheckpointContext(is_recompute=False)
    again = SelectiveCheckpointContext(is_recompute=True)
    ops = [aten.mm.default, aten.relu.default, aten.mm.default, aten.mm.default]
    answers = [fn(forward, op) for op in ops]
    assert answers == [fn(again, op) for op in ops]
    assert [a is CheckpointPolicy.PREFER_RECOMPUTE for a in answers].count(False) >= 1


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_under_save_on_cpu(policy):
    """An enclosing save_on_cpu() moves the checkpoint's inputs to the CPU
    hooks as torch's does; gradients bitwise, peak no higher than torch's."""
    def on_cpu(forward):
        def run(x):
            with torch.autograd.graph.save_on_cpu():
                return forward(x)
        return run

    _assert_bitwise(_grads(_ours, policy=policy, wrap=on_cpu),
                    _grads(_torch, policy=policy, wrap=on_cpu))
    assert _peak(_ours, policy, on_cpu) <= _peak(_torch, policy, on_cpu)


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_partial_autograd_grad(policy):
    """autograd.grad(inputs=...) asking for some of the leaves only."""
    for inputs in ([1], [0, 3]):
        _assert_bitwise(_grads(_ours, policy=policy, inputs=inputs),
                        _grads(_torch, policy=policy, inputs=inputs))


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_peak_and_saved_no_higher_than_torchs(policy):
    assert _peak(_ours, policy) <= _peak(_torch, policy)


def test_torch_func_is_refused_as_torchs_checkpoint_is():
    """torch.func transforms cannot run saved-tensor hooks, which both
    non-reentrant checkpoints are made of: both raise the same error."""
    params = _params()
    x = torch.randn(32, 64)

    def loss(ckpt):
        return lambda x: ckpt(_block, x, *params, policy=None).sum()

    errors = []
    for ckpt in (_torch, _ours):
        with pytest.raises(RuntimeError) as info:
            torch.func.grad(loss(ckpt))(x)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "saved tensor hooks" in errors[0]


def _peak(ckpt, policy, wrap=None) -> int:
    params = _params()
    x = torch.randn(32, 64, requires_grad=True)

    def forward(x):
        return ckpt(_block, x, *params, policy=policy)

    f = wrap(forward) if wrap is not None else forward

    def step():
        torch.manual_seed(3)
        f(x).square().sum().backward()

    step()
    return measure_peak_bytes(step)

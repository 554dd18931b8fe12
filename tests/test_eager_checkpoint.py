"""fxckpt.checkpoint: eager, hook-based checkpointing.

Every numerical check compares with plain eager (no checkpointing) bit for
bit; op counts compare a checkpointed step with the same step in plain eager,
so that ``backward(checkpointed) - backward(plain)`` is exactly what was
recomputed.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import fxckpt
from fxckpt.eager.checkpoint import RecomputeMismatchError
from fxckpt.errors import PolicyError
from fxckpt.naming import name
from fxckpt.policies import (by_module, megatron_selective, resolve_policy,
                             save_all, save_matmuls, save_names, save_ops)

try:  # run as package ``tests``
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.opcount import DEFAULT_IGNORE, OpCounter
    from tests.zoo import ZOO
except ImportError:  # tests/ itself on sys.path
    from harness import assert_bitwise_equal, fresh, run_step  # type: ignore
    from opcount import DEFAULT_IGNORE, OpCounter  # type: ignore
    from zoo import ZOO  # type: ignore

aten = torch.ops.aten


class Recording:
    """Wraps a policy and keeps every question its deciders are asked."""

    def __init__(self, policy, answer=None):
        self.factory = resolve_policy(policy) if policy is not None else None
        self.answer = answer
        self.calls = []

    def for_graph(self):
        inner = self.factory.for_graph() if self.factory is not None else None

        def decide(call):
            self.calls.append(call)
            return inner(call) if inner is not None else self.answer
        return decide


pytestmark = [pytest.mark.usefixtures("reset_dynamo"), pytest.mark.releases]


def _params(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


def _assert_all_equal(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        assert torch.equal(x, y), f"tensor #{i} differs: {(x - y).abs().max()}"


# ---------------------------------------------------------------------------
# The zoo, checkpointed as a whole
# ---------------------------------------------------------------------------


class Checkpointed(nn.Module):
    """Runs the wrapped module under fxckpt.checkpoint. The attribute name
    is one the harness strips from parameter names."""

    def __init__(self, module: nn.Module, policy=None) -> None:
        super().__init__()
        self._checkpoint_wrapped_module = module
        self.policy = policy

    def forward(self, *args):
        return fxckpt.checkpoint(self._checkpoint_wrapped_module, *args,
                                 policy=self.policy)


@pytest.mark.parametrize("policy", [None, save_matmuls(), save_all(), megatron_selective()],
                         ids=repr)
@pytest.mark.parametrize("case", ["mlp", "cnn_bn", "gpt", "resnet_inplace",
                                  "multi_out_embed", "user_checkpoint"])
def test_zoo_bitwise_equal_to_eager(case, policy):
    """Loss, gradients, outputs, buffers (BatchNorm running stats) and the
    RNG state after the step are those of plain eager."""
    module, inputs, loss_fn = fresh(ZOO[case])
    ref = run_step(module, inputs, loss_fn, seed=0)
    rng_ref = torch.get_rng_state()
    module, inputs, loss_fn = fresh(ZOO[case])
    wrapped = Checkpointed(module, policy)
    got = run_step(wrapped, inputs, loss_fn, seed=0)
    assert_bitwise_equal(ref, got)
    assert torch.equal(rng_ref, torch.get_rng_state())


# ---------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------


def _dropout_fn(w1, w2):
    def fn(x):
        h = F.dropout((x @ w1).sin(), 0.5, training=True)
        return F.dropout(h @ w2, 0.3, training=True).cos()
    return fn


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_dropout_replays_bitwise_and_rng_state_after_step(policy):
    w1, w2, x = _params((8, 16), (16, 4), (5, 8))
    fn = _dropout_fn(w1, w2)

    def step(checkpointed):
        torch.manual_seed(1)
        out = (fxckpt.checkpoint(fn, x, policy=save_matmuls() if policy else None)
               if checkpointed else fn(x))
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [w1, w2, x]), torch.get_rng_state()]

    _assert_all_equal(step(False), step(True))


def test_saved_random_op_moves_the_generator_on():
    """A random op whose output is saved does not run in the recomputation;
    the random ops after it must still draw what they drew in the forward."""
    (x,) = _params((6, 6))

    def fn(x):
        noise = torch.randn_like(x)          # saved
        mask = torch.rand_like(x) > 0.5      # recomputed
        return (x * noise).sin() * mask

    def step(policy):
        torch.manual_seed(3)
        out = fn(x) if policy is False else fxckpt.checkpoint(fn, x, policy=policy)
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [x]), torch.get_rng_state()]

    _assert_all_equal(step(False), step(save_ops(aten.randn_like)))


@pytest.mark.parametrize("policy", [None, save_all()], ids=repr)
def test_explicit_generator_replays_and_is_put_back(policy):
    (x,) = _params((6, 6))
    generator = torch.Generator()

    def fn(x):
        noise = torch.randn(x.shape, generator=generator)
        return (x * noise).sin() * (torch.rand(x.shape, generator=generator) > 0.5)

    def step(checkpointed):
        generator.manual_seed(7)
        out = fxckpt.checkpoint(fn, x, policy=policy) if checkpointed else fn(x)
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [x]), generator.get_state()]

    _assert_all_equal(step(False), step(True))


def test_autocast_state_is_replayed():
    (w, x) = _params((8, 8), (4, 8))

    def fn(x):
        return (x @ w).relu() @ w

    def step(checkpointed):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fxckpt.checkpoint(fn, x) if checkpointed else fn(x)
        loss = out.float().sum()           # backward runs outside autocast
        return [loss.detach(), *_grads(loss, [w, x])]

    _assert_all_equal(step(False), step(True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", [None, save_matmuls()], ids=repr)
def test_cuda_dropout_replays_bitwise_and_rng_state_after_step(policy):
    w1, w2, x = (t.detach().cuda().requires_grad_() for t in _params((8, 16), (16, 4), (5, 8)))
    fn = _dropout_fn(w1, w2)

    def step(checkpointed):
        torch.manual_seed(1)
        out = fxckpt.checkpoint(fn, x, policy=policy) if checkpointed else fn(x)
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [w1, w2, x]), torch.get_rng_state(),
                torch.cuda.get_rng_state()]

    _assert_all_equal(step(False), step(True))


def test_preserve_rng_state_false_does_not_replay():
    (x,) = _params((64,))

    def fn(x):
        return F.dropout(x, 0.5, training=True).sin()

    torch.manual_seed(0)
    ref = _grads(fn(x).sum(), [x])[0]
    torch.manual_seed(0)
    got = _grads(fxckpt.checkpoint(fn, x, preserve_rng_state=False).sum(), [x])[0]
    assert not torch.equal(ref, got)


# ---------------------------------------------------------------------------
# Calling conventions
# ---------------------------------------------------------------------------


def test_autograd_grad_and_keyword_arguments_with_nested_structures():
    a, b, c, w = _params((4, 5), (4, 5), (5, 3), (5, 5))

    def fn(a, pair, *, extra, scale=2.0):
        b, rest = pair
        h = (a * b) @ w
        out = {"y": (h.tanh() @ rest["c"]) * scale, "parts": [h.sigmoid(), extra.exp()]}
        return out, (h.relu(),)

    def loss_of(out):
        d, (r,) = out
        return d["y"].sum() + d["parts"][0].pow(2).sum() + d["parts"][1].sum() + r.sum()

    args = (a, (b, {"c": c}))
    ref = loss_of(fn(*args, extra=b, scale=3.0))
    got = loss_of(fxckpt.checkpoint(fn, *args, extra=b, scale=3.0, policy=save_matmuls()))
    _assert_all_equal([ref.detach(), *_grads(ref, [a, b, c, w])],
                      [got.detach(), *_grads(got, [a, b, c, w])])


def test_detached_tensors_and_inputs_without_grad():
    (w,) = _params((6, 6))
    x = torch.randn(3, 6)                      # no grad
    table = torch.randn(6)                     # no grad, captured

    def fn(x, flag):
        h = x @ w
        frozen = h.detach() * 2                # cut from the graph
        with torch.no_grad():
            stats = h.mean(0)                  # computed without grad
        return (h * frozen).sin() + stats + table * flag

    ref = fn(x, 3).sum()
    got = fxckpt.checkpoint(fn, x, 3).sum()
    _assert_all_equal([ref.detach(), *_grads(ref, [w])], [got.detach(), *_grads(got, [w])])


def test_nothing_requires_grad_and_no_grad_mode():
    x = torch.randn(4, 4)
    assert torch.equal(fxckpt.checkpoint(torch.sin, x), x.sin())
    (w,) = _params((4, 4))
    with torch.no_grad():
        out = fxckpt.checkpoint(lambda x: x @ w, x)
    assert not out.requires_grad and torch.equal(out, x @ w)


# ---------------------------------------------------------------------------
# Several backwards, nesting, compiled regions
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, "save_matmuls"])
def test_second_backward_with_retain_graph(policy):
    w1, w2, x = _params((8, 16), (16, 4), (5, 8))
    fn = _dropout_fn(w1, w2)

    def grads_twice(checkpointed):
        for t in (w1, w2, x):
            t.grad = None
        torch.manual_seed(0)
        pol = save_matmuls() if policy else None
        loss = (fxckpt.checkpoint(fn, x, policy=pol) if checkpointed else fn(x)).sum()
        loss.backward(retain_graph=True)
        first = [t.grad.clone() for t in (w1, w2, x)]
        loss.backward()
        return first + [t.grad.clone() for t in (w1, w2, x)]

    ref, got = grads_twice(False), grads_twice(True)
    _assert_all_equal(ref, got)
    _assert_all_equal(got[3:], [2 * g for g in got[:3]])


def test_what_a_checkpoint_saved_is_freed_once_its_backward_is_done():
    """Two checkpoints in a row, the second saving everything: by the time
    backward reaches the first, the second's saved outputs are gone (not
    kept to the end of the whole backward)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    w1, w2, x = _params((8, 16), (16, 16), (5, 8))
    x.requires_grad_(True)
    inside = []

    def second(h):
        t = (h @ w2).tanh()
        inside.append(StorageWeakRef(t.untyped_storage()))
        return t.sin()

    h = fxckpt.checkpoint(lambda x: (x @ w1).relu(), x)
    seen = []
    h.register_hook(lambda grad: seen.append(inside[0].expired()))
    fxckpt.checkpoint(second, h, policy=save_all()).sum().backward()
    assert seen == [True]


def test_double_backward_through_recomputed_tensors():
    (w, x) = _params((5, 5), (3, 5))

    def fn(x):
        return (x @ w).tanh()

    def grad_of_grad(out):
        (gx,) = torch.autograd.grad(out.pow(2).sum(), [x], create_graph=True)
        return _grads(gx.sum(), [w, x])

    _assert_all_equal(grad_of_grad(fn(x)), grad_of_grad(fxckpt.checkpoint(fn, x)))


@pytest.mark.parametrize("inner_policy", [None, "save_matmuls"])
def test_nested_checkpoints(inner_policy):
    w1, w2, w3, x = _params((8, 8), (8, 8), (8, 8), (4, 8))

    def inner(h):
        return F.dropout((h @ w2).sin(), 0.4, training=True)

    def outer(x, checkpointed):
        h = (x @ w1).relu()
        if checkpointed:
            h = fxckpt.checkpoint(inner, h, policy=save_matmuls() if inner_policy else None)
        else:
            h = inner(h)
        return F.dropout(h @ w3, 0.2, training=True).cos()

    def step(checkpointed):
        torch.manual_seed(5)
        out = fxckpt.checkpoint(outer, x, True) if checkpointed else outer(x, False)
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [w1, w2, w3, x]), torch.get_rng_state()]

    _assert_all_equal(step(False), step(True))


def test_compiled_region_inside_is_run_again():
    w1, w2, x = _params((8, 16), (16, 8), (4, 8))

    @torch.compile(backend="aot_eager")
    def block(h):
        return F.dropout(h @ w2, 0.5, training=True).sin()

    def fn(x):
        return block((x @ w1).tanh()).cos()

    def step(checkpointed):
        torch.manual_seed(2)
        with OpCounter(DEFAULT_IGNORE) as counter:
            out = fxckpt.checkpoint(fn, x) if checkpointed else fn(x)
            loss = out.sum()
            counter.phase("backward")
            grads = _grads(loss, [w1, w2, x])
        return [loss.detach(), *grads, torch.get_rng_state()], counter

    ref, plain = step(False)
    got, ckpt = step(True)
    _assert_all_equal(ref, got)
    recomputed = ckpt.counts["backward"] - plain.counts["backward"]
    # The compiled forward ran again (its dropout is native_dropout under
    # aot_eager), and so did the eager ops around it.
    assert recomputed[aten.native_dropout] == 1
    assert recomputed[aten.tanh] == 1 and recomputed[aten.mm] == 2


# ---------------------------------------------------------------------------
# Determinism check
# ---------------------------------------------------------------------------


def test_determinism_check_names_op_index_and_ops():
    calls = itertools.count()
    (x,) = _params((4, 4))

    def fn(x):
        h = x * 2
        h = h.sin() if next(calls) == 0 else h.cos()   # differs on recompute
        return h.exp()

    out = fxckpt.checkpoint(fn, x)
    with pytest.raises(RecomputeMismatchError,
                       match=r"op #1: the forward ran aten\.sin\.default.*"
                             r"recomputation ran aten\.cos\.default"):
        out.sum().backward()


def test_determinism_check_names_shape_that_differs():
    sizes = iter([4, 3])
    (x,) = _params((4, 4))

    def fn(x):
        return x[: next(sizes)].sin().exp()

    out = fxckpt.checkpoint(fn, x)
    with pytest.raises(RecomputeMismatchError, match=r"float32\[4, 4\].*float32\[3, 4\]"):
        out.sum().backward()


def test_recomputation_that_saves_fewer_tensors_fails_even_unchecked():
    """Without the op check, a recomputation that cannot refill every saved
    tensor still fails loudly instead of returning garbage."""
    calls = itertools.count()
    (x,) = _params((4, 4))

    def fn(x):
        return x.sin() if next(calls) == 0 else x * 2   # mul by 2 saves nothing

    out = fxckpt.checkpoint(fn, x, determinism_check="none")
    with pytest.raises(RecomputeMismatchError, match="saved 0 tensors.*forward saved 1"):
        out.sum().backward()


def test_determinism_check_none_and_bad_value():
    calls = itertools.count()
    (x,) = _params((4, 4))

    def fn(x):
        return (x.sin() if next(calls) == 0 else x.cos()).exp()

    fxckpt.checkpoint(fn, x, determinism_check="none").sum().backward()  # no check
    with pytest.raises(ValueError, match="determinism_check"):
        fxckpt.checkpoint(fn, x, determinism_check="strict")


# ---------------------------------------------------------------------------
# What runs twice
# ---------------------------------------------------------------------------


def _recomputed(fn, args, policy, params=(), forward_extra=Counter()):
    """Ops run in backward by the checkpointed step beyond plain eager's, and
    the forward's ops. The checkpointed forward must run the same ops as the
    plain one, plus ``forward_extra``. Gradients of ``args`` and ``params``
    are cleared before each step, so that accumulating them adds no ops."""
    def backward_counts(checkpointed):
        for t in (*args, *params):
            t.grad = None
        with OpCounter(DEFAULT_IGNORE) as counter:
            out = fxckpt.checkpoint(fn, *args, policy=policy) if checkpointed else fn(*args)
            counter.phase("backward")
            out.sum().backward()
        return counter.counts

    plain, ckpt = backward_counts(False), backward_counts(True)
    assert ckpt["forward"] == plain["forward"] + forward_extra
    return ckpt["backward"] - plain["backward"], plain["forward"]


def _mlp_fn():
    w1, w2, x = _params((8, 16), (16, 4), (5, 8))

    def fn(x, w1, w2):
        h = (x @ w1).relu()
        y = (h @ w2).tanh()   # tanh saves its output: the last saved tensor
        return y * 3 + 1      # mul/add by a scalar save nothing
    return fn, (x, w1, w2)


def test_counts_save_matmuls_runs_matmuls_once_everything_else_twice():
    fn, args = _mlp_fn()
    recomputed, forward = _recomputed(fn, args, save_matmuls())
    assert forward == Counter({aten.mm: 2, aten.relu: 1, aten.tanh: 1, aten.mul: 1,
                               aten.add: 1})
    # The matmuls are served from the forward; relu and tanh run again; the
    # scalar mul/add after the last saved tensor (tanh's output) are cut by
    # the early stop.
    assert recomputed == Counter({aten.relu: 1, aten.tanh: 1})


def test_counts_no_policy_runs_everything_twice_up_to_the_last_saved_tensor():
    fn, args = _mlp_fn()
    recomputed, _ = _recomputed(fn, args, None)
    assert recomputed == Counter({aten.mm: 2, aten.relu: 1, aten.tanh: 1})


def test_in_place_write_to_a_saved_output_keeps_the_saved_value():
    """add_ and relu_ write into the saved matmul output in the forward; the
    saved value is copied before the first write, so the recomputation gets
    the value from before the writes without running the matmul again."""
    w1, w2, x = _params((8, 16), (16, 4), (5, 8))

    def fn(x):
        h = x @ w1
        h.add_(1)
        h.relu_()
        return (h @ w2).sin()

    def step(checkpointed, policy=None):
        out = fxckpt.checkpoint(fn, x, policy=policy) if checkpointed else fn(x)
        loss = out.sum()
        return [loss.detach(), *_grads(loss, [w1, w2, x])]

    ref = step(False)
    _assert_all_equal(ref, step(True, save_matmuls()))
    _assert_all_equal(ref, step(True, save_ops(aten.mm, aten.add_, aten.relu_)))
    # One copy in the forward, before add_ writes; one in backward, for the
    # recomputation's add_ and relu_ to write to. The matmuls do not run again;
    # sin saves its input before it runs, so it is not reached.
    recomputed, _ = _recomputed(fn, (x,), save_matmuls(), params=(w1, w2),
                                forward_extra=Counter({aten.clone: 1}))
    assert recomputed == Counter({aten.add_: 1, aten.relu_: 1, aten.clone: 1})


def test_output_written_after_the_call_is_recomputed_instead():
    """A saved output that is also returned and then written in place outside
    the function cannot be served: the op runs again."""
    w, x = _params((8, 8), (4, 8))

    def fn(x):
        h = x @ w
        return h, h.tanh()      # tanh saves its result, computed from h

    def step(checkpointed):
        h, y = fxckpt.checkpoint(fn, x, policy=save_matmuls()) if checkpointed else fn(x)
        h.add_(1)               # legal: no backward needs h itself
        loss = (h * 0).sum() + y.sum()
        return [loss.detach(), *_grads(loss, [w, x])]

    _assert_all_equal(step(False), step(True))


# ---------------------------------------------------------------------------
# Policy questions
# ---------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU())
                                    for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_policy_is_asked_once_per_forward_op_with_real_tensors_and_module_paths():
    net = Net()
    x = torch.randn(2, 4, requires_grad=True)
    policy = Recording(save_matmuls())
    out = fxckpt.checkpoint(net, x, policy=policy)
    asked = [(c.name, c.op.overloadpacket, c.module_path) for c in policy.calls]
    addmm = [(path) for _, op, path in asked if op is aten.addmm]
    assert addmm == ["blocks.0.0", "blocks.1.0"]
    assert [name for name, _, _ in asked] == [str(i) for i in range(len(asked))]
    assert all(isinstance(a, torch.Tensor) and not isinstance(a, torch._subclasses.FakeTensor)
               for c in policy.calls for a in c.args if isinstance(a, torch.Tensor))
    assert "test_eager_checkpoint.py" in policy.calls[0].source
    n_forward = len(policy.calls)
    out.sum().backward()
    assert len(policy.calls) == n_forward      # never asked during backward


def test_policy_answer_must_be_a_checkpoint_policy():
    (x,) = _params((3, 3))
    with pytest.raises(PolicyError, match="CheckpointPolicy or None"):
        fxckpt.checkpoint(torch.sin, x, policy=Recording(None, answer=True))


def test_policy_sees_names_outputs_and_producers():
    (w, x) = _params((4, 4), (2, 4))
    policy = Recording(save_names("scores"))

    def fn(x):
        scores = name(x @ w, "scores")
        return scores.sin()

    # sin saves its input before it runs, so the recomputation stops before
    # sin: only the matmul would run again, and the named matmul is saved.
    assert _recomputed(fn, (x,), None, params=(w,))[0] == Counter({aten.mm: 1})
    assert _recomputed(fn, (x,), policy, params=(w,))[0] == Counter()
    mm, sin = policy.calls[:2]
    assert mm.value_names == ("scores",) and torch.equal(mm.output, x @ w)
    assert sin.inputs == (mm.name,)


def test_by_module_policy_follows_module_paths():
    net = Net()
    x = torch.randn(2, 4, requires_grad=True)
    policy = by_module("blocks.1.*", save_all())
    recomputed, _ = _recomputed(net, (x,), policy)
    # blocks.1's linear and GELU outputs are saved; blocks.0 runs again. The
    # last saved tensor is the input of blocks.1's GELU, so the early stop
    # cuts blocks.1 before its GELU.
    assert recomputed[aten.addmm] == 1 and recomputed[aten.gelu] == 1


def test_revised_answers_drop_saved_attention():
    """megatron_selective first saves every matmul; once it has seen the
    softmax it revises the attention matmuls to recompute, and those saved
    outputs are dropped: the two attention matmuls run again, the projection
    does not."""
    wq, wk, x = _params((8, 8), (8, 8), (4, 8))

    def attention(x):
        q, k = x @ wq, x @ wk                         # projections: saved
        weights = torch.softmax((q @ k.T) / 8 ** 0.5, dim=-1)
        return (weights @ x).tanh()

    recomputed, forward = _recomputed(attention, (x,), megatron_selective(),
                                      params=(wq, wk))
    assert forward[aten.mm] == 4
    assert recomputed[aten.mm] == 2 and recomputed[aten._softmax] == 1


@pytest.mark.parametrize("policy", [[aten.mm.default], "function"], ids=["op_list", "function"])
def test_torch_style_policies(policy):
    if policy == "function":
        def policy(ctx, op, *args, **kwargs):
            return op is aten.mm.default
    fn, args = _mlp_fn()
    recomputed, _ = _recomputed(fn, args, policy)
    assert recomputed == Counter({aten.relu: 1, aten.tanh: 1})


def test_inside_a_compiled_function():
    """Under torch.compile the call is a checkpoint region of the compiled
    graph, as torch's checkpoint is: gradients as without it."""
    w1, w2, x = _params((8, 8), (8, 8), (4, 8))

    def model(x, checkpointed):
        h = (x @ w1).relu()
        if checkpointed:
            h = fxckpt.checkpoint(lambda h: F.dropout(h @ w2, 0.5, training=True).sin(), h,
                                  policy=save_matmuls())
        else:
            h = F.dropout(h @ w2, 0.5, training=True).sin()
        return h.cos()

    def step(checkpointed):
        torch.manual_seed(4)
        loss = torch.compile(model, backend="aot_eager")(x, checkpointed).sum()
        return [loss.detach(), *_grads(loss, [w1, w2, x])]

    _assert_all_equal(step(False), step(True))


def test_activations_are_freed_and_saved_outputs_live_until_backward():
    from torch.multiprocessing.reductions import StorageWeakRef

    (w, x) = _params((8, 8), (4, 8))
    storages = {}

    def fn(x):
        h = x @ w
        g = h.sin()
        storages.update(h=StorageWeakRef(h.untyped_storage()),
                        g=StorageWeakRef(g.untyped_storage()))
        return g.cos()

    out = fxckpt.checkpoint(fn, x)
    assert storages["h"].expired() and storages["g"].expired()
    out = fxckpt.checkpoint(fn, x, policy=save_matmuls())
    assert not storages["h"].expired() and storages["g"].expired()
    out.sum().backward()
    assert storages["h"].expired()       # no reference cycle keeps it


def test_offload_answers_are_saved_in_place_with_a_warning(monkeypatch):
    from fxckpt import policies

    monkeypatch.setattr(fxckpt.errors, "_warned", set())
    w1, w2, x = (t.detach().requires_grad_() for t in _params((8, 16), (16, 4), (5, 8)))

    def fn(x):
        return torch.relu(x @ w1) @ w2

    expected = torch.autograd.grad(fn(x).sum(), (w1, w2, x))
    with pytest.warns(UserWarning, match="does not offload"):
        out = fxckpt.checkpoint(fn, x, policy=policies.offload(policies.save_matmuls()))
    assert all(torch.equal(a, b) for a, b in
               zip(torch.autograd.grad(out.sum(), (w1, w2, x)), expected))

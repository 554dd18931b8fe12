"""Reference checks of the model zoo, the harness and the op counter.

Nothing here uses fxckpt: these tests establish that the zoo is
deterministic, that eager and ``torch.compile(backend="aot_eager")`` agree
bit for bit (the baseline fxckpt has to reach), and that the harness and
``OpCounter`` can actually detect differences.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from torch._dynamo.testing import CompileCounterWithBackend

try:  # run as package ``tests`` (python -m pytest, or tests/__init__.py)
    from tests.harness import (StepResult, assert_bitwise_equal,
                               assert_close, fresh, normalize_name, run_step)
    from tests.opcount import DEFAULT_IGNORE, OpCounter
    from tests.zoo import ZOO, ZOO_NAMES
except ImportError:  # tests/ itself on sys.path (pytest rootdir insertion)
    from harness import (StepResult, assert_bitwise_equal,  # type: ignore
                         assert_close, fresh, normalize_name, run_step)
    from opcount import DEFAULT_IGNORE, OpCounter  # type: ignore
    from zoo import ZOO, ZOO_NAMES  # type: ignore

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("reset_dynamo")


# ---------------------------------------------------------------------------
# (a) every case builds and trains
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_case_builds_and_steps(name):
    case = ZOO[name]
    module, inputs, loss_fn = case.make()
    assert isinstance(module, nn.Module) and isinstance(inputs, tuple)
    assert module.training

    if case.integer_input:
        assert not inputs[0].is_floating_point()

    res = run_step(module, inputs, loss_fn)
    assert res.loss.dim() == 0 and math.isfinite(res.loss.item())
    assert res.no_grad == (), f"parameters without a grad: {res.no_grad}"
    want = {normalize_name(n) for n, p in module.named_parameters()
            if p.requires_grad}
    assert set(res.grads) == want
    for n, g in res.grads.items():
        assert torch.isfinite(g).all(), n
    # run_step clears the grads afterwards.
    assert all(p.grad is None for p in module.parameters())

    # Tied weights are one Parameter, listed once by named_parameters().
    n_unique = len({id(p) for p in module.parameters()})
    n_all = len(list(module.named_parameters(remove_duplicate=False)))
    assert (n_all > n_unique) == case.tied_weights



@pytest.mark.parametrize("name", ZOO_NAMES)
def test_make_is_seeded(name):
    m1, in1, _ = ZOO[name].make()
    m2, in2, _ = ZOO[name].make()
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k
    assert len(in1) == len(in2)
    for a, b in zip(in1, in2):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------
# (b) determinism, and the harness is sensitive to the seed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_deterministic_and_seed_sensitive(name):
    case = ZOO[name]
    a = run_step(*fresh(case), seed=0)
    b = run_step(*fresh(case), seed=0)
    assert_bitwise_equal(a, b)
    c = run_step(*fresh(case), seed=1)
    if case.uses_rng:
        # Dropout is active: another seed must change the loss.
        with pytest.raises(AssertionError):
            assert_bitwise_equal(a, c)
    else:
        assert_bitwise_equal(a, c)


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES
                                  if ZOO[n].mutates_buffers])
def test_buffers_mutated(name):
    module, inputs, loss_fn = ZOO[name].make()
    before = {n: b.clone() for n, b in module.named_buffers()}
    res = run_step(module, inputs, loss_fn)
    assert any(not torch.equal(before[n], res.buffers[n]) for n in before)


# ---------------------------------------------------------------------------
# (c) torch.compile(backend="aot_eager") against eager
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_aot_eager_matches_eager(name):
    case = ZOO[name]
    ref_mod, inputs, loss_fn = fresh(case)
    opt_mod, _, _ = fresh(case)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(opt_mod, backend=counter)
    check = (assert_bitwise_equal if case.aot_eager_bitwise
             else lambda a, b: assert_close(a, b, rtol=1e-5, atol=1e-6))
    # Two steps: the second reuses the compiled graph and starts from the
    # BatchNorm running stats the first step left behind.
    for seed in (0, 1):
        ref = run_step(ref_mod, inputs, loss_fn, seed=seed)
        got = run_step(compiled, inputs, loss_fn, seed=seed)
        check(ref, got)
    # The whole model is one graph (no graph breaks, no recompiles).
    assert counter.frame_count == 1, f"{counter.frame_count} graphs"


# ---------------------------------------------------------------------------
# Harness self-checks
# ---------------------------------------------------------------------------


def _result(**grads) -> StepResult:
    return StepResult(loss=torch.tensor(1.0), grads=dict(grads))


def test_assert_bitwise_equal_reports_first_mismatch():
    g = torch.arange(4.0)
    a = _result(w=g, v=g)
    b = _result(w=g.clone(), v=g + torch.tensor([0, 1e-6, 0, 0]))
    with pytest.raises(AssertionError,
                       match=r"'v'.*max abs diff 9\.\d+e-07, 1/4"):
        assert_bitwise_equal(a, b)
    assert_close(a, b, rtol=0, atol=1e-5)
    with pytest.raises(AssertionError, match="'v'"):
        assert_close(a, b, rtol=0, atol=1e-7)
    with pytest.raises(AssertionError, match="only in second: \\['u'\\]"):
        assert_bitwise_equal(a, _result(w=g, v=g, u=g))
    with pytest.raises(AssertionError, match="loss"):
        assert_bitwise_equal(a, StepResult(loss=torch.tensor(2.0),
                                           grads=dict(w=g, v=g)))
    nan = torch.tensor([float("nan"), 1.0])
    assert_bitwise_equal(_result(w=nan), _result(w=nan.clone()))


def test_run_step_normalises_compiled_names():
    case = ZOO["mlp"]
    mod, inputs, loss_fn = fresh(case)
    compiled = torch.compile(mod, backend="aot_eager")
    assert any("_orig_mod." in n for n, _ in compiled.named_parameters())
    res = run_step(compiled, inputs, loss_fn)
    assert set(res.grads) == {n for n, _ in mod.named_parameters()}


# ---------------------------------------------------------------------------
# OpCounter
# ---------------------------------------------------------------------------


def test_opcounter_linear_eager():
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    with OpCounter(ignore=DEFAULT_IGNORE) as c:
        c.phase("forward")
        loss = lin(x).sum()
        c.phase("backward")
        loss.backward()
    assert c.counts["forward"][aten.addmm] == 1
    assert c.counts["backward"][aten.addmm] == 0
    assert c.counts["forward"][aten.mm] == 0
    # grad wrt input and grad wrt weight
    assert c.counts["backward"][aten.mm] == 2
    assert c.total(aten.mm) == 2 and c.total(aten.addmm) == 1
    assert c.total(aten.addmm.default) == 1
    assert aten.detach not in c.counts["forward"]


def _count_mlp(module, inputs, loss_fn) -> OpCounter:
    with OpCounter(ignore=DEFAULT_IGNORE) as c:
        c.phase("forward")
        loss = loss_fn(module(*inputs))
        c.phase("backward")
        loss.backward()
    return c


def test_opcounter_counts_inside_aot_eager():
    mod, inputs, loss_fn = fresh(ZOO["mlp"])
    eager = _count_mlp(mod, inputs, loss_fn)
    # Eager CPU dropout decomposes to bernoulli_; the AOT graph keeps
    # native_dropout, which tells us the compiled graph really ran.
    assert eager.counts["forward"][aten.bernoulli_] == 1
    assert eager.counts["forward"][aten.native_dropout] == 0

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(mod, backend=counter)
    for _ in range(2):  # cold (compiles under the counter), then warm
        c = _count_mlp(compiled, inputs, loss_fn)
        assert counter.frame_count == 1
        assert c.counts["forward"][aten.native_dropout] == 1
        assert c.counts["forward"][aten.bernoulli_] == 0
        assert c.counts["forward"][aten.addmm] == 2
        assert c.counts["backward"][aten.native_dropout_backward] == 1
        assert c.counts["backward"][aten.mm] == 3
        # Fake-tensor tracing during compilation is not counted.
        assert c.counts["forward"][aten.gelu] == 1


def test_opcounter_without_count_compiled_falls_back_to_eager():
    mod, inputs, loss_fn = fresh(ZOO["mlp"])
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(mod, backend=counter)
    with OpCounter(ignore=DEFAULT_IGNORE, count_compiled=False) as c:
        loss_fn(compiled(*inputs))
    assert counter.frame_count == 0
    assert c.counts["forward"][aten.bernoulli_] == 1


def test_opcounter_sees_user_checkpoint_recompute():
    # Eager: non-reentrant checkpoint re-runs each block's forward in
    # backward (stopping early once the saved tensors it needs are back).
    mod, inputs, loss_fn = fresh(ZOO["user_checkpoint"])
    c = _count_mlp(mod, inputs, loss_fn)
    assert c.counts["backward"][aten.native_layer_norm] == 2
    assert c.counts["backward"][aten.bernoulli_] == 2
    # aot_eager: dropout inside the checkpointed region becomes the rng HOPs
    # run_and_save_rng_state (forward) / run_with_rng_state (backward).
    mod, inputs, loss_fn = fresh(ZOO["user_checkpoint"])
    c = _count_mlp(torch.compile(mod, backend="aot_eager"), inputs, loss_fn)
    assert c.counts["forward"][aten.native_dropout] == 2
    assert c.counts["backward"][aten.native_dropout] == 2
    assert c.counts["backward"][aten.native_layer_norm] == 2

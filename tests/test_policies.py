"""The policy vocabulary: the forms ``policy=`` accepts, what each policy
answers, how policies print and compare, the errors they raise, fxckpt.name,
and how the tag stage follows the answers."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy as P

import fxckpt
from fxckpt import policies as pol
from fxckpt.errors import PolicyError
from fxckpt.naming import names_of
from fxckpt.policies.api import OpCall, finish

try:
    from tests.harness import assert_bitwise_equal, fresh, run_step
    from tests.zoo import ZOO
except ImportError:  # pragma: no cover - run from inside tests/
    from harness import assert_bitwise_equal, fresh, run_step
    from zoo import ZOO

aten = torch.ops.aten


pytestmark = [pytest.mark.usefixtures("reset_dynamo"), pytest.mark.releases]


def call(op, *args, name="n", module_path="", value_names=(), output=None, inputs=()):
    return OpCall(name=name, op=op, args=args, kwargs={}, module_path=module_path,
                  value_names=value_names, output=output, inputs=inputs)


def answers(policy, calls) -> list:
    """What the resolved ``policy`` tags each call, revisions applied."""
    decide = pol.resolve_policy(policy).for_graph()
    first = {c.name: decide(c) for c in calls}
    first.update(finish(decide))
    return [first[c.name] for c in calls]


A, B = torch.randn(4, 8), torch.randn(8, 4)
MM = call(aten.mm.default, A, B, name="mm")
RELU = call(aten.relu.default, A, name="relu")


# -- the forms policy= accepts -------------------------------------------------

def test_a_policy_object_leaves_unanswered_ops_to_recompute():
    assert answers(pol.save_matmuls(), [MM, RELU]) == [P.PREFER_SAVE, P.PREFER_RECOMPUTE]


def test_a_policy_function_is_called_as_torch_calls_it():
    seen = []

    def policy_fn(ctx, op, *args, **kwargs):
        seen.append((ctx.is_recompute, ctx.op_output, op, args))
        return op == aten.mm.default

    out = torch.empty(4, 4)
    mm = call(aten.mm.default, A, B, name="mm", output=out)
    assert answers(policy_fn, [mm, RELU]) == [P.MUST_SAVE, P.PREFER_RECOMPUTE]
    assert seen[0][0] is False and seen[0][1] is out and seen[0][2] is aten.mm.default
    assert seen[0][3] == (A, B)
    assert isinstance(answers(lambda ctx, op, *a, **k: P.PREFER_SAVE, [MM])[0], P)


def test_a_policy_function_is_not_shown_ops_torch_hides():
    seen = []
    detach = call(aten.detach.default, A, name="detach")
    assert answers(lambda ctx, op, *a, **k: seen.append(op) or True, [detach]) == [None]
    assert seen == []


@pytest.mark.parametrize("form", [list, tuple, set])
def test_a_list_of_ops_must_saves_them_and_recomputes_the_rest(form):
    addmm = call(aten.addmm.default, A, name="addmm")
    mm_out = call(aten.mm.out, A, B, name="mm_out")
    ops = form([aten.mm.default, aten.addmm])       # an overload and a packet
    assert answers(ops, [MM, mm_out, addmm, RELU]) == [
        P.MUST_SAVE, P.PREFER_RECOMPUTE, P.MUST_SAVE, P.PREFER_RECOMPUTE]


def test_a_policy_factory_is_taken_as_it_is():
    factory = pol.resolve_policy(pol.save_all())
    assert pol.resolve_policy(factory) is factory
    assert pol.resolve_policy(None) is None


@pytest.mark.parametrize("bad", ["save", 3, {"mm": "save"}, P.MUST_SAVE])
def test_other_forms_are_rejected_naming_the_accepted_ones(bad):
    with pytest.raises(TypeError, match=r"policy= accepts a policy from fxckpt.policies.*"
                                         r"policy_fn\(ctx, op.*list/tuple/set of ops"):
        pol.resolve_policy(bad)
    with pytest.raises(TypeError, match="policy= accepts"):
        fxckpt.backend(policy=bad)


@pytest.mark.parametrize("returned, hint", [("save", r"returned 'save' for op aten.mm.default"),
                                            (None, r"returned None \(did it miss a return")])
def test_a_policy_function_returning_something_else_is_an_error(returned, hint):
    def policy_fn(ctx, op, *args, **kwargs):
        return returned

    with pytest.raises(TypeError, match=hint + r".*CheckpointPolicy or a bool"):
        answers(policy_fn, [MM])


def test_a_bad_answer_surfaces_through_torch_compile():
    def no_return(ctx, op, *args, **kwargs):
        if op == aten.relu.default:
            return None
        return True

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = torch.compile(model, backend=fxckpt.backend(compiler="eager", policy=no_return))
    with pytest.raises(Exception, match=r"no_return.*returned None.*aten.relu.default"):
        compiled(torch.randn(2, 4))


# -- policies are values ----------------------------------------------------

def test_policies_print_as_written():
    assert repr(pol.save_ops("aten.mm", aten.bmm.default)) == "save_ops(aten.mm, aten.bmm.default)"
    assert repr(pol.first(pol.save_matmuls(), pol.recompute_all())) == \
        "first(save_matmuls(no_batch_dims=False), recompute_all())"
    assert repr(pol.save_names("a", "b")) == "save_names('a', 'b')"
    assert repr(pol.offload(pol.by_module("blocks.*", pol.save_all()))) == \
        "offload(policy=by_module(pattern='blocks.*', policy=save_all()))"
    assert repr(fxckpt.backend(policy=pol.every_nth_matmul(3))).count("every_nth_matmul(n=3)") == 1


def test_policies_compare_and_hash_by_value_and_are_frozen():
    assert pol.save_ops("aten.mm") == pol.save_ops(aten.mm) == pol.save_ops([aten.mm])
    assert pol.save_ops(aten.mm) != pol.recompute_ops(aten.mm)
    assert pol.every_nth_matmul(2) == pol.every_nth_matmul() != pol.every_nth_matmul(3)
    made_twice = {pol.first(pol.save_names("x"), pol.megatron_selective()) for _ in range(2)}
    assert len(made_twice) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        pol.every_nth_matmul(2).n = 3


# -- what each policy answers ----------------------------------------------

def test_save_matmuls_with_and_without_batch_dims():
    bmm = call(aten.bmm.default, torch.randn(2, 4, 8), torch.randn(2, 8, 4), name="bmm")
    matmul_3d = call(aten.matmul.default, torch.randn(2, 4, 8), torch.randn(2, 8, 4), name="mt")
    linear_3d = call(aten.linear.default, torch.randn(2, 4, 8), torch.randn(4, 8), name="lin")
    calls = [MM, bmm, matmul_3d, linear_3d, RELU]
    assert [pol.save_matmuls()(c) for c in calls] == [P.PREFER_SAVE] * 4 + [None]
    assert [pol.save_matmuls(no_batch_dims=True)(c) for c in calls] == [
        P.PREFER_SAVE, None, None, P.PREFER_SAVE, None]


@pytest.mark.parametrize("spelling", ["aten.mm", "aten::mm", "mm", "aten.mm.default",
                                      "torch.ops.aten.mm.default", aten.mm, aten.mm.default])
def test_save_ops_reads_every_spelling(spelling):
    assert pol.save_ops(spelling)(MM) == P.PREFER_SAVE
    assert pol.save_ops(spelling)(RELU) is None
    assert pol.recompute_ops(spelling)(MM) == P.PREFER_RECOMPUTE


@pytest.mark.parametrize("bad, error, message", [
    ("aten.nope", ValueError, r"no op 'aten.nope'"),
    ("aten.mmm", ValueError, r"no op 'aten.mmm'; did you mean aten.mm"),
    ("aten.mm.nope", ValueError, r"no op 'aten.mm.nope'"),
    ("a.b.c.d", ValueError, r"cannot read op name"),
    (3, TypeError, r"3 is not an op"),
])
def test_unknown_ops_are_errors(bad, error, message):
    with pytest.raises(error, match=message):
        pol.save_ops(bad)
    with pytest.raises(ValueError, match="at least one op"):
        pol.recompute_ops()


def test_save_names_saves_values_with_those_names():
    named = call(aten.relu.default, A, name="relu", value_names=("act",))
    assert answers(pol.save_names("act"), [named, MM]) == [P.PREFER_SAVE, P.PREFER_RECOMPUTE]
    with pytest.raises(TypeError):
        pol.save_names()


def test_save_names_warns_once_a_graph_about_names_it_never_saw():
    decide = pol.save_names("act", "gone").for_graph()
    decide(call(aten.relu.default, A, value_names=("act",)))
    with pytest.warns(UserWarning, match=r"no value in this graph is named 'gone'.*\['act'\]"):
        finish(decide)


def test_by_module_matches_a_module_and_its_submodules():
    policy = pol.by_module("blocks.*.attn", pol.save_all())
    assert policy.matches("blocks.0.attn") and policy.matches("blocks.12.attn.qkv")
    assert not policy.matches("blocks.0.mlp") and not policy.matches("blocks.0.attnx")
    assert not policy.matches("")
    inside = call(aten.relu.default, A, module_path="blocks.1.attn.proj")
    assert policy(inside) == P.PREFER_SAVE
    assert policy(call(aten.relu.default, A, module_path="blocks.1.mlp")) is None


def test_by_module_matching_nothing_warns_once_a_graph_with_close_paths():
    policy = pol.by_module("layers.*.atn", pol.save_all())
    for _ in range(2):            # two graphs, one warning each
        decide = policy.for_graph()
        for path in ("blocks.0.attn.qkv", "blocks.0.attn", "blocks.0.mlp", ""):
            decide(call(aten.relu.default, A, module_path=path))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            finish(decide)
        assert len(caught) == 1
        assert "by_module('layers.*.atn', ...) matches no module" in str(caught[0].message)
        assert "blocks.0.attn" in str(caught[0].message)
    decide = pol.by_module("blocks.*", pol.save_all()).for_graph()
    decide(call(aten.relu.default, A, module_path="blocks.0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finish(decide)


def test_every_nth_matmul_counts_in_forward_order_afresh_each_graph():
    policy = pol.every_nth_matmul(3)
    for _ in range(2):
        decide = policy.for_graph()
        got = [decide(c) for c in [MM, RELU, MM, MM, MM, RELU, MM, MM]]
        assert got == [P.PREFER_SAVE, None, P.PREFER_SAVE, P.PREFER_RECOMPUTE,
                       P.PREFER_SAVE, None, P.PREFER_SAVE, P.PREFER_RECOMPUTE]
    with pytest.raises(TypeError, match="for_graph"):
        policy(MM)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            pol.every_nth_matmul(bad)


def test_first_takes_the_first_answer_and_asks_every_policy():
    named_mm = call(aten.mm.default, A, B, name="named", value_names=("x",))
    policy = pol.first(pol.save_names("x"), pol.every_nth_matmul(2))
    # The named mm is saved by save_names, and every_nth_matmul counts it too.
    assert answers(policy, [named_mm, MM, RELU]) == [
        P.PREFER_SAVE, P.PREFER_RECOMPUTE, P.PREFER_RECOMPUTE]
    assert pol.first(pol.recompute_ops("aten.mm"), pol.save_all())(MM) == P.PREFER_RECOMPUTE
    assert pol.first(pol.recompute_ops("aten.mm"), pol.save_all())(RELU) == P.PREFER_SAVE
    with pytest.raises(TypeError, match="takes policies"):
        pol.first(pol.save_all(), "save")


def test_first_applies_revisions_of_the_policies_it_holds():
    class Revises(pol.Policy):
        def for_graph(self):
            class Decide:
                def __call__(self, call):
                    return None

                def finish(self):
                    return {"mm": P.PREFER_RECOMPUTE, "relu": P.PREFER_RECOMPUTE}
            return Decide()

    policy = pol.first(pol.save_ops("aten.mm"), Revises())
    # save_ops answered mm already; the revision only changes relu.
    decide = policy.for_graph()
    assert [decide(c) for c in (MM, RELU)] == [P.PREFER_SAVE, None]
    assert finish(decide) == {"mm": P.PREFER_SAVE, "relu": P.PREFER_RECOMPUTE}


def test_must_and_offload_change_the_strength_and_the_place():
    assert pol.must(pol.save_matmuls())(MM) == P.MUST_SAVE
    assert pol.must(pol.recompute_all())(MM) == P.MUST_RECOMPUTE
    assert pol.must(pol.save_matmuls())(RELU) is None
    assert pol.offload(pol.save_matmuls())(MM) == P.PREFER_CPU_OFFLOAD
    assert pol.offload(pol.must(pol.save_matmuls()))(MM) == P.MUST_CPU_OFFLOAD
    assert pol.offload(pol.recompute_all())(MM) == P.PREFER_RECOMPUTE
    assert answers(pol.offload(pol.save_matmuls()), [MM, RELU]) == [
        P.PREFER_CPU_OFFLOAD, P.PREFER_RECOMPUTE]


def test_defaults_hands_an_op_back_to_the_planner():
    policy = pol.first(pol.by_module("blocks.0.*", pol.recompute_all()), pol.defaults())
    inside = call(aten.mm.default, A, B, name="in", module_path="blocks.0.attn")
    outside = call(aten.mm.default, A, B, name="out", module_path="blocks.1.attn")
    assert answers(policy, [inside, outside]) == [P.PREFER_RECOMPUTE, None]


def test_megatron_selective_revises_the_score_matmul_once_it_sees_the_softmax():
    q, s = torch.randn(2, 4, 4), torch.randn(2, 4, 4)
    calls = [call(aten.mm.default, A, B, name="proj_in"),
             call(aten.bmm.default, q, q, name="scores", inputs=("proj_in",)),
             call(aten.div.Tensor, s, 2.0, name="scaled", inputs=("scores",)),
             call(aten._softmax.default, s, -1, False, name="probs", inputs=("scaled",)),
             call(aten.native_dropout.default, s, 0.1, True, name="drop", inputs=("probs",)),
             call(aten.bmm.default, s, q, name="context", inputs=("drop", "proj_in")),
             call(aten.mm.default, A, B, name="proj_out", inputs=("context",)),
             call(aten._softmax.default, s, -1, False, name="router", inputs=("proj_out",))]
    assert answers(pol.megatron_selective(), calls) == [
        P.PREFER_SAVE, P.PREFER_RECOMPUTE, P.PREFER_RECOMPUTE, P.PREFER_RECOMPUTE,
        P.PREFER_RECOMPUTE, P.PREFER_RECOMPUTE, P.PREFER_SAVE,
        P.PREFER_SAVE]                 # a softmax that feeds no matmul is not attention
    with pytest.raises(TypeError, match="for_graph"):
        pol.megatron_selective()(MM)


# -- fxckpt.name ---------------------------------------------------------------

def test_name_is_the_identity_eagerly():
    t = torch.randn(3)
    assert fxckpt.name(t, "a") is t
    assert names_of(t) == ("a",)
    with pytest.raises(TypeError, match="non-empty str"):
        fxckpt.name(t, "")
    with pytest.raises(TypeError, match="names a tensor"):
        fxckpt.name([1.0], "a")


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = fxckpt.name(torch.tanh(self.fc1(x)), "hidden")
        return self.fc2(F.gelu(h))


def _two_layer():
    torch.manual_seed(0)
    return TwoLayer(), (torch.randn(4, 8),)


def _loss(y):
    return y.square().mean()


def _saved_values(plan) -> set[str]:
    return {e.name for e in plan.entries
            if e.action == "saved" and e.op not in ("input", "rng state")}


def test_a_named_value_is_found_through_an_fx_trace_and_transform():
    model, (x,) = _two_layer()
    ref = run_step(model, (x,), _loss)
    transformed = fxckpt.transform(torch.fx.symbolic_trace(model), x,
                                   policy=pol.save_names("hidden"))
    assert _saved_values(transformed.plan) == {"tanh"}
    got = run_step(transformed, (x,), _loss)
    got.grads = {name.removeprefix("module."): g for name, g in got.grads.items()}
    assert_bitwise_equal(ref, got, check_buffers=False)


def test_a_named_value_survives_inductor():
    """Inductor drops the no-op alias fxckpt.name leaves; the name is on the
    tanh that made the value. Inductor is compared with Inductor."""
    model, (x,) = _two_layer()
    ref = run_step(torch.compile(_two_layer()[0]), (x,), _loss)
    torch._dynamo.reset()
    be = fxckpt.backend(compiler="inductor", policy=pol.save_names("hidden"))
    got = run_step(torch.compile(model, backend=be), (x,), _loss)
    saved = {e.op for e in be.plans[0].entries if e.name in _saved_values(be.plans[0])}
    assert saved == {"aten.tanh.default"}
    assert_bitwise_equal(ref, got)


# -- the tag stage follows the answers ---------------------------------------

def test_offload_is_followed_as_save_with_the_policy_in_the_reason(monkeypatch):
    monkeypatch.setattr(fxckpt.errors, "_warned", set())
    model, (x,) = _two_layer()
    ref = run_step(model, (x,), _loss)
    model, _ = _two_layer()
    be = fxckpt.backend(compiler="eager", policy=pol.offload(pol.save_matmuls()))
    with pytest.warns(UserWarning, match="offload degrades to save on CPU"):
        got = run_step(torch.compile(model, backend=be), (x,), _loss)
    assert_bitwise_equal(ref, got)
    addmm = [e for e in be.plans[0].entries if e.op == "aten.addmm.default"]
    assert addmm and all(e.action == "saved" for e in addmm)
    assert all("PREFER_CPU_OFFLOAD" in e.reason and "offload degrades to save on CPU"
               in e.reason and "offload(policy=save_matmuls" in e.reason for e in addmm)
    torch._dynamo.reset()
    with warnings.catch_warnings():           # once a process, not once a graph
        warnings.simplefilter("error")
        run_step(torch.compile(_two_layer()[0], backend=be), (x,), _loss)


@torch.library.custom_op("fxckpt_policy_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


_scale.register_fake(lambda x: torch.empty_like(x))
_scale.register_autograd(lambda ctx, g: g * 3)


class UsesCustom(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return _scale(self.fc(x)).tanh()


def test_must_recompute_of_a_value_that_cannot_be_names_node_and_line():
    policy = pol.first(pol.must(pol.recompute_ops("fxckpt_policy_test.scale")), pol.defaults())
    compiled = torch.compile(UsesCustom(), backend=fxckpt.backend(compiler="eager", policy=policy))
    with pytest.raises(Exception) as raised:
        compiled(torch.randn(4, 8))
    error = _root_cause(raised.value)
    assert isinstance(error, PolicyError)
    assert "asks to recompute scale (fxckpt_policy_test.scale.default)" in str(error)
    assert "test_policies.py" in str(error) and "_scale(self.fc(x))" in str(error)


def test_prefer_recompute_of_a_value_that_cannot_be_is_saved_with_the_reason():
    model = UsesCustom()
    be = fxckpt.backend(compiler="eager", policy=pol.recompute_all())
    run_step(torch.compile(model, backend=be), (torch.randn(4, 8),), _loss)
    scale = [e for e in be.plans[0].entries if e.name == "scale"]
    assert scale[0].action == "saved"
    assert "overrides policy recompute_all(): PREFER_RECOMPUTE" in scale[0].reason


def _root_cause(error: BaseException) -> BaseException:
    """The error fxckpt raised, under torch.compile's wrapping."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def test_by_module_matching_nothing_warns_through_the_backend():
    model, (x,) = _two_layer()
    be = fxckpt.backend(compiler="eager", policy=pol.by_module("fc3", pol.save_all()))
    with pytest.warns(UserWarning, match=r"by_module\('fc3', \.\.\.\) matches no module.*fc1"):
        run_step(torch.compile(model, backend=be), (x,), _loss)


def test_a_budget_overrides_prefer_but_never_must():
    ref_model, inputs, loss_fn = fresh(ZOO["gpt"])
    ref = run_step(ref_model, inputs, loss_fn)
    model, _, _ = fresh(ZOO["gpt"])
    be = fxckpt.backend(compiler="eager", policy=pol.save_all(), budget=0.9)
    assert_bitwise_equal(ref, run_step(torch.compile(model, backend=be), inputs, loss_fn))
    assert be.plans[0].recomputed
    assert any("PREFER_SAVE overridden" in note for note in be.plans[0].overrides)

    # A fraction is always feasible (0 is the floor); a byte budget below what
    # must(save_all()) peaks at is not.
    torch._dynamo.reset()
    model, _, _ = fresh(ZOO["gpt"])
    peak = fxckpt.explain(model, *inputs, policy=pol.must(pol.save_all()),
                          compiler="eager").peak_bytes
    be = fxckpt.backend(compiler="eager", policy=pol.must(pol.save_all()),
                        budget=int(0.9 * peak))
    with pytest.raises(Exception) as raised:
        run_step(torch.compile(model, backend=be), inputs, loss_fn)
    assert isinstance(_root_cause(raised.value), fxckpt.BudgetError)

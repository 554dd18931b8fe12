"""The built-in models: they build, train, and are fixed by their seed."""

import pytest
import torch
from torch import nn

from fxckpt.models import GPT, MODEL_NAMES, GPTConfig, gpt_loss, make_model

SIZES = ["tiny", "small"]


def _step(model, inputs, loss_fn):
    loss = loss_fn(model(*inputs))
    loss.backward()
    return loss


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_training_step_runs_and_reaches_every_parameter(name):
    model, inputs, loss_fn = make_model(name, size="tiny")
    assert model.training
    loss = _step(model, inputs, loss_fn)
    assert loss.dim() == 0 and torch.isfinite(loss)
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{name}: no grad for {param_name}"
        assert torch.isfinite(param.grad).all(), param_name


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_seed_fixes_weights_inputs_and_loss(name, size):
    first = make_model(name, size=size, seed=3)
    second = make_model(name, size=size, seed=3)
    other = make_model(name, size=size, seed=4)

    for (key, a), b in zip(first[0].state_dict().items(),
                           second[0].state_dict().values()):
        assert torch.equal(a, b), key
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))
    assert not all(torch.equal(a, b) for a, b in
                   zip(first[0].state_dict().values(),
                       other[0].state_dict().values()))
    assert not torch.equal(first[1][0], other[1][0])

    # Dropout draws from the global RNG, so seed it for the comparison.
    torch.manual_seed(0)
    loss_first = _step(*first)
    torch.manual_seed(0)
    loss_second = _step(*second)
    assert torch.equal(loss_first, loss_second)


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    make_model("gpt", size="tiny", seed=7)
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_repeated_layers_are_a_module_list_named_blocks(name):
    model, _, _ = make_model(name, size="tiny")
    assert isinstance(model.blocks, nn.ModuleList)
    assert len(model.blocks) >= 2
    assert all(isinstance(block, nn.Module) for block in model.blocks)


def test_gpt_has_one_block_per_layer():
    model, (idx,), _ = make_model("gpt", size="small")
    assert len(model.blocks) == model.config.n_layer == 4
    assert idx.shape == (4, model.config.block_size)
    assert idx.dtype == torch.long


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as error:
        make_model("nope")
    message = str(error.value)
    assert "'nope'" in message
    for name in ("gpt", "cnn", "mlp"):
        assert name in message


def test_unknown_size_lists_the_valid_ones():
    with pytest.raises(ValueError, match="tiny, small, medium"):
        make_model("mlp", size="huge")


def test_gpt_is_causal():
    model, (idx,), _ = make_model("gpt", size="tiny")
    model.eval()
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(idx), model(changed)
    assert torch.equal(before[:, :-1], after[:, :-1])
    assert not torch.equal(before[:, -1], after[:, -1])


def test_gpt_dropout_is_random_in_training_only():
    model, (idx,), _ = make_model("gpt", size="tiny")
    with torch.no_grad():
        assert not torch.equal(model(idx), model(idx))
        model.eval()
        assert torch.equal(model(idx), model(idx))


def test_gpt_rejects_a_sequence_longer_than_its_block():
    model = GPT(GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=1,
                          n_embd=8))
    with pytest.raises(ValueError, match="block_size 4"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_gpt_config_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(n_embd=30, n_head=4)


def test_gpt_loss_is_mean_next_token_cross_entropy():
    logits = torch.zeros(2, 3, 5)            # uniform over 5 tokens
    targets = torch.zeros(2, 3, dtype=torch.long)
    assert torch.allclose(gpt_loss(logits, targets),
                          torch.log(torch.tensor(5.0)))


def test_gpt_trains_through_torch_compile():
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    eager_model, _, _ = make_model("gpt", size="tiny")
    model.eval()  # no dropout, so compiled and eager see the same function
    eager_model.eval()
    compiled = torch.compile(model, backend="aot_eager")
    loss = _step(compiled, inputs, loss_fn)
    expected = _step(eager_model, inputs, loss_fn)
    assert torch.allclose(loss, expected)
    for (name, param), eager_param in zip(model.named_parameters(),
                                          eager_model.parameters()):
        assert torch.allclose(param.grad, eager_param.grad, atol=1e-6), name

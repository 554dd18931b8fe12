"""Graph-break fallback regions under a budget (fxckpt/entry/compile.py,
fxckpt/eager/region_policy.py): a region runs between its floor (its
inputs and the policy's MUST saves) and the user's policy, as the step's
byte budget or fraction requires; the step's floor counts regions at theirs.

The model: a compiled stem, a body whose forward breaks the graph
(``.item()``) with dropout, and a compiled head; the user's policy saves
everything, so the body's floor is far below it. Measured step peaks (CPU
allocator events) are held to the budget within 5%, losses and gradients
to eager from the same seed, bitwise."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxckpt
from fxckpt.bench.measure import measure_peak_bytes
from fxckpt.eager.region_policy import RegionBytes
from fxckpt.budget.ledger import RegionChoice, StepFloor, allocate_step, step_items, step_peak
from fxckpt.policies import first, must, save_all, save_ops

from harness import assert_bitwise_equal, run_step

pytestmark = pytest.mark.usefixtures("reset_dynamo")

D, BATCH = 64, 64
POLICY = save_all()


@pytest.fixture(autouse=True)
def _quiet():
    torch._logging.set_logs(graph_breaks=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the first step's re-planning warns
        yield
    torch._logging.set_logs()


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, 4 * D)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x):
        h = self.drop(F.gelu(self.fc1(x)))
        if h.mean().item() > 0:          # Dynamo breaks the graph here
            h = h * 2
        return x + self.fc2(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(32, 4 * D), nn.GELU(), nn.Dropout(0.1),
                                  nn.Linear(4 * D, D), nn.Tanh())
        self.body = Body()
        self.head = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 10))

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


def net() -> Net:
    torch.manual_seed(0)
    return Net().train()


INPUTS = (torch.randn(BATCH, 32, generator=torch.Generator().manual_seed(1)),)
TARGET = torch.randint(0, 10, (BATCH,), generator=torch.Generator().manual_seed(2))


def loss_fn(out):
    return F.cross_entropy(out, TARGET)


def measured_step(model, seed: int = 3) -> int:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    peak = measure_peak_bytes(lambda: loss_fn(model(*INPUTS)).backward())
    model.zero_grad(set_to_none=True)
    return peak


def compiled(budget, policy=POLICY):
    return fxckpt.compile(net(), compiler="eager", policy=policy, budget=budget)


def step_floor(policy=POLICY) -> int:
    """The floor BudgetError names at a one-byte budget, after the first step."""
    model = compiled(1, policy)
    with pytest.raises(fxckpt.BudgetError) as refused:
        for _ in range(2):
            measured_step(model)
    assert "whole step" in str(refused.value) and "fallback region" in str(refused.value)
    return refused.value.floor_bytes


def test_a_budget_that_needs_the_region_at_its_floor():
    """With the user's policy the body holds what it saves; between the step
    floor and that peak, the first step is over the budget and the body runs
    at its floor from the second step on: the measured peak is within the
    budget, the body holds what was predicted of its floor, and gradients
    equal eager's bit for bit."""
    policy_peak = measured_step(compiled(None))
    torch._dynamo.reset()
    floor = step_floor()
    torch._dynamo.reset()
    assert floor < policy_peak
    budget = (floor + policy_peak) // 2
    model = compiled(budget)
    peaks = [measured_step(model) for _ in range(3)]
    assert peaks[0] > budget            # the first step runs the user's policy
    assert max(peaks[1:]) <= budget
    region = model.fxckpt_report.regions[0]
    assert region.policy.startswith("its floor") and "over it" in region.why
    assert region.saved_bytes == region.floor_bytes == BATCH * D * 4   # its input only
    assert region.policy_bytes > 10 * region.floor_bytes
    assert_bitwise_equal(run_step(net(), INPUTS, loss_fn), run_step(model, INPUTS, loss_fn))


def test_a_budget_the_user_policy_fits_keeps_it():
    policy_peak = measured_step(compiled(None))
    torch._dynamo.reset()
    # The step's model holds a region's saved outputs through the whole
    # backward, where fxckpt.checkpoint lets each go once recomputed: it
    # reads this step about 1.6x its measured peak.
    budget = int(policy_peak * 1.7)
    model = compiled(budget)
    peaks = [measured_step(model) for _ in range(2)]
    region = model.fxckpt_report.regions[0]
    assert region.policy.startswith("the user's policy") and "fits" in region.why
    assert region.saved_bytes == region.policy_bytes
    assert max(peaks) <= budget


def test_the_step_floor_counts_the_region_at_its_floor_and_is_met():
    """A one-byte budget is refused after the first step with the step's
    floor (graphs and region at theirs); that budget is then met from the
    second step on, bitwise equal to eager."""
    floor = step_floor()
    torch._dynamo.reset()
    model = compiled(floor)
    peaks = [measured_step(model) for _ in range(3)]
    assert max(peaks[1:]) <= floor
    assert model.fxckpt_report.regions[0].policy.startswith("its floor")
    assert_bitwise_equal(run_step(net(), INPUTS, loss_fn), run_step(model, INPUTS, loss_fn))


def test_must_answers_of_the_user_policy_stay_at_the_floor():
    """fc2's matmul is MUST_SAVE: the floor keeps it (BATCH x D floats)."""
    policy = first(must(save_ops(torch.ops.aten.addmm)), save_all())
    model = compiled(0.0, policy)
    measured_step(model)
    region = model.fxckpt_report.regions[0]
    assert region.floor_bytes == region.saved_bytes
    assert region.saved_bytes == BATCH * D * 4 + BATCH * 4 * D * 4 + BATCH * D * 4
    assert_bitwise_equal(run_step(net(), INPUTS, loss_fn), run_step(model, INPUTS, loss_fn))


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_fractions_run_the_region_from_its_floor_to_the_user_policy(fraction):
    """0: the floor from the first step; 1: the user's policy; 0.5: the
    user's first optional saves that stay within half the way, from the
    second step. Bitwise equal to eager in each case."""
    model = compiled(fraction)
    for _ in range(2):
        measured_step(model)
    region = model.fxckpt_report.regions[0]
    assert region.floor_bytes == BATCH * D * 4
    if fraction == 0.0:
        assert region.policy.startswith("its floor")
        assert region.saved_bytes == region.floor_bytes
    elif fraction == 1.0:
        assert region.policy.startswith("the user's policy")
        assert region.saved_bytes == region.policy_bytes
    else:
        half = region.floor_bytes + (region.policy_bytes - region.floor_bytes) // 2
        assert region.floor_bytes < region.saved_bytes <= half
        assert "optional save" in region.why
    assert_bitwise_equal(run_step(net(), INPUTS, loss_fn), run_step(model, INPUTS, loss_fn))


def test_the_report_says_which_policy_and_why():
    model = compiled(0.0)
    measured_step(model)
    text = str(model.fxckpt_report)
    assert "policy: its floor (save_all(), only its MUST answers followed): budget fraction 0" \
        in text


def test_without_a_user_policy_the_region_is_already_at_its_floor():
    model = compiled(1, policy=None)
    measured_step(model)
    region = model.fxckpt_report.regions[0]
    assert region.floor_bytes == region.policy_bytes == region.saved_bytes


def test_a_region_first_in_the_step_is_refused_with_the_step_floor():
    """A region before any graph, over the budget by itself: the first step
    runs, and the second begins with BudgetError naming a floor that holds."""
    torch.manual_seed(0)
    model = nn.Sequential(Body(), nn.Linear(D, 10))
    x = torch.randn(BATCH, D)
    run = fxckpt.compile(copy.deepcopy(model), compiler="eager", policy=POLICY,
                         budget=BATCH * D * 4)

    def one_step(m):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        return measure_peak_bytes(lambda: loss_fn(m(x)).backward())

    one_step(run)
    with pytest.raises(fxckpt.BudgetError) as refused:
        one_step(run)
    floor = refused.value.floor_bytes
    torch._dynamo.reset()
    run = fxckpt.compile(copy.deepcopy(model), compiler="eager", policy=POLICY, budget=floor)
    peaks = [one_step(run) for _ in range(3)]
    assert max(peaks[1:]) <= floor


# --- the arithmetic ------------------------------------------------------------

def test_region_bytes_at_every_keep():
    measured = RegionBytes(held=100, floor=10, optional=((30, 20, 40),), activations=5)
    assert [measured.at(k) for k in (0, 1, 2, 3, None)] == [10, 40, 60, 100, 100]
    assert measured.keep_for(0.0) == 0
    assert measured.keep_for(0.5) == 1          # 40 <= 10 + 0.5 x 90 < 60
    assert measured.keep_for(0.6) == 2          # 60 <= 10 + 0.6 x 90 < 100
    assert measured.keep_for(1.0) is None
    twice = measured + measured
    assert twice.at(1) == 80 and twice.activations == 10


def test_regions_move_to_their_floor_only_when_the_graphs_cannot_make_room():
    # One graph, run once, after two regions; (own peak, saved, cost) points.
    graphs = [(1, ((100, 50, 4.0), (200, 150, 0.0)), 0)]
    big = RegionChoice(0, 0, policy=(300, 300), floor=(20, 20))
    small = RegionChoice(0, 0, policy=(60, 60), floor=(10, 10))
    assert allocate_step(graphs, [0], 10_000, [big, small]) == ([False, False], [1])
    # The graph at its floor makes room for both regions' policies.
    assert allocate_step(graphs, [0], 460, [big, small]) == ([False, False], [0])
    # Not enough: the region that frees most moves first, alone if that fits.
    assert allocate_step(graphs, [0], 400, [big, small]) == ([True, False], [1])
    with pytest.raises(StepFloor) as refused:
        allocate_step(graphs, [0], 100, [big, small])
    assert refused.value.floor == 20 + 10 + 100


def test_the_step_runs_in_order_with_later_gradients_alive():
    """Graph 0 runs twice, a region between its runs, graph 1 last. Backward
    runs in reverse: while a run's backward runs, the gradients the runs
    after it made are alive, and what the runs before it saved."""
    graphs = [(2, ((100, 10, 0.0),), 7), (1, ((50, 5, 0.0),), 3)]
    region = RegionChoice(1, 40, policy=(90, 30), floor=(60, 0))
    items, sequence = step_items(graphs, [0, 0, 1], [region], [False])
    assert [item for item, _ in sequence] == [0, 2, 0, 1]
    assert [later for _, later in sequence] == [7 + 40 + 3, 7 + 3, 3, 0]
    assert step_peak([0, 0, 0], items, 0, sequence) == max(
        100 + 50, 10 + 90 + 10, 10 + 30 + 100 + 3, 10 + 30 + 10 + 50)
    # Without a sequence, each graph's runs are back to back, no gradients.
    assert step_peak([0, 0], items[:2], 0) == max(100, 10 + 100, 20 + 50)

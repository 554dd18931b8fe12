"""fxckpt under FSDP2 and DDP on two gloo ranks (CPU).

The ranks run once for the whole module (tests/dist_worker.py, spawned with
torch.multiprocessing): each trains the built-in GPT under FSDP2 (one
``fully_shard`` per block, the model compiled) and under DDP, and a Hugging
Face Llama under FSDP2 (one ``fully_shard`` per decoder layer, each layer
compiled on its own), with fxckpt and without, 3 SGD steps, and compares
losses and gradients bit for bit inside the process. The tests read what the
ranks wrote.

The reference is the same wrapped model run eagerly: what a user runs without
compiling. For the FSDP2 GPT, ``torch.compile(backend="aot_eager")`` is run too;
it is the same traced graph with AOTAutograd's default partition, so fxckpt
matching it isolates the checkpointing, and it matching eager bit for bit shows
the tracing itself changes nothing.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
import torch.distributed as dist

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                       reason="needs torch.distributed with gloo"),
]

try:
    from tests import dist_worker
except ImportError:  # tests/ itself on sys.path
    import dist_worker

WORLD_SIZE = 2
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case's results, one dict per rank."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ranks")
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(dist_worker.main,
                                 args=(WORLD_SIZE, init_method, str(out)),
                                 nprocs=WORLD_SIZE, start_method="spawn", join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s")
    return {case: [json.loads((out / f"{case}.{rank}.json").read_text())
                   for rank in range(WORLD_SIZE)]
            for case in dist_worker.CASES}


def results(ranks, case: str) -> list[dict]:
    per_rank = ranks[case]
    for rank, result in enumerate(per_rank):
        if not result["ok"]:
            pytest.fail(f"{case} failed on rank {rank}:\n{result['error']}")
    return per_rank


def assert_matches(result: dict, reference: str) -> None:
    comparison = result[f"vs_{reference}"]
    assert comparison["losses_equal"], (reference, result["losses"])
    assert comparison["grads_equal"], (
        f"gradients differ from {reference}'s at {comparison['first_diff']}, "
        f"by up to {comparison['max_grad_diff']:.3e}")


def assert_plans_agree(per_rank: list[dict]) -> None:
    fingerprints = [r["fingerprints"] for r in per_rank]
    assert fingerprints[0], "fxckpt made no plan"
    assert all(f == fingerprints[0] for f in fingerprints), fingerprints
    assert len({r["agreed"] for r in per_rank}) == 1


def assert_within_budget(result: dict) -> None:
    """Every step within the step budget; where the backend re-planned after
    the first step (a graph that runs once per block), every step after it."""
    budget = result["step_budget"]
    first = 1 if result.get("replans") else 0
    for step, (measured, planned, peak) in enumerate(zip(
            result["saved_bytes"], result["held_bytes"], result["peak_bytes"])):
        if step < first:
            continue
        # Measured: what the compiled graphs' autograd nodes held, each storage
        # once, parameters left out; planned: each run's plan.saved_bytes.
        assert measured <= budget, f"step {step}: saved {measured} B > budget {budget} B"
        assert peak <= budget, f"step {step}: the plans peak at {peak} B > budget {budget} B"
        # The plans never count less than is held; they may count more where
        # consecutive graphs save the same tensor (one block's output is the
        # next block's input): each plan counts it, the measurement once.
        assert planned * 0.95 <= measured <= planned * 1.01, (step, measured, planned)


@pytest.mark.releases
# --- FSDP2, the built-in GPT ---------------------------------------------------

def test_fsdp2_gpt_trains_bit_for_bit_as_without_fxckpt(ranks):
    for result in results(ranks, "fsdp2_gpt"):
        assert_matches(result, "eager")
        assert_matches(result, "aot_eager")
        assert result["aot_eager_vs_eager"]["grads_equal"]
        assert result["plans"][-1]["recomputed"] > 0   # the budget made it recompute


def test_fsdp2_gpt_plans_agree_across_ranks(ranks):
    assert_plans_agree(results(ranks, "fsdp2_gpt"))


def test_fsdp2_compiles_one_graph_per_block_class_and_runs_it_per_block(ranks):
    # FSDP2's hooks break the graph around every block; Dynamo compiles the
    # block's forward once and reuses it, so the step holds its saved bytes
    # once per block: the backend's ledger counts the runs and re-plans once.
    for result in results(ranks, "fsdp2_gpt"):
        assert result["graphs"] == 1
        assert result["runs"] == [[result["n_layer"]]] * dist_worker.STEPS
        assert result["ledger_runs"] == [result["n_layer"]]
        assert result["replans"] == 1


def test_fsdp2_gpt_saved_bytes_within_budget(ranks):
    for result in results(ranks, "fsdp2_gpt"):
        assert_within_budget(result)
        assert result["checked_step_peak"] <= result["step_budget"]


# --- DDP, the built-in GPT -----------------------------------------------------

def test_ddp_gpt_trains_bit_for_bit_as_without_fxckpt(ranks):
    for result in results(ranks, "ddp_gpt"):
        assert_matches(result, "eager")


def test_ddp_gpt_plans_agree_across_ranks(ranks):
    assert_plans_agree(results(ranks, "ddp_gpt"))


def test_ddp_splits_the_graph_and_the_budget(ranks):
    # DDPOptimizer cuts the graph at the 1 MiB bucket boundary; each piece runs
    # once, and the second is given the budget less what the first saves.
    for result in results(ranks, "ddp_gpt"):
        first, second = result["plans"]
        assert result["runs"] == [[1, 1]] * dist_worker.STEPS
        assert first["budget_bytes"] == result["step_budget"]
        assert second["budget_bytes"] == result["step_budget"] - first["saved_bytes"]
        assert_within_budget(result)


# --- FSDP2, a Hugging Face Llama -----------------------------------------------

def test_fsdp2_llama_trains_bit_for_bit_as_without_fxckpt(ranks):
    per_rank = results(ranks, "fsdp2_llama")
    for result in per_rank:
        assert_matches(result, "eager")
        # Each decoder layer compiled on its own: one graph, run once per layer.
        assert result["runs"] == [[result["n_layer"]]] * dist_worker.STEPS
        assert_within_budget(result)
    assert_plans_agree(per_rank)


# --- collectives inside a graph ------------------------------------------------

def test_collective_in_the_graph_is_saved_never_recomputed(ranks):
    for result in results(ranks, "collectives"):
        for asked in ("default", "prefer_recompute"):
            (wait,) = result[asked]
            assert wait["action"] == "saved"
            assert "collective communication" in wait["reason"]
        assert result["default_matches_eager"]
        assert result["prefer_recompute_matches_eager"]


@pytest.mark.parametrize("policy", ["sac_must_recompute", "must_recompute_ops"])
def test_policy_that_must_recompute_a_collective_is_an_error(ranks, policy):
    for result in results(ranks, "collectives"):
        message = result[policy]
        assert message is not None, f"{policy} was accepted"
        assert "_c10d_functional.all_reduce" in message
        assert "collective communication" in message


def test_ranks_that_plan_differently_are_told(ranks):
    for result in results(ranks, "collectives"):
        assert "plans differ between rank 0 and rank 1" in result["disagreement"]


# --- fingerprints, in one process ------------------------------------------------

def test_fingerprint_sees_decisions_not_timings():
    import dataclasses

    import fxckpt
    from fxckpt.distributed import check_plans_agree, plans_fingerprint

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    plan = fxckpt.explain(model, torch.randn(4, 8))
    assert plan.fingerprint == dataclasses.replace(
        plan, solve_seconds=9.0, plan_seconds=9.0, graph_id=99).fingerprint
    assert plan.fingerprint != dataclasses.replace(plan, saved=plan.saved[1:]).fingerprint
    assert plan.fingerprint != dataclasses.replace(
        plan, saved_bytes=plan.saved_bytes + 1).fingerprint
    # Without a process group there is no one to disagree with.
    assert check_plans_agree([plan]) == plans_fingerprint([plan])

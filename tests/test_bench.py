"""``fxckpt bench``: the quick run's JSON has every row and column, fxckpt's
rows train bit for bit like eager, and the pieces the table rests on (the
work counter, the torchtitan policy, the verdicts, the solver suite) do
what they say."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fxckpt import cli
from fxckpt.bench import run as bench
from fxckpt.bench import solvers as bench_solvers
from fxckpt.bench import ways as bench_ways
from fxckpt.bench.work import WorkCounter

aten = torch.ops.aten


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # One model (the GPT: dropout, attention, tied weights); the others run
    # the same code.
    assert cli.main(["bench", "--model", "gpt", "--quick", "--out", str(out)]) == 0
    with open(out / "bench.json") as f:
        return json.load(f), out


def test_quick_run_writes_every_row_and_column(quick):
    result, out = quick
    assert (out / "bench.md").stat().st_size > 0
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert result["command"] == f"fxckpt bench --model gpt --quick --out {out}"
    assert result["columns"] == list(bench.ROW_FIELDS)
    assert {"processor", "cpus", "threads", "torch"} <= set(result["machine"])
    expected = [w.key for w in bench_ways.ways(inductor=False)]
    markdown = (out / "bench.md").read_text()
    assert [m["model"] for m in result["models"]] == ["gpt"]
    for model in result["models"]:
        assert [row["key"] for row in model["rows"]] == expected
        for row in model["rows"]:
            assert set(row) == set(bench.ROW_FIELDS), row["key"]
            assert row["label"] in markdown
            if row["skipped"]:
                assert row["family"] == "fxckpt" and "BudgetError" in row["skipped"]
                continue
            assert row["measured_peak_bytes"] > 0 and row["saved_bytes"] >= 0
            assert row["step_seconds"] > 0 and row["step_time_ratio"] > 0
            assert row["recompute_flops"] is not None and row["recompute_cost"] is not None
            assert row["matches_eager"] is not None and row["max_abs_error"] >= 0
            if row["family"] != "eager":
                assert row["compile_seconds"] is not None
                assert row["partition_seconds"] is not None
            if row["family"] == "fxckpt":
                assert row["predicted_peak_bytes"] > 0 and row["solve_seconds"] is not None
        assert [c["torch_key"] for c in model["comparisons"]] == [
            bench_ways.torch_key(b) for b in (0.5, 0.25, 0.0)]
        for comparison in model["comparisons"]:
            assert comparison["verdict"].split(":")[0] in ("ahead", "behind")
        assert model["floor"]["fxckpt_floor_bytes"] == model["floor"]["pareto_floor_bytes"]
        assert model["floor"]["verdict"]
        assert model["frontier"] and model["modelled_step_cost"] > 0


def test_fxckpt_rows_match_eager_bitwise_and_their_predictions(quick):
    result, _ = quick
    for model in result["models"]:
        rows = {row["key"]: row for row in model["rows"]}
        assert not rows["fxckpt_default"]["skipped"]
        assert rows["compile_save_all"]["recompute_cost"] == 0.0
        for row in rows.values():
            if row["family"] != "fxckpt" or row["skipped"]:
                continue
            assert row["matches_eager"] and row["max_abs_error"] == 0.0, row["key"]
            assert row["graphs"] == 1
            if row["budget_bytes"] is not None:
                assert row["predicted_peak_bytes"] <= row["budget_bytes"]
            # The peak the memory model predicts is the peak measured (10%; the
            # quick run's tiny models add a few KiB of scratch the model does
            # not count), and the recompute counted while it ran is the plan's.
            assert abs(row["measured_peak_bytes"] - row["predicted_peak_bytes"]) \
                <= max(0.10 * row["measured_peak_bytes"], 16 * 1024), row["key"]
            assert row["recompute_cost"] == pytest.approx(row["planned_recompute_cost"],
                                                          rel=0.05, abs=1e-7), row["key"]


def test_work_counter_counts_matmul_flops_and_bytes():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with WorkCounter() as work:
        torch.mm(a, b)
        a.view(16, 8)                      # a view moves nothing
    assert work.flops == 2 * 8 * 16 * 4
    moved = (8 * 16 + 16 * 4 + 8 * 4) * 4
    assert work.cost == pytest.approx(work.flops / 1e12 + moved / 1e11)


def test_torchtitan_policy_saves_every_other_matmul_and_attention():
    contexts = bench_ways.torchtitan_contexts()
    policy = contexts[0].policy_fn
    forward = torch.utils.checkpoint.SelectiveCheckpointContext(is_recompute=False)
    recompute = torch.utils.checkpoint.SelectiveCheckpointContext(is_recompute=True)
    must, prefer = (torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE,
                    torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)
    ops = [aten.addmm.default, aten.mm.default, aten.bmm.default, aten.mm.default,
           aten.gelu.default, aten._scaled_dot_product_flash_attention_for_cpu.default]
    expected = [must, prefer, must, must, prefer, must]
    assert [policy(forward, op) for op in ops] == expected
    # The recompute counts its own matmuls, so it makes the same choices.
    assert [policy(recompute, op) for op in ops] == expected


def _row(key, peak, cost, skipped=""):
    return {"key": key, "budget_bytes": peak, "measured_peak_bytes": peak,
            "recompute_cost": cost, "step_time_ratio": 1.0, "skipped": skipped}


def test_verdicts_compare_peak_and_recompute_cost():
    torch_row = _row("torch_budget_0.5", 100, 2e-3)
    ahead = bench.compare_at_budget(torch_row, _row("fx", 90, 1e-3))
    assert ahead["peak_ok"] and ahead["cost_ok"] and ahead["verdict"].startswith("ahead")
    assert ahead["peak_ratio"] == pytest.approx(0.9) and ahead["cost_ratio"] == 0.5
    costly = bench.compare_at_budget(torch_row, _row("fx", 100, 3e-3))
    assert costly["peak_ok"] and not costly["cost_ok"]
    assert costly["verdict"] == "behind: recompute cost 1.50x torch's"
    refused = bench.compare_at_budget(torch_row, _row("fx", None, None, skipped="BudgetError"))
    assert refused["verdict"] == "behind: BudgetError"
    free = bench.compare_at_budget(_row("t", 100, 0.0), _row("fx", 100, 1e-3))
    assert math.isinf(free["cost_ratio"]) and not free["cost_ok"]


def test_solver_suite_reports_nodes_times_and_cost_gaps():
    progress = bench.Progress(None)
    result = bench_solvers.run_solvers(n_layer=2, models=("mlp",), size="tiny",
                                       compile_gpt_layers=1, hf_models=("hf_gpt2",),
                                       progress=progress)
    large = result["large"]
    assert large["joint_nodes"] > large["forward_values"] > 0
    assert large["solve_seconds"] >= 0 and large["predicted_peak_bytes"] <= large["budget_bytes"]
    (zoo,) = result["zoo"]
    assert len(zoo["budgets"]) == len(bench_solvers.BUDGET_POSITIONS)
    for budget in zoo["budgets"]:
        assert budget["ilp_recompute_cost"] is not None        # the ILP's floor fits
        if budget["fast_recompute_cost"] is not None:
            assert budget["fast_over_ilp"] is not None
    compiled = result["compile_gpt"]
    assert [b["position"] for b in compiled["budgets"]] == list(bench_solvers.FINE_POSITIONS)
    assert compiled["budgets"][-1]["fast_recompute_cost"] is not None   # the top fits both
    markdown = bench_solvers.solvers_markdown(result)
    assert "fast vs ILP over the zoo's" in markdown
    assert "fast vs ILP over the compile suite's GPT's" in markdown
    (hf,) = result["hf"]
    assert [b["position"] for b in hf["budgets"]] == list(bench_solvers.FINE_POSITIONS)
    assert "fast vs ILP over hf_gpt2 (tiny)'s" in markdown


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def test_captured_sizes_stay_static_after_other_sizes_of_the_model():
    # The solvers suite captures the zoo GPT after the 58-layer one: with
    # automatic dynamic shapes (the models' code is shared) the second
    # capture had symbolic sizes, a different graph from the one captured
    # alone.
    from fxckpt.bench.ways import Step
    from fxckpt.models import GPT, GPTConfig, gpt_loss

    def step(n_embd, block_size):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=32, block_size=block_size, n_layer=1, n_head=2,
                           n_embd=n_embd)
        idx = torch.randint(32, (2, block_size))
        return Step(GPT(config), lambda logits: gpt_loss(logits, idx)), (idx,)

    bench_solvers.capture_joint(*step(16, 8))
    joint = bench_solvers.capture_joint(*step(32, 12))[0]
    symbolic = [n for n in joint.graph.nodes
                if isinstance(n.meta.get("val"), torch.SymInt | torch.SymFloat)]
    assert not symbolic


def test_bench_and_demo_leave_the_callers_compiled_model_alone():
    """The bench and the demo compile many steps in the caller's process and
    never reset Dynamo: a model compiled before them runs after them without
    compiling again, and each of their steps compiles (no recompile limit
    reached)."""
    from fxckpt.cli import demo

    user = torch.compile(torch.nn.Linear(4, 4), backend="aot_eager")
    x = torch.randn(2, 4)
    user(x).sum().backward()
    before = _frames_compiled()
    rows = bench.measure_rows("mlp", ["compile_checkpoint", "torch_budget_0.5",
                                      "fxckpt_default", "fxckpt_per_block",
                                      "fxckpt_at_torch_budget_0.5"], size="tiny", repeat=1)
    assert all(not row["skipped"] for row in rows)
    assert all(row["family"] == "fxckpt" or row["recompute_cost"] is not None for row in rows)
    shown = demo.train_way("(a)", "aot_eager", 2)
    assert shown.peak_bytes > 0
    compiled = _frames_compiled()
    # eager, the save-all reference and the five rows compile one step each
    # (eager runs uncompiled), the demo one more.
    assert compiled - before >= 6
    user(x).sum().backward()
    assert _frames_compiled() == compiled

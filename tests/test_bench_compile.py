"""``fxckpt bench --suite compile`` at its quick size: the table has its
rows and columns, both processes ran every way, and fxckpt's rows made the
plans planning without the schedule model makes."""

from __future__ import annotations

import json

import pytest
import torch

from fxckpt import cli
from fxckpt.bench import compile as bench_compile
from fxckpt.bench.solvers import capture_joint
from fxckpt.options import Options
from fxckpt.planning.pipeline import Planner


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile")
    assert cli.main(["bench", "--suite", "compile", "--quick", "--out", str(out)]) == 0
    with open(out / "compile.json") as f:
        return json.load(f), (out / "compile.md").read_text()


def test_the_table_has_every_row_and_way(quick):
    result, markdown = quick
    assert result["command"].startswith("fxckpt bench --suite compile --quick")
    assert [(r["layers"], r["compiler"]) for r in result["rows"]] == [(2, "aot_eager")]
    row = result["rows"][0]
    for process in ("first", "second"):
        assert set(row[process]) == set(bench_compile.WAYS)
        for way in bench_compile.WAYS:
            assert row[process][way]["seconds"] > 0
    assert "| 2 | aot_eager |" in markdown
    first = row["first"]
    assert first["fxckpt_budget"]["planning_seconds"] > 0
    assert len(first["fxckpt_budget"]["fingerprints"]) == 1


def test_fxckpt_rows_plan_what_the_slow_way_plans(quick):
    """Each fxckpt row's plan, in both processes, is the plan the planner
    makes with every candidate rewritten and simulated."""
    result, _ = quick
    row = result["rows"][0]
    # The rows ran in fresh processes; here, an earlier test's compile of the
    # same GPT code at other sizes would make Dynamo capture it with dynamic
    # sizes (automatic dynamic), a different graph.
    torch._dynamo.reset()
    joint, joint_inputs, kwargs = capture_joint(*bench_compile.gpt_step(2))
    for way, budget in (("fxckpt_default", None), ("fxckpt_budget", result["budget"])):
        planner = Planner(Options.create(compiler="eager", budget=budget))
        planner.estimates = False
        planner(joint, joint_inputs, **kwargs)
        slow = planner.plans[0]
        for process in ("first", "second"):
            assert row[process][way]["fingerprints"] == [slow.fingerprint], (way, process)
            assert row[process][way]["peak_bytes"] == [slow.peak_bytes]


def _fake_run(seconds: float) -> dict:
    return {"seconds": seconds, "wall_seconds": seconds, "planning_seconds": seconds / 4,
            "fingerprints": [f"{seconds}"], "peak_bytes": [1]}


def test_rounds_rotate_the_ways_and_report_the_median_round(monkeypatch):
    """With repeat=3 each round runs every way, in an order rotated by one;
    a way's figures are its median round's, the ratio in the table the
    median of the ratios within each round."""
    order, seconds = [], {"fxckpt_budget": [3.0, 9.0, 4.0], "fxckpt_default": [1.0] * 3,
                          "torch_budget": [2.0] * 3, "torch_default": [2.0, 3.0, 4.0]}

    def first_and_second(way, n_layer, compiler, budget, threads):
        order.append(way)
        value = seconds[way][sum(w == way for w in order) - 1]
        return _fake_run(value), _fake_run(value / 2)

    monkeypatch.setattr(bench_compile, "_first_and_second", first_and_second)
    row = bench_compile.run_row_processes(4, "aot_eager", 0.5, repeat=3)
    ways = list(bench_compile.WAYS)
    assert order == ways + ways[1:] + ways[:1] + ways[2:] + ways[:2]
    assert row["first"]["fxckpt_budget"]["seconds"] == 4.0
    assert row["second"]["torch_default"]["seconds"] == 1.5
    assert bench_compile.round_ratios(row, "fxckpt_budget", "torch_default") == [1.5, 3.0, 1.0]
    markdown = bench_compile.compile_markdown({"budget": 0.5, "repeat": 3, "rows": [row]})
    line = next(text for text in markdown.splitlines() if text.startswith("| 4 |"))
    # Median of 1.5, 3.0, 1.0 within rounds; not 4.0 / 3.0 of the medians.
    assert "| 1.50x |" in line and "1.50x, 3.00x, 1.00x |" in line
    assert "3 rounds" in markdown

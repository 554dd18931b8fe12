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

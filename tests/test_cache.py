"""The plan cache: a key two processes agree on, that follows every option;
a second process served from torch's caches takes the same plans without
planning; plans that cannot be keyed are not cached, and say why."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxckpt
from fxckpt.entry.backend import Backend
from fxckpt.planning.cache import plan_key
from fxckpt.planning.capture import compile_planned
from fxckpt.options import Budget, Options
from fxckpt.planning.pipeline import Planned
from fxckpt.policies import recompute_all, save_matmuls
from fxckpt.policies.digest import Unkeyable, function_text, policy_text
from fxckpt.policies.builtin import by_module, first, save_ops

try:
    from tests import cache_worker
except ImportError:  # pragma: no cover
    import cache_worker

WORKER = Path(cache_worker.__file__)
ROOT = WORKER.parent.parent

pytestmark = pytest.mark.usefixtures("reset_dynamo")


def _in_subprocess(tmp_path, mode, *args):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(WORKER), mode, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def plan_cache(tmp_path, monkeypatch):
    """Caches on, in a directory of the test's own."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with torch._functorch.config.patch(enable_autograd_cache=True):
        yield tmp_path / "fxckpt" / "plans"


def _stored(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.pickle")) if directory.exists() else []


@pytest.mark.releases
# -- the key -----------------------------------------------------------------

def test_key_is_the_same_in_another_process(tmp_path, monkeypatch):
    # The key reads the thread count, which earlier tests may have set here.
    monkeypatch.setenv("CACHE_WORKER_THREADS", str(torch.get_num_threads()))
    gm, example_inputs = cache_worker.dynamo_graph(*cache_worker.small())
    for policy in (None, "save_matmuls_fn"):
        options = Options.create(policy=getattr(cache_worker, policy or "", None))
        here = plan_key(gm, example_inputs, options)
        there = _in_subprocess(tmp_path, "key", *([policy] if policy else []))["key"]
        assert here.digest is not None, here.why_not
        assert here.digest == there


def test_key_reads_the_source_of_every_stage():
    """A plan made by other code is not taken: the key reads every Python
    file of the package, not only those beside the cache (it once read
    planning/ alone, and a fix to tagging or solving kept the old plans)."""
    from fxckpt.planning import cache

    package = Path(fxckpt.__file__).parent
    hashed = {Path(path) for path in cache.source_files()}
    assert hashed == set(package.rglob("*.py"))
    assert {package / "passes" / "tag.py", package / "solve" / "fast.py",
            package / "ops.py"} <= hashed


def test_key_follows_every_option_that_shapes_a_plan():
    gm, example_inputs = cache_worker.dynamo_graph(*cache_worker.small())
    base = Options.create()
    variants = [
        base,
        Options.create(budget=1_000_000), Options.create(budget=2_000_000),
        Options.create(budget=0.5), Options.create(compiler="eager"),
        Options.create(solver="fast"), Options.create(offload_bandwidth="12GB/s"),
        Options(budget=Budget(bytes=1_000_000), runs_per_step=2),
        Options.create(policy=save_matmuls()), Options.create(policy=recompute_all()),
        Options.create(policy=cache_worker.save_matmuls_fn),
        Options.create(policy=[torch.ops.aten.mm.default]),
    ]
    keys = [plan_key(gm, example_inputs, options).digest for options in variants]
    assert None not in keys and len(set(keys)) == len(variants)
    assert plan_key(gm, example_inputs, base, num_lifted_params=3).digest != keys[0]
    other_gm, other_inputs = cache_worker.dynamo_graph(cache_worker.Small(), torch.randn(8, 16))
    assert plan_key(other_gm, other_inputs, base).digest != keys[0]
    # The memory model counts per-thread CPU buffers: another thread count,
    # another key.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert plan_key(gm, example_inputs, base).digest != keys[0]
    finally:
        torch.set_num_threads(threads)
    assert plan_key(gm, example_inputs, base).digest == keys[0]


def test_symbolic_sizes_are_not_keyed():
    seen = []
    torch.compile(cache_worker.Small(), dynamic=True,
                  backend=lambda gm, inputs: seen.append((gm, inputs)) or gm.forward)(
        torch.randn(8, 16))
    key = plan_key(*seen[0], Options.create())
    assert key.digest is None and "symbolic sizes" in key.why_not


# -- policies written out ----------------------------------------------------

def test_policy_text_tells_policies_apart():
    mm, bmm = torch.ops.aten.mm.default, torch.ops.aten.bmm.default
    texts = {policy_text(p) for p in (save_ops(mm), save_ops(bmm), save_matmuls(),
                                      first(by_module("fc1", recompute_all()), save_matmuls()))}
    assert len(texts) == 4
    assert policy_text(save_ops(mm)) == policy_text(save_ops(mm))


def _closing_over(saved):
    def policy_fn(ctx, op, *args, **kwargs):
        return op in saved
    return policy_fn


COUNT = 0


def _counting(ctx, op, *args, **kwargs):
    global COUNT
    COUNT += 1
    return COUNT % 2 == 0


def test_function_text_reads_closures_and_refuses_state():
    mm = torch.ops.aten.mm.default
    assert function_text(_closing_over((mm,))) == function_text(_closing_over((mm,)))
    assert function_text(_closing_over((mm,))) != function_text(_closing_over(()))
    with pytest.raises(Unkeyable, match="closure variable saved holds"):
        function_text(_closing_over([mm]))
    with pytest.raises(Unkeyable, match="rebinds 'COUNT'"):
        function_text(_counting)
    with pytest.raises(Unkeyable, match="not a plain function"):
        function_text(functools.partial(cache_worker.save_matmuls_fn, None))


# -- plans served from the caches --------------------------------------------

def test_second_process_takes_the_plans_without_planning(tmp_path):
    # A byte budget: the step ledger needs each graph's frontier as well.
    first_run = _in_subprocess(tmp_path, "step", 10**9)
    second_run = _in_subprocess(tmp_path, "step", 10**9)
    assert first_run["planned"] == 1 and second_run["planned"] == 0
    assert second_run["autograd_cache"].get("autograd_cache_hit") == 1
    assert second_run["fingerprints"] == first_run["fingerprints"]
    assert second_run["ledger_plans"] == first_run["fingerprints"]
    assert second_run["frontiers"] == first_run["frontiers"] and first_run["frontiers"][0]
    assert any("plan cache" in note for note in second_run["notes"][0])
    assert second_run["grads"] == first_run["grads"]
    assert "saved" in second_run["explained"]
    # Torch's caches without fxckpt's: the graph is compiled again, and planned.
    shutil.rmtree(tmp_path / "fxckpt" / "plans")
    third_run = _in_subprocess(tmp_path, "step", 10**9)
    assert third_run["planned"] == 1
    assert third_run["fingerprints"] == first_run["fingerprints"]
    assert third_run["grads"] == first_run["grads"]
    assert len(_stored(tmp_path / "fxckpt" / "plans")) == 1


def _step(model_and_input, backend):
    model, x = model_and_input
    torch.compile(model, backend=backend)(x).square().mean().backward()
    return model


def test_unkeyable_policy_function_is_planned_afresh_with_a_note(plan_cache):
    backend = fxckpt.backend(compiler="eager", policy=cache_worker.save_listed_fn)
    _step(cache_worker.small(), backend)
    (plan,) = backend.plans
    assert any(note.startswith("not cached") and "SAVED_OPS_LIST" in note
               for note in plan.notes), plan.notes
    assert _stored(plan_cache) == []
    torch._dynamo.reset()
    backend = fxckpt.backend(compiler="eager", policy=cache_worker.save_matmuls_fn)
    _step(cache_worker.small(), backend)
    assert not any("not cached" in note for note in backend.plans[0].notes)
    assert len(_stored(plan_cache)) == 1

@pytest.mark.releases
def test_recompile_follows_the_stored_decision(plan_cache):
    made = []
    for _ in range(2):
        torch._dynamo.reset()
        backend = fxckpt.backend(compiler="eager", budget=0.3)
        model = _step(cache_worker.small(), backend)
        made.append((backend.plans[0], [p.grad for p in model.parameters()]))
    (first_plan, first_grads), (again, again_grads) = made
    assert not any("followed" in note for note in first_plan.notes)
    assert any("followed the decision" in note for note in again.notes)
    assert again.fingerprint == first_plan.fingerprint
    assert dict(again.phase_seconds)["solve"] < dict(first_plan.phase_seconds)["solve"]
    for a, b in zip(first_grads, again_grads):
        assert torch.equal(a, b)


def test_a_decision_for_another_graph_is_not_followed():
    planners = []

    def keep(gm, example_inputs, planner):
        planners.append(planner)
        return compile_planned(gm, example_inputs, planner)

    _step(cache_worker.small(), Backend(Options.create(compiler="eager", budget=0.3),
                                        compile_fn=keep))
    (elsewhere,) = planners[0].records
    unrelated = Planned(elsewhere.plan, elsewhere.decision.__class__(
        saved=frozenset({"no_such_value"}), recomputed=frozenset(), solver="fast"), None)

    def with_unrelated(gm, example_inputs, planner):
        planner.reusable = [unrelated]
        return compile_planned(gm, example_inputs, planner)

    torch._dynamo.reset()
    backend = Backend(Options.create(compiler="eager", budget=0.3), compile_fn=with_unrelated)
    _step(cache_worker.small(), backend)
    assert backend.plans[0].fingerprint == elsewhere.plan.fingerprint
    assert not any("followed" in note for note in backend.plans[0].notes)

"""fxckpt.bench.measure against sizes worked out by hand.

Sizes are float32 (4 bytes an element). A 0-dim result (a loss, the ones
that start backward) is 4 bytes.
"""

import pytest
import torch

from fxckpt.bench import measure
from fxckpt.bench.measure import (SavedReport, cpu_memory_deltas, measure_peak_bytes,
                            measure_saved_bytes, peak_of, time_steps)
from fxckpt.models import make_model

N = 1 << 20          # elements
N_BYTES = 4 * N      # 4 MiB


# --- peak memory: known allocations -------------------------------------------

def test_a_tensor_kept_then_freed_is_its_size():
    def step():
        kept = torch.empty(N)
        kept.fill_(1.0)
        del kept

    assert measure_peak_bytes(step) == N_BYTES


def test_tensors_alive_together_add_up_and_in_turn_do_not():
    def together():
        first, second = torch.empty(N), torch.empty(N // 2)
        del first, second

    def in_turn():
        first = torch.empty(N)
        del first
        second = torch.empty(N // 2)
        del second

    assert measure_peak_bytes(together) == N_BYTES + N_BYTES // 2
    assert measure_peak_bytes(in_turn) == N_BYTES


def test_tensors_allocated_before_the_step_do_not_count():
    before = torch.ones(4 * N)

    def step():
        return before.sum()   # reads 16 MiB; allocates a 4-byte result and
                              # a few bytes of reduction scratch

    assert 4 <= measure_peak_bytes(step) <= 64


def test_freeing_an_older_tensor_does_not_lower_the_level():
    older = [torch.ones(4 * N)]

    def step():
        older.clear()               # frees 16 MiB allocated before the step
        fresh = torch.empty(N)
        del fresh

    assert measure_peak_bytes(step) == N_BYTES


def test_a_tensor_that_outlives_the_step_counts():
    kept = []
    assert measure_peak_bytes(lambda: kept.append(torch.empty(N))) == N_BYTES


def test_peak_of_a_backward_step_matches_the_hand_count():
    n = 1000
    x = torch.randn(n, requires_grad=True)
    # forward: exp's result e (saved by exp), the sum s; backward: the ones
    # that seed it, then x.grad = ones * e while e is still alive.
    assert measure_peak_bytes(lambda: x.exp().sum().backward()) == 8 * n + 8

    w = torch.randn(n, requires_grad=True)
    x.grad = None
    # sin's backward holds y = x*w (saved), cos(y) and grad_y: 3n + s + ones.
    assert measure_peak_bytes(
        lambda: (x * w).sin().sum().backward()) == 12 * n + 8


def test_frees_count_only_for_blocks_the_step_allocated():
    x = torch.randn(1000, requires_grad=True)
    w = torch.randn(1000, requires_grad=True)

    def step():
        x.grad = w.grad = None   # frees the grads of the last measured step
        (x * w).sin().sum().backward()

    first = cpu_memory_deltas(step)
    # The grads that the first measurement saw allocated are freed in the
    # second; the second must not count that, and so sees the same.
    assert cpu_memory_deltas(step) == first
    assert sum(first) == 2 * 4000           # only x.grad and w.grad remain
    assert peak_of(first) == 12 * 1000 + 8


def test_peak_of_running_totals():
    assert peak_of([]) == 0
    assert peak_of([-5, 3]) == 0          # frees of older blocks never count
    assert peak_of([4, -4, 2, 3, -5]) == 5


def test_a_training_step_peaks_above_what_it_saves():
    model, inputs, loss_fn = make_model("gpt", size="tiny")
    live = [*model.parameters(), *model.buffers()]
    saved = measure_saved_bytes(lambda: loss_fn(model(*inputs)), exclude=live)
    saved.output.backward()
    model.zero_grad(set_to_none=True)
    peak = measure_peak_bytes(lambda: loss_fn(model(*inputs)).backward())
    grads = sum(param.numel() * param.element_size()
                for param in model.parameters())
    # Activations saved for backward and the new gradients both peak within
    # the step; neither is negligible here.
    assert saved.total_bytes > 0
    assert peak >= saved.total_bytes
    assert peak >= grads


def test_unknown_device_is_an_error():
    with pytest.raises(ValueError, match="not supported"):
        measure_peak_bytes(lambda: None, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_counts_only_the_step():
    # Cached free blocks from earlier tests would be handed out whole where
    # splitting them leaves under 1 MiB (the allocator's large-block rule),
    # adding up to 1 MiB to the step's allocation: start from an empty cache.
    torch.cuda.empty_cache()
    before = torch.ones(4 * N, device="cuda")

    def step():
        kept = torch.empty(N, device="cuda")
        del kept
        return before.sum()

    peak = measure_peak_bytes(step, device="cuda")
    # The caching allocator rounds the 4-byte sum up to 512 bytes.
    assert N_BYTES <= peak <= N_BYTES + 512


# --- saved tensors -----------------------------------------------------------

def test_saved_bytes_of_mul_then_sin():
    n = 1000
    x = torch.randn(n, requires_grad=True)
    w = torch.randn(n, requires_grad=True)
    # mul saves x and w (each needs the other's grad); sin saves y = x * w.
    everything = measure_saved_bytes(lambda: (x * w).sin())
    assert (everything.total_bytes, everything.count) == (3 * 4 * n, 3)

    without_w = measure_saved_bytes(lambda: (x * w).sin(), exclude=[w])
    assert (without_w.total_bytes, without_w.count) == (2 * 4 * n, 2)

    only_y = measure_saved_bytes(lambda: (x * w).sin(), exclude=[x, w])
    assert (only_y.total_bytes, only_y.count) == (4 * n, 1)


def test_saved_views_count_their_storage_once():
    x = torch.randn(1000, requires_grad=True)

    def forward():
        y = x + 1                             # add saves nothing
        # sin saves a view of half of y, cos saves all of y: one storage.
        return y[:500].sin().sum() + y.cos().sum()

    report = measure_saved_bytes(forward)
    assert (report.total_bytes, report.count) == (4000, 1)


def test_excluding_a_tensor_excludes_its_views():
    weight = torch.nn.Parameter(torch.randn(8, 16))
    x = torch.randn(4, 16, requires_grad=True)
    # mm saves x (for weight's grad) and weight.t(), a view of weight (for
    # x's grad).
    def forward():
        return x @ weight.t()

    report = measure_saved_bytes(forward)
    assert (report.total_bytes, report.count) == (4 * 64 + 4 * 128, 2)
    report = measure_saved_bytes(forward, exclude=[weight])
    assert (report.total_bytes, report.count) == (4 * 64, 1)
    report = measure_saved_bytes(forward, exclude=[x[1:].detach()])
    assert (report.total_bytes, report.count) == (4 * 128, 1)


def test_backward_still_works_after_measuring():
    x = torch.randn(100, requires_grad=True)
    w = torch.randn(100, requires_grad=True)
    (x * w).sin().sum().backward()
    expected = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None

    report = measure_saved_bytes(lambda: (x * w).sin().sum())
    assert isinstance(report, SavedReport)
    report.output.backward()
    assert torch.equal(x.grad, expected[0])
    assert torch.equal(w.grad, expected[1])


def test_saved_report_prints_without_its_output():
    report = measure_saved_bytes(lambda: torch.ones(3, requires_grad=True).exp())
    assert repr(report) == "SavedReport(total_bytes=12, count=1)"


# --- time ----------------------------------------------------------------------

def test_time_steps_runs_warmup_then_repeat():
    calls = []
    times = time_steps(lambda: calls.append(1), repeat=3, warmup=2)
    assert len(calls) == 5
    assert len(times) == 3
    assert all(seconds >= 0 for seconds in times)


def test_time_steps_measures_the_step():
    import time

    times = time_steps(lambda: time.sleep(0.01), repeat=2, warmup=0)
    assert all(0.009 <= seconds < 1 for seconds in times)


@pytest.mark.parametrize("repeat, warmup", [(0, 1), (1, -1)])
def test_time_steps_rejects_bad_counts(repeat, warmup):
    with pytest.raises(ValueError, match="repeat"):
        time_steps(lambda: None, repeat=repeat, warmup=warmup)


def test_module_has_no_pipeline_dependency():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(measure))
    imported = {alias.name for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("fxckpt") for name in imported)

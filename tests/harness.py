"""Correctness harness: run one training step and compare results bit for bit.

Typical use::

    ref_mod, inputs, loss_fn = case.make()
    opt_mod, _, _ = case.make()              # or fresh(case)
    ref = run_step(ref_mod, inputs, loss_fn, seed=0)
    got = run_step(torch.compile(opt_mod, backend=...), inputs, loss_fn,
                   seed=0)
    assert_bitwise_equal(ref, got)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_map

_WRAPPER_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.")


def normalize_name(name: str) -> str:
    """Drop wrapper segments that ``torch.compile`` (``_orig_mod.``) and
    similar wrappers insert into parameter and buffer names."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def _detach_clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    return x


def _detach_outputs(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    try:
        return tree_map(_detach_clone, out)
    except Exception:  # pragma: no cover - unknown container type
        return out


@dataclass
class StepResult:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    outputs: Any = None
    # Buffers after the step (BatchNorm running stats etc.), by name.
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    # Names of parameters that require grad but got none.
    no_grad: tuple[str, ...] = ()


def run_step(module: nn.Module, inputs: tuple, loss_fn: Callable[[Any], torch.Tensor],
             *, seed: int = 0) -> StepResult:
    """One forward + loss + backward with ``torch.manual_seed(seed)`` set
    just before the forward.  Returns detached clones of the loss, of every
    parameter's ``.grad`` (by normalised name), of the outputs and of the
    buffers afterwards.  Gradients are cleared (set to None) before and after
    the step, so the module can be stepped again."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = module(*inputs)
    loss = loss_fn(out)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"loss_fn must return a scalar tensor, got {loss!r}")
    loss.backward()

    grads: dict[str, torch.Tensor] = {}
    no_grad: list[str] = []
    # named_parameters() de-duplicates shared (tied) parameters.
    for name, p in module.named_parameters():
        name = normalize_name(name)
        if p.grad is not None:
            grads[name] = p.grad.detach().clone()
        elif p.requires_grad:
            no_grad.append(name)
    buffers = {normalize_name(n): b.detach().clone()
               for n, b in module.named_buffers()}
    result = StepResult(loss=loss.detach().clone(), grads=grads,
                        outputs=_detach_outputs(out), buffers=buffers,
                        no_grad=tuple(no_grad))
    module.zero_grad(set_to_none=True)
    return result


def fresh(case) -> tuple[nn.Module, tuple, Callable[[Any], torch.Tensor]]:
    """A fresh, independent ``(module, inputs, loss_fn)`` from a zoo case.

    ``make()`` is seeded, so calling it twice gives identical weights and
    inputs; the module is additionally deep-copied so that nothing (e.g. a
    cached submodule) is shared between copies."""
    module, inputs, loss_fn = case.make()
    return copy.deepcopy(module), inputs, loss_fn


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("nan")
    if not (a.is_floating_point() or a.is_complex()):
        a, b = a.double(), b.double()
    d = (a.double() - b.double()).abs()
    # NaN in the same place is not a difference for reporting purposes.
    d = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(d), d)
    return float(d.max()) if d.numel() else 0.0


def _describe(kind: str, name: str, a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"{kind} {name!r}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"{kind} {name!r}: dtype {a.dtype} != {b.dtype}"
    n_diff = int((a != b).sum()) if a.numel() else 0
    return (f"{kind} {name!r} differs: max abs diff "
            f"{_max_abs_diff(a, b):.3e}, {n_diff}/{a.numel()} elements differ")


def _check_keys(kind: str, a: dict, b: dict) -> None:
    ka, kb = set(a), set(b)
    if ka != kb:
        raise AssertionError(
            f"different sets of {kind}: only in first: {sorted(ka - kb)}, "
            f"only in second: {sorted(kb - ka)}")


def _flat_output_tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    try:
        leaves, _ = tree_flatten(out)
    except Exception:  # pragma: no cover
        return []
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def _compare(a: StepResult, b: StepResult,
             equal: Callable[[torch.Tensor, torch.Tensor], bool], *,
             check_buffers: bool, check_outputs: bool) -> None:
    if not equal(a.loss, b.loss):
        raise AssertionError(_describe("loss", "loss", a.loss, b.loss)
                             + f" ({a.loss.item()!r} vs {b.loss.item()!r})")
    _check_keys("parameters with a gradient", a.grads, b.grads)
    for name in a.grads:  # named_parameters() order: first mismatch first
        if not equal(a.grads[name], b.grads[name]):
            raise AssertionError(
                "first mismatching gradient: "
                + _describe("grad of", name, a.grads[name], b.grads[name]))
    if check_buffers:
        _check_keys("buffers", a.buffers, b.buffers)
        for name in a.buffers:
            if not equal(a.buffers[name], b.buffers[name]):
                raise AssertionError(
                    "first mismatching buffer: "
                    + _describe("buffer", name, a.buffers[name],
                                b.buffers[name]))
    if check_outputs:
        oa, ob = _flat_output_tensors(a.outputs), _flat_output_tensors(b.outputs)
        if len(oa) != len(ob):
            raise AssertionError(
                f"different number of output tensors: {len(oa)} vs {len(ob)}")
        for i, (x, y) in enumerate(zip(oa, ob)):
            if not equal(x, y):
                raise AssertionError(_describe("output", f"#{i}", x, y))


def _bitwise(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if torch.equal(x, y):
        return True
    # torch.equal treats NaN != NaN; same NaN positions count as equal.
    if x.is_floating_point():
        nan = torch.isnan(x)
        return bool(torch.equal(nan, torch.isnan(y))
                    and torch.equal(x[~nan], y[~nan]))
    return False


def assert_bitwise_equal(a: StepResult, b: StepResult, *,
                         check_buffers: bool = True,
                         check_outputs: bool = True) -> None:
    """Loss, every gradient (and buffers/outputs unless disabled) must be
    bitwise equal, and the same set of parameters must have got a grad."""
    _compare(a, b, _bitwise, check_buffers=check_buffers,
             check_outputs=check_outputs)


def assert_close(a: StepResult, b: StepResult, rtol: float = 1e-5,
                 atol: float = 1e-6, *, check_buffers: bool = True,
                 check_outputs: bool = True) -> None:
    """Like :func:`assert_bitwise_equal` but with ``torch.allclose``."""
    def close(x: torch.Tensor, y: torch.Tensor) -> bool:
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not (x.is_floating_point() or x.is_complex()):
            return torch.equal(x, y)
        return torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
    _compare(a, b, close, check_buffers=check_buffers,
             check_outputs=check_outputs)


def torch_saved(monkeypatch, run: Callable[[], Any]) -> set[str]:
    """The values torch's own min-cut partitioner saves while ``run()``
    compiles, graph inputs (``primals``) aside: the two captures number
    lifted parameters differently."""
    from torch._functorch import partitioners

    chosen: list[str] = []
    solve = partitioners.solve_min_cut

    def spy(*args, **kwargs):
        saved, banned = solve(*args, **kwargs)
        chosen.extend(n.name for n in saved)
        return saved, banned

    monkeypatch.setattr(partitioners, "solve_min_cut", spy)
    run()
    monkeypatch.setattr(partitioners, "solve_min_cut", solve)
    return {n for n in chosen if not n.startswith("primals")}


class DeviceCounters:
    """torch.cuda's two counters for steps run on the CPU in tests, standing
    in for a device's (fxckpt/memory/measured.py reads them): at the end of
    each step the process's peak rises to what ``step_bytes()`` gives, if
    higher. ``resets`` stands for a user resetting the peak counter before
    each step, so that each step can be read; without it the counter keeps
    the process's peak. ``reads`` counts the steps read."""

    def __init__(self, step_bytes: Callable[[], int], resets: bool = False) -> None:
        self.step_bytes, self.resets = step_bytes, resets
        self.process_peak = self.reads = 0
        self._starting = False

    def memory_allocated(self, device) -> int:     # read as a step starts
        if self.resets:
            self.process_peak = 0
        self._starting = True
        return 0

    def max_memory_allocated(self, device) -> int:
        if self._starting:                          # the peak before the step
            self._starting = False
            return self.process_peak
        self.reads += 1                             # the step's end
        self.process_peak = max(self.process_peak, self.step_bytes())
        return self.process_peak


def read_as_on_a_device(monkeypatch, counters: DeviceCounters) -> None:
    """fxckpt's backend reads steps' peaks from ``counters``, as if its
    graphs' inputs were on a CUDA device."""
    import fxckpt.memory.measured as measured

    # The class itself, not a stand-in an earlier call left patched in.
    watch = getattr(measured.StepPeakWatch, "standing_in_for", measured.StepPeakWatch)

    def stand_in(device):
        return watch(device, reader=counters)
    stand_in.standing_in_for = watch
    monkeypatch.setattr(measured, "cuda_device", lambda inputs: torch.device("cuda", 0))
    monkeypatch.setattr(measured, "StepPeakWatch", stand_in)

"""``fxckpt.checkpoint``: hook-based activation checkpointing in eager mode.

For code that runs outside a compiled graph (graph breaks, eager models).

Forward: the function runs normally, except that
- every tensor autograd saves for backward is replaced by a small holder
  (saved-tensor hooks), so the activations inside are freed;
- a dispatch mode (``Recorder``) logs each op and asks the policy about it;
  the outputs of ops the policy saves are kept.

Backward: the first time a holder is unpacked in a backward, the function runs
again from its saved inputs under the forward's RNG, autocast and device
state (``Replayer`` serves the saved ops' outputs instead of running them).
The pack hook of that recomputation fills the holders in order and stops the
function as soon as the last one is filled. Each backward (graph task)
recomputes once, so ``retain_graph=True`` and a second backward work.

Nesting follows ``torch.utils.checkpoint``: a checkpoint's inputs are saved
through the saved-tensor hooks active around it, so an inner checkpoint's
inputs are recomputed by the outer one.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import torch
from torch._C._autograd import SavedTensor, _make_saved_tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from fxckpt.eager.modes import OpLog, Recorder, RecomputeMismatchError, Replayer
from fxckpt.eager.tensors import TensorMeta, describe_meta
from fxckpt.eager.state import ModuleScope, RecomputeState
from fxckpt.errors import FxckptError
from fxckpt.policies.resolve import resolve_policy

__all__ = ["checkpoint", "RecomputeMismatchError"]

_DETERMINISM_CHECKS = ("default", "none")


# Under torch.compile, Dynamo does not trace this function (it cannot trace
# saved-tensor hooks and dispatch modes): the call is a graph break and runs
# eagerly, as does ``fn`` (torch.compile'd code that ``fn`` calls still runs
# compiled).
@torch._dynamo.disable
def checkpoint(fn: Callable, *args, policy=None, preserve_rng_state: bool = True,
               determinism_check: str = "default", **kwargs):
    """Run ``fn(*args, **kwargs)`` keeping only what ``policy`` saves.

    ``policy``: anything ``fxckpt.policies.resolve_policy`` accepts (for
    example ``save_matmuls()``); None recomputes every op in backward, like
    ``torch.utils.checkpoint.checkpoint``. The policy is asked once per op of
    the forward, with real tensors as arguments; the ops it saves (MUST_ or
    PREFER_SAVE; offloading is not done here, those outputs stay in place) are
    not run again. Ops that write in place or return views always run again.
    ``preserve_rng_state``: replay random ops (dropout) bit for bit.
    ``determinism_check``: "default" raises ``RecomputeMismatchError`` when
    the recomputation runs other ops, or gives other shapes or dtypes, than
    the forward; "none" skips the check.
    """
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check must be one of {_DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}")
    factory = resolve_policy(policy)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)  # nothing is saved for backward

    flat, spec = tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    state = RecomputeState.capture(tensors, preserve_rng_state=preserve_rng_state)
    frame = _Frame(fn, _SavedInputs(flat, spec), state,
                   check=determinism_check == "default")
    decide = factory.for_graph() if factory is not None else None
    scope = (ModuleScope(ModuleScope.root_of(fn), sys._getframe())
             if decide is not None else None)
    with _forward_hooks(frame), Recorder(frame.log, decide, scope=scope, rng=state.rng):
        out = fn(*args, **kwargs)
    state.check_after_forward()
    return out


class _SavedInputs:
    """The function's arguments. Tensors are saved through the saved-tensor
    hooks active around the call, so that an enclosing checkpoint manages
    them (and recomputes them) like any other saved tensor."""

    def __init__(self, flat: list, spec) -> None:
        self.flat = [_make_saved_tensor(x, is_output=False)
                     if isinstance(x, torch.Tensor) else x for x in flat]
        self.spec = spec

    def unpack(self) -> tuple[tuple, dict]:
        flat = [x.unpack() if isinstance(x, SavedTensor) else x for x in self.flat]
        return tree_unflatten(flat, self.spec)


class _Holder:
    """Stands in for one tensor autograd saved during the forward."""

    __slots__ = ("index", "__weakref__")

    def __init__(self, index: int) -> None:
        self.index = index


class _StopRecomputation(Exception):
    """Every tensor the backward needs has been recomputed: stop the function."""


class _Frame:
    """One call of ``checkpoint``: what its forward saved and how to redo it."""

    def __init__(self, fn: Callable, inputs: _SavedInputs, state: RecomputeState,
                 *, check: bool) -> None:
        self.fn = fn
        self.inputs = inputs
        self.state = state
        self.check = check
        self.log = OpLog()
        # Weak: a holder dies with the graph node that saved it; a dead holder
        # needs no recomputed tensor.
        self.holders: list[weakref.ref] = []
        self.saved_metas: list[TensorMeta] = []
        # Per backward (graph task or GraphExecGroup): recomputed tensors by
        # holder index, each dropped as it is unpacked.
        self.recomputed: dict[Any, dict[int, torch.Tensor]] = {}

    def pack(self, tensor: torch.Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder))
        self.saved_metas.append(_meta(tensor))
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        backward = _current_backward()
        if backward is None:  # unpacked outside any backward: nothing to share
            return self.recompute()[holder.index]
        tensors = self.recomputed.get(backward)
        if tensors is None:
            tensors = self.recomputed[backward] = self.recompute()
            if isinstance(backward, int):
                # Drop what this backward did not unpack once it ends.
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: self.recomputed.pop(backward, None))
        try:
            return tensors.pop(holder.index)
        except KeyError:
            raise FxckptError(
                "fxckpt.checkpoint: a saved tensor was unpacked twice in one "
                "backward. Access ctx.saved_tensors only once per backward; under "
                "torch.utils.checkpoint.GraphExecGroup, backward calls must not "
                "overlap.") from None

    def recompute(self) -> dict[int, torch.Tensor]:
        args, kwargs = self.inputs.unpack()
        refill = _Refill(self)
        try:
            with self.state.restored(), refill.hooks(), \
                    Replayer(self.log, check=self.check), torch.enable_grad():
                self.fn(*args, **kwargs)
        except _StopRecomputation:
            pass
        self._check_recomputed(refill)
        return refill.tensors

    def _check_recomputed(self, hooks: "_Refill") -> None:
        if hooks.count < len(self.holders):
            raise RecomputeMismatchError(
                f"fxckpt.checkpoint: the recomputation saved {hooks.count} tensors "
                f"for backward, the forward saved {len(self.holders)}; the "
                "function ran differently the second time. Make it deterministic, "
                "or check that it does not depend on state changed since the forward.")
        if not self.check:
            return
        for index, tensor in hooks.tensors.items():
            if _meta(tensor) != self.saved_metas[index]:
                raise RecomputeMismatchError(
                    f"fxckpt.checkpoint: tensor #{index} saved for backward was "
                    f"{describe_meta((self.saved_metas[index],))} in the forward and "
                    f"{describe_meta((_meta(tensor),))} in the recomputation.")


def _forward_hooks(frame: _Frame) -> torch.autograd.graph.saved_tensors_hooks:
    return torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack)


class _Refill:
    """Fills the forward's holders, in order, with the recomputed tensors.

    Not itself the hooks object: that one holds ``pack``, and a ``pack``
    pointing back at it would be a reference cycle keeping the frame (and
    its saved outputs) alive until the garbage collector runs."""

    def __init__(self, frame: _Frame) -> None:
        self.frame = frame
        self.count = 0
        self.tensors: dict[int, torch.Tensor] = {}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _identity)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        holders = self.frame.holders
        index = self.count
        if index >= len(holders):  # cannot happen: we stop at the last holder
            raise RecomputeMismatchError(
                "fxckpt.checkpoint: the recomputation saved more tensors for "
                "backward than the forward did.")
        self.count += 1
        tensor = tensor.detach() if tensor.requires_grad else tensor
        if holders[index]() is not None:
            self.tensors[index] = tensor
        if self.count == len(holders):
            raise _StopRecomputation
        return tensor


def _identity(x):
    return x


def _current_backward() -> Any:
    group = torch._C._get_graph_exec_group()
    if group is not None:
        return group
    task = torch._C._current_graph_task_id()
    return None if task == -1 else task


def _meta(t: torch.Tensor) -> TensorMeta:
    return tuple(t.shape), t.dtype, t.device

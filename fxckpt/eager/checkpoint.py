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

import contextlib
import functools
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.utils.checkpoint import noop_context_fn

from fxckpt.compat.autograd import (TorchDispatchMode, current_backward,
                                    queue_at_backward_end, saved_tensor, unpacked)
from fxckpt.compat.ops import pytree
from fxckpt.eager.modes import OpLog, Recorder, RecomputeMismatchError, Replayer
from fxckpt.eager.tensors import TensorMeta, describe_meta
from fxckpt.eager.state import ModuleScope, RecomputeState
from fxckpt.errors import FxckptError
from fxckpt.policies.resolve import resolve_policy
from fxckpt.policies.torch_regions import contexts_for

__all__ = ["checkpoint", "checkpoint_sequential", "RecomputeMismatchError"]

_DETERMINISM_CHECKS = ("default", "none")


def checkpoint(function: Callable, *args, use_reentrant: Optional[bool] = None,
               context_fn: Callable[[], tuple] = noop_context_fn,
               determinism_check: str = "default", debug: bool = False,
               early_stop: Optional[bool] = None, preserve_rng_state: bool = True,
               policy=None, **kwargs):
    """Run ``function(*args, **kwargs)`` keeping only what ``policy`` saves.

    The arguments are those of ``torch.utils.checkpoint.checkpoint`` with
    ``use_reentrant=False``; only keyword arguments not listed here go to
    ``function``. The policy is asked once per op of the forward, with real
    tensors as arguments; the ops it saves (MUST_ or PREFER_SAVE; offloading
    is not done here, those outputs stay in place) are not run again. Ops
    that write in place or return views always run again.

    Under ``torch.compile`` (``fullgraph=True`` included) the call is traced
    as ``torch.utils.checkpoint.checkpoint`` is, into a region of the
    compiled graph whose selective-checkpoint contexts ask ``policy``
    (fxckpt/policies/torch_regions.py): torch's compiler, or fxckpt's
    backend, recomputes it in the compiled backward, and ``early_stop`` and
    the per-op determinism check do not apply there.

    Args:
        function: what to run; ``*args`` and the keyword arguments not
            listed here are its arguments.
        use_reentrant: None or False (there is no reentrant variant: call
            ``torch.utils.checkpoint.checkpoint`` for it).
        context_fn: returns (forward context, recomputation context),
            entered around the forward and each recomputation, as in torch.
            The contexts ``torch.utils.checkpoint.create_selective_checkpoint_contexts``
            makes act as its ``policy_fn`` passed as ``policy``.
        determinism_check: "default" checks that the recomputation runs the
            forward's ops with its shapes and dtypes; "none" skips the check.
        debug: a mismatch error lists the ops of the forward and of the
            recomputation (also on under
            ``torch.utils.checkpoint.set_checkpoint_debug_enabled``).
        early_stop: stop the recomputation once it has recomputed every
            saved tensor (default True;
            ``torch.utils.checkpoint.set_checkpoint_early_stop`` overrides
            it, as in torch). False runs the whole function again.
        preserve_rng_state: replay random ops (dropout) bit for bit.
        policy: anything ``fxckpt.policies.resolve_policy`` accepts (for
            example ``save_matmuls()``); None recomputes every op in
            backward, like ``torch.utils.checkpoint.checkpoint``.

    Returns:
        What ``function`` returns.

    Raises:
        FxckptError: ``use_reentrant=True``.
        ValueError: an unknown ``determinism_check``.
        RecomputeMismatchError: under "default", the recomputation ran
            other ops, or gave other shapes or dtypes, than the forward.

    Example:
        >>> from fxckpt.policies import save_matmuls
        >>> y = fxckpt.checkpoint(block, x, policy=save_matmuls())
    """
    _check_arguments(use_reentrant, determinism_check)
    if torch.compiler.is_compiling():
        return _traced(function, args, kwargs, context_fn, policy,
                       determinism_check=determinism_check, debug=debug,
                       preserve_rng_state=preserve_rng_state)
    return _eager(function, args, kwargs, context_fn, policy, determinism_check=determinism_check,
                  debug=debug, early_stop=early_stop, preserve_rng_state=preserve_rng_state)


def _traced(function: Callable, args: tuple, kwargs: dict, context_fn: Callable, policy, *,
            determinism_check: str, debug: bool, preserve_rng_state: bool):
    """The call as a torch.utils.checkpoint region, for Dynamo to trace (which
    takes a ``context_fn`` only as a function or a partial of constants: the
    policy is resolved when torch calls it)."""
    region = {}
    if policy is not None:
        if context_fn is not noop_context_fn:
            raise ValueError("fxckpt.checkpoint: both policy= and context_fn were given; "
                             "pass one of them.")
        region["context_fn"] = functools.partial(contexts_for, policy)
    elif context_fn is not noop_context_fn:
        region["context_fn"] = context_fn
    return torch.utils.checkpoint.checkpoint(
        function, *args, use_reentrant=False, determinism_check=determinism_check,
        debug=debug, preserve_rng_state=preserve_rng_state, **region, **kwargs)


# Dynamo never traces the eager implementation (saved-tensor hooks and
# dispatch modes): ``checkpoint`` hands compiled callers to ``_traced``.
@torch.compiler.disable
def _eager(function: Callable, args: tuple, kwargs: dict, context_fn: Callable, policy, *,
           determinism_check: str, debug: bool, early_stop: Optional[bool],
           preserve_rng_state: bool):
    policy, forward_context, recompute_context = _contexts(context_fn, policy)
    factory = _checkpoint_policy(function, policy)
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)  # nothing is saved for backward

    flat, spec = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    state = RecomputeState.capture(tensors, preserve_rng_state=preserve_rng_state)
    options = _Options(check=determinism_check == "default",
                       early_stop=_early_stop(early_stop), debug=_debug(debug),
                       recompute_context=recompute_context)
    frame = _Frame(function, _SavedInputs(flat, spec), state, options)
    decide = factory.for_graph() if factory is not None else None
    scope = (ModuleScope(ModuleScope.root_of(function), sys._getframe())
             if decide is not None else None)
    frame.recorder = Recorder(frame.log, decide, scope=scope, rng=state.rng)
    with _forward_hooks(frame), forward_context, frame.recorder:
        out = function(*args, **kwargs)
    frame.recorder = None
    state.check_after_forward()
    return out


def _checkpoint_policy(function: Callable, policy):
    """``resolve_policy(policy)``; a TypeError naming the keyword's two
    readers where the value is not a policy: torch.utils.checkpoint hands a
    ``policy=`` keyword on to the function, fxckpt.checkpoint keeps it."""
    try:
        return resolve_policy(policy)
    except (TypeError, ValueError) as error:
        name = getattr(function, "__qualname__", None) or type(function).__name__
        raise TypeError(
            f"fxckpt.checkpoint(..., policy={policy!r}): fxckpt.checkpoint takes the "
            f"keyword policy= for itself (what to save; see fxckpt.policies), and this "
            f"value is not a policy ({error}). If it is meant for {name}, pass it "
            f"bound: fxckpt.checkpoint(functools.partial({name}, policy=...), *args)"
        ) from error


def checkpoint_sequential(functions, segments: int, input, use_reentrant: Optional[bool] = None,
                          **kwargs):
    """``torch.utils.checkpoint.checkpoint_sequential`` with ``fxckpt.checkpoint``.

    Args:
        functions: an ``nn.Sequential`` or a list of modules or functions,
            each taking and returning one value.
        segments: how many chunks to run them in; every chunk but the last
            is checkpointed.
        input: the first function's input.
        use_reentrant: None or False, as for ``checkpoint``.
        **kwargs: go to each ``checkpoint`` (``policy``,
            ``preserve_rng_state``, ``early_stop``, ...).

    Returns:
        The last function's output.

    Raises:
        FxckptError: ``use_reentrant=True``.
        ValueError: ``segments`` outside 1 to the number of functions.

    Example:
        >>> y = fxckpt.checkpoint_sequential(model.layers, 2, x)
    """
    _check_arguments(use_reentrant, kwargs.get("determinism_check", "default"))
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    if not 1 <= segments <= max(len(functions), 1):
        raise ValueError(f"checkpoint_sequential: segments must be between 1 and the "
                         f"number of functions ({len(functions)}), got {segments}")
    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(_run_segment(functions[start:end + 1]), input,
                           use_reentrant=use_reentrant, **kwargs)
    return _run_segment(functions[end + 1:])(input)


def _run_segment(functions: list) -> Callable:
    def run(x):
        for f in functions:
            x = f(x)
        return x
    return run


def _check_arguments(use_reentrant: Optional[bool], determinism_check: str) -> None:
    if use_reentrant:
        raise FxckptError(
            "fxckpt.checkpoint has no reentrant variant (use_reentrant=True). Pass "
            "use_reentrant=False or leave it out; for the reentrant behaviour call "
            "torch.utils.checkpoint.checkpoint instead.")
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check must be one of {_DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}")


def _contexts(context_fn: Callable, policy) -> tuple[Any, Any, Any]:
    """(policy, forward context, recomputation context) for ``context_fn``.

    torch's selective checkpointing contexts are dispatch modes carrying the
    user's ``policy_fn``; their policy is followed by fxckpt's own modes
    instead of entering them (two caches of saved ops would fight)."""
    if context_fn is noop_context_fn:
        return policy, contextlib.nullcontext(), contextlib.nullcontext()
    forward_context, recompute_context = context_fn()
    policy_fn = getattr(forward_context, "policy_fn", None)
    if not (isinstance(forward_context, TorchDispatchMode) and callable(policy_fn)):
        return policy, forward_context, recompute_context
    if policy is not None:
        raise ValueError(
            "fxckpt.checkpoint: both policy= and a context_fn from "
            "torch.utils.checkpoint.create_selective_checkpoint_contexts were given; "
            "pass one of them.")
    return policy_fn, contextlib.nullcontext(), contextlib.nullcontext()


def _early_stop(early_stop: Optional[bool]) -> bool:
    # torch's set_checkpoint_early_stop overrides the argument, as in torch.
    override = getattr(torch.utils.checkpoint, "_enable_checkpoint_early_stop", None)
    if override is not None:
        return bool(override)
    return True if early_stop is None else bool(early_stop)


def _debug(debug: bool) -> bool:
    override = getattr(torch.utils.checkpoint, "_checkpoint_debug_enabled", None)
    return bool(override) if override is not None else bool(debug)


@dataclass(frozen=True)
class _Options:
    check: bool             # determinism_check="default"
    early_stop: bool
    debug: bool
    recompute_context: Any  # entered around each recomputation


class _SavedInputs:
    """The function's arguments. Tensors are saved through the saved-tensor
    hooks active around the call, so that an enclosing checkpoint manages
    them (and recomputes them) like any other saved tensor."""

    def __init__(self, flat: list, spec) -> None:
        self.flat = [saved_tensor(x) if isinstance(x, torch.Tensor) else x for x in flat]
        self.spec = spec

    def unpack(self) -> tuple[tuple, dict]:
        return pytree.tree_unflatten([unpacked(x) for x in self.flat], self.spec)


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
                 options: _Options) -> None:
        self.fn = fn
        self.inputs = inputs
        self.state = state
        self.options = options
        self.log = OpLog()
        # Set while the forward runs: a recomputation then (the function calls
        # torch.autograd.grad) must not be logged as ops of the forward.
        self.recorder: Optional[Recorder] = None
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
        backward = current_backward()
        if backward is None:  # unpacked outside any backward: nothing to share
            return self.recompute()[holder.index]
        tensors = self.recomputed.get(backward)
        if tensors is None:
            tensors = self.recomputed[backward] = self.recompute()
            self.log.let_go()
            if isinstance(backward, int):
                # Drop what this backward did not unpack once it ends. Held
                # weakly: the frame (its saved outputs and inputs) goes as
                # soon as backward is done with its nodes, not at the end of
                # the whole backward.
                frame = weakref.ref(self)
                queue_at_backward_end(lambda: _drop_recomputed(frame(), backward))
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
        options = self.options
        replayer = Replayer(self.log, check=options.check, debug=options.debug,
                            forward_done=self.recorder is None)
        refill = _Refill(self, replayer)
        try:
            with self._recorder_paused(), self.state.restored(), refill.hooks(), \
                    options.recompute_context, replayer, torch.enable_grad():
                self.fn(*args, **kwargs)
        except _StopRecomputation:
            pass
        except RecomputeMismatchError as error:
            if not options.debug:
                raise
            raise RecomputeMismatchError(f"{error}\n{replayer.trace()}") from error
        self._check_recomputed(refill)
        return refill.tensors

    @contextlib.contextmanager
    def _recorder_paused(self):
        recorder = self.recorder
        if recorder is None:
            yield
            return
        recorder.paused = True
        try:
            yield
        finally:
            recorder.paused = False

    def _check_recomputed(self, hooks: "_Refill") -> None:
        if hooks.count < len(self.holders):
            trace = f"\n{hooks.replayer.trace()}" if self.options.debug else ""
            raise RecomputeMismatchError(
                f"fxckpt.checkpoint: the recomputation saved {hooks.count} tensors "
                f"for backward, the forward saved {len(self.holders)}; the "
                "function ran differently the second time. Make it deterministic, "
                "or check that it does not depend on state changed since the forward."
                + trace)
        if not self.options.check:
            return
        for index, tensor in hooks.tensors.items():
            if _meta(tensor) != self.saved_metas[index]:
                raise RecomputeMismatchError(
                    f"fxckpt.checkpoint: tensor #{index} saved for backward was "
                    f"{describe_meta((self.saved_metas[index],))} in the forward and "
                    f"{describe_meta((_meta(tensor),))} in the recomputation.")


def _drop_recomputed(frame: "_Frame | None", backward: Any) -> None:
    if frame is not None:
        frame.recomputed.pop(backward, None)


def _forward_hooks(frame: _Frame) -> torch.autograd.graph.saved_tensors_hooks:
    return torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack)


class _Refill:
    """Fills the forward's holders, in order, with the recomputed tensors.

    Not itself the hooks object: that one holds ``pack``, and a ``pack``
    pointing back at it would be a reference cycle keeping the frame (and
    its saved outputs) alive until the garbage collector runs."""

    def __init__(self, frame: _Frame, replayer: Replayer) -> None:
        self.frame = frame
        self.replayer = replayer
        self.count = 0
        self.tensors: dict[int, torch.Tensor] = {}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _identity)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        holders = self.frame.holders
        index = self.count
        tensor = tensor.detach() if tensor.requires_grad else tensor
        if index >= len(holders):
            if self.frame.recorder is not None:
                # The forward is still running (it called torch.autograd.grad):
                # it has not saved these yet.
                return tensor
            raise self._more_saved()
        self.count += 1
        if holders[index]() is not None:
            self.tensors[index] = tensor
        if self.count == len(holders) and self.frame.options.early_stop:
            self.replayer.stopped = True
            raise _StopRecomputation
        return tensor

    def _more_saved(self) -> RecomputeMismatchError:
        return RecomputeMismatchError(
            f"fxckpt.checkpoint: the recomputation saved more tensors for backward "
            f"than the forward did ({len(self.frame.holders)}); the function ran "
            "differently the second time. Make it deterministic, or check that it "
            "does not depend on state changed since the forward.")


def _identity(x):
    return x


def _meta(t: torch.Tensor) -> TensorMeta:
    return tuple(t.shape), t.dtype, t.device

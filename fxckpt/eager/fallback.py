"""Graph breaks -> eager fallback regions.

The backend plans the graphs Dynamo hands it. Code Dynamo cannot trace runs
eagerly between those graphs, and what that code saves for backward is saved
in full. ``fxckpt.compile`` therefore looks, before the first step, for the
submodules whose forward Dynamo breaks, and runs each of them eagerly under
``fxckpt.checkpoint`` with the same policy, or less of it where the budget
requires (fxckpt/entry/compile.py):

- ``find_breaks``: one forward under Dynamo with a backend that only keeps
  Dynamo's own reasons for ending each graph (reason and user stack). The
  forward's random numbers and buffers are put back afterwards.
- ``attribute``: user stack -> the innermost module whose forward holds the
  break. A break in the root's forward or in a module's hooks is left alone:
  the pieces around it are compiled graphs, and hooks (FSDP2's are
  Dynamo-disabled) must not run again in a recomputation.
- ``Region``: one module whose ``forward`` (not ``__call__``: its hooks stay
  outside) is replaced by a Dynamo-disabled call of ``fxckpt.checkpoint``
  with the region's policy (fxckpt/eager/region_policy.py). On the first
  step with grad (and the step after its policy changed) what it holds is
  measured -- as it ran, at its floor, with the user's policy -- and
  entered in the ``Ledger``, which the backend subtracts from a byte budget
  before planning the graphs that run after it.
"""

from __future__ import annotations

import contextlib
import re
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import noop_context_fn

from fxckpt.compat.modules import own_buffers
from fxckpt.compat.autograd import TorchDispatchMode, top_saved_tensors_hooks
from fxckpt.compat.dynamo import graph_break_reasons
from fxckpt.compat.ops import pytree
from fxckpt.eager.checkpoint import checkpoint
from fxckpt.eager.region_policy import RegionBytes, RegionDecider, RegionPolicy, region_bytes
from fxckpt.memory.values import storage_key

# Dynamo compiles the code after a break as a new function named after the
# one it resumes ("torch_dynamo_resume_in_forward_at_31").
_RESUME = re.compile(r"torch_dynamo_resume_in_(.+)_at_\d+")
_MODULE_MACHINERY = "torch/nn/modules/module.py"


@dataclass(frozen=True)
class BreakSite:
    """One place where Dynamo ended a graph, and what fxckpt does about it.

    ``module`` is the qualified name of the submodule whose forward holds
    the break ("" when none does); ``note`` says why a break is left to the
    compiled graphs instead of becoming a fallback region."""

    reason: str
    where: str
    module: str = ""
    note: str = ""

    def __str__(self) -> str:
        return f"{self.reason}  [{self.where}]" + (f": {self.note}" if self.note else "")


# --- finding the breaks ------------------------------------------------------

def find_breaks(model: nn.Module, args: tuple, kwargs: dict) -> list[Any]:
    """Run ``model(*args, **kwargs)`` once under Dynamo and return the
    reasons (``GraphCompileReason``: reason and user stack) it gave for
    every graph break, in order.

    It runs without grad, so that this forward saves no activations: it is
    part of the first step, whose peak the budget bounds (an eager forward
    with grad peaked 1.6x a U-Net's floor there). Dynamo breaks a graph at
    the same code either way, unless the model's own code branches on grad mode."""
    kept: list[Any] = []

    def record(gm, example_inputs):
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.graph_break:
            kept.append(reason)
        return gm.forward

    # Dynamo also logs the breaks whose graph was empty (nothing to hand to
    # a backend); its list is the complete one where it exists.
    logged = graph_break_reasons()
    start = len(logged) if logged is not None else 0
    with _side_effects_undone(model, args, kwargs), torch.no_grad():
        torch.compile(model, backend=record)(*args, **kwargs)
    return list(logged[start:]) if logged is not None else kept


@contextlib.contextmanager
def _side_effects_undone(model: nn.Module, args: tuple, kwargs: dict) -> Iterator[None]:
    """Random number generators and buffers (BatchNorm statistics) as they
    were before. Python side effects (a print, a counter) happen once more."""
    tensors = [*model.parameters(), *model.buffers(),
               *(x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor))]
    cuda = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    buffers = [(owner, name, value, value.detach().clone())
               for owner in model.modules()
               for name, value in own_buffers(owner).items() if value is not None]
    with torch.random.fork_rng(devices=cuda):
        yield
    with torch.no_grad():
        for owner, name, value, before in buffers:
            own_buffers(owner)[name] = value
            value.copy_(before)


def attribute(reasons: list[Any], model: nn.Module) -> list[BreakSite]:
    """Each break, at the innermost module forward on its user stack. A break
    that leaves several frames (the caller's and the callee's graphs) is
    reported by Dynamo once per frame; it is kept once.

    Walking the stack from the break outwards, a frame of the module call
    machinery (``_call_impl``, running hooks) met before any forward means
    the break is in a hook: it is left alone, so that no checkpoint runs
    the hook again."""
    forwards = _forward_codes(model)
    sites: dict[tuple[str, str, str], BreakSite] = {}
    for reason in reasons:
        stack = list(reason.user_stack)
        if not stack:
            continue
        text = reason.reason.strip().splitlines()[0]
        # The user's line nearest to the break (in a hook, the module call).
        where = describe_frame(next((f for f in reversed(stack) if not _in_machinery(f)), stack[-1]))
        in_hooks = False
        owners = [""]
        for frame in reversed(stack):
            key = _code_key(frame)
            if key in forwards:
                owners = forwards[key]
                break
            in_hooks = in_hooks or _in_machinery(frame)
        for owner in owners:
            if in_hooks:
                note = ("in the hooks of a module call; hooks stay outside checkpoints "
                        "and the module's forward compiles")
            elif owner == "":
                note = "not inside a submodule's forward; the pieces around it are compiled"
            else:
                note = ""
            sites.setdefault((text, where, owner), BreakSite(text, where, owner, note))
    return list(sites.values())


def _forward_codes(model: nn.Module) -> dict[tuple, list[str]]:
    """(file, function name, line) of every line of every function a
    module's forward runs through (decorators and wrappers included) -> the
    names of the modules whose forward it is."""
    owners: dict[types.CodeType, list[str]] = {}
    for name, module in model.named_modules():
        fn = getattr(module.forward, "__func__", module.forward)
        seen: set[int] = set()
        while fn is not None and id(fn) not in seen:
            seen.add(id(fn))
            code = getattr(fn, "__code__", None)
            if code is not None:
                owners.setdefault(code, []).append(name)
            fn = getattr(fn, "__wrapped__", None)
    keys: dict[tuple, list[str]] = {}
    for code, names in owners.items():
        for _, _, line in code.co_lines():
            if line is not None:
                keys.setdefault((code.co_filename, code.co_name, line), []).extend(names)
    return {key: sorted(set(names)) for key, names in keys.items()}


def _code_key(frame: traceback.FrameSummary) -> tuple:
    resumed = _RESUME.fullmatch(frame.name)
    return (frame.filename, resumed.group(1) if resumed else frame.name, frame.lineno)


def _in_machinery(frame: traceback.FrameSummary) -> bool:
    return frame.filename.replace("\\", "/").endswith(_MODULE_MACHINERY)


def describe_frame(frame: traceback.FrameSummary, *, source: bool = True) -> str:
    """``file.py:12 in forward``, and the line itself when ``source``."""
    where = f"{frame.filename.replace(chr(92), '/').split('/')[-1]}:{frame.lineno} in {frame.name}"
    return where + (f": {frame.line.strip()}" if source and frame.line else "")


def outermost(names: list[str]) -> list[str]:
    """Drop every name inside another one: an enclosing region already runs it."""
    names = sorted(set(names))
    return [n for n in names
            if not any(n.startswith(other + ".") for other in names if other != n)]


# --- the regions -------------------------------------------------------------

@dataclass
class Ledger:
    """What the fallback regions hold for backward, measured during the
    forward of a step with grad, in the order they ran: the first such step,
    and again the step after a region's policy changed. ``entries`` is the
    last complete measurement (the one under way until there is one), each
    with how many compiled graphs had run in the step before the call
    (``position``, given by the owner)."""

    position: Callable[[], int] = int      # int() is 0: no graphs to count
    entries: list[tuple[str, int, RegionBytes]] = field(default_factory=list)
    measuring: bool = False
    measured: bool = False
    _pending: list[tuple[str, int, RegionBytes]] = field(default_factory=list)

    def held_bytes(self) -> int:
        return sum(nbytes.held for _, _, nbytes in self._current())

    def bytes_of(self, region: str) -> RegionBytes | None:
        counted = [nbytes for name, _, nbytes in self._current() if name == region]
        return sum(counted[1:], counted[0]) if counted else None

    def position_of(self, region: str) -> int:
        """Graph runs in the step before the region's first call."""
        return next(at for name, at, _ in self._current() if name == region)

    def add(self, region: str, nbytes: RegionBytes) -> None:
        self._pending.append((region, self.position(), nbytes))

    def measure_again(self) -> None:
        """Measure on the next step with grad (a region's policy changed)."""
        self.measured = False

    def _current(self) -> list[tuple[str, int, RegionBytes]]:
        return self.entries if self.entries or not self.measuring else self._pending

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self.measuring = not self.measured and torch.is_grad_enabled()
        if self.measuring:
            self._pending = []  # an earlier try that failed half way
        try:
            yield
            if self.measuring:
                self.entries, self.measured = self._pending, True
        finally:
            self.measuring = False


class Region:
    """One submodule whose forward runs eagerly under ``fxckpt.checkpoint``.

    Installed as the module's ``forward`` (an instance attribute; the class
    is untouched), so the module's hooks run outside the checkpoint, and a
    deep copy of the model gets a region of its own. ``choice`` is the
    policy it runs with (fxckpt/eager/region_policy.py), ``why`` the reason."""

    def __init__(self, name: str, module: nn.Module, breaks: list[BreakSite], *,
                 choice: RegionPolicy, why: str, ledger: Ledger, live: nn.Module) -> None:
        self.name = name
        self.module_type = type(module).__name__
        self.breaks = breaks
        self.choice = choice
        self.why = why
        self.ledger = ledger
        self.live = live            # its parameters and buffers are not activations
        self.calls = 0
        self.enclosed_calls = 0
        self.wrapped = module.forward
        module.forward = self

    def choose(self, choice: RegionPolicy, why: str) -> None:
        self.choice, self.why = choice, why

    def parameters(self) -> list[torch.Tensor]:
        """The parameters of the module whose forward this is."""
        owner = getattr(self.wrapped, "__self__", None)
        return list(owner.parameters()) if isinstance(owner, nn.Module) else []

    # Disabled: Dynamo ends the caller's graph at this call and runs the
    # call, the module's hooks included, eagerly; nothing inside compiles.
    @torch.compiler.disable
    def __call__(self, *args, **kwargs):
        # Checkpointed on every call, also from the bare model: what a call
        # saves must not depend on when it runs.
        self.calls += 1
        if _checkpoint_around():
            # An enclosing checkpoint (the model's own torch.utils.checkpoint,
            # which Dynamo ran eagerly because of this break) already keeps
            # nothing of this call but what it decides; nesting would only
            # recompute the region twice.
            self.enclosed_calls += 1
            return self.wrapped(*args, **kwargs)
        decider = self.choice.decider()
        if not self.ledger.measuring:
            return self._checkpointed(args, kwargs, decider)
        with _HeldBytes(exclude=[*self.live.parameters(), *self.live.buffers()]) as held:
            out = self._checkpointed(args, kwargs, decider, context_fn=held.saved_inside)
        storages, not_held = held.count(inputs=(args, kwargs), outputs=out)
        self.ledger.add(self.name, region_bytes(
            storages, decider, not_held=not_held,
            activations=held.activation_bytes(inputs=(args, kwargs)),
            temporaries=held.temporary_bytes()))
        return out

    def _checkpointed(self, args: tuple, kwargs: dict, decider: RegionDecider,
                      context_fn=noop_context_fn):
        # The forward and its arguments go in as checkpoint's positional
        # arguments, so that a forward keyword named like one of checkpoint's
        # own (``policy``) cannot clash; bound to the module, so that module
        # paths in the policy's questions are relative to it.
        owner = getattr(self.wrapped, "__self__", None)
        call = (types.MethodType(_call_forward, owner) if isinstance(owner, nn.Module)
                else _call_plain)
        policy = decider if self.choice.user is not None else None
        return checkpoint(call, self.wrapped, args, kwargs, policy=policy,
                          context_fn=context_fn)


@contextlib.contextmanager
def _recorded_saves(record: dict[int, int]) -> Iterator[None]:
    """Saved-tensor hooks that note each saved tensor's storage and bytes in
    ``record`` and pass it on to the hooks under them (the checkpoint's)."""
    outer_pack, outer_unpack = top_saved_tensors_hooks()

    def pack(tensor: torch.Tensor):
        key = storage_key(tensor)
        if key is not None:
            record.setdefault(key, tensor.untyped_storage().nbytes())
        return outer_pack(tensor)

    with torch.autograd.graph.saved_tensors_hooks(pack, outer_unpack):
        yield


def _checkpoint_around() -> bool:
    """Whether the saved-tensor hooks on top are a checkpoint's (torch's or
    fxckpt's, in forward or in recomputation)."""
    hooks = top_saved_tensors_hooks()
    if hooks is None:
        return False
    module = getattr(hooks[0], "__module__", None) or ""
    return module in _CHECKPOINT_MODULES


# Where checkpoints' pack hooks are defined: torch's, and fxckpt.checkpoint's
# (its forward and recomputation hooks).
_CHECKPOINT_MODULES = frozenset({torch.utils.checkpoint.__name__, checkpoint.__module__})


def _call_forward(module: nn.Module, forward, args: tuple, kwargs: dict):
    return forward(*args, **kwargs)


def _call_plain(forward, args: tuple, kwargs: dict):
    return forward(*args, **kwargs)


class _HeldBytes(TorchDispatchMode):
    """What one region call holds for backward, each storage counted once:

    - the tensors autograd saves through the saved-tensor hooks around the
      call (``fxckpt.checkpoint`` saves its arguments there), passed on to
      those hooks unchanged, so an outer measurement still sees them;
    - the storages the call allocated that outlive it without being part of
      its output: the op outputs its policy saves (kept by the checkpoint
      itself, out of reach of saved-tensor hooks).

    And, through ``saved_inside`` (the checkpoint's ``context_fn``), what
    autograd saves inside the checkpoint: what a recomputation in backward
    re-creates at most (``activation_bytes``).

    Parameters and buffers (``exclude``) live anyway and are not counted."""

    def __init__(self, *, exclude: list[torch.Tensor]) -> None:
        super().__init__()
        self.excluded = {storage_key(t) for t in exclude}
        self.packed: dict[int, int] = {}
        self.inside: dict[int, int] = {}
        self.allocated: dict[int, tuple[StorageWeakRef, int, int]] = {}
        self.temporaries = 0
        self._hooks: Any = None

    def saved_inside(self) -> tuple[Any, Any]:
        """(forward context, recomputation context) for ``fxckpt.checkpoint``:
        the forward's saved tensors are recorded on their way to the
        checkpoint's own hooks."""
        return _recorded_saves(self.inside), contextlib.nullcontext()

    def activation_bytes(self, *, inputs: Any) -> int:
        """Bytes autograd saved inside the checkpoint, each storage once,
        less the call's inputs, parameters and buffers (never recomputed)."""
        given = {storage_key(t) for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)}
        return sum(n for key, n in self.inside.items()
                   if key not in given and key not in self.excluded)

    def __enter__(self):
        outer = top_saved_tensors_hooks()
        outer_pack, outer_unpack = outer if outer is not None else (None, None)

        def pack(tensor: torch.Tensor):
            storage = tensor.untyped_storage()
            if storage.nbytes():
                self.packed.setdefault(storage_key(tensor), storage.nbytes())
            return outer_pack(tensor) if outer_pack is not None else tensor

        def unpack(packed):
            return outer_unpack(packed) if outer_unpack is not None else packed

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._note_backward_bytes(args, kwargs, out)
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided:
                try:
                    storage = tensor.untyped_storage()
                except (RuntimeError, NotImplementedError):  # a wrapper subclass
                    continue
                ref = StorageWeakRef(storage)
                self.allocated[ref.cdata] = (ref, storage_key(tensor), storage.nbytes())
        return out

    def _note_backward_bytes(self, args, kwargs, out) -> None:
        """The op's backward holds the gradient of its output while it makes
        its inputs' (``temporary_bytes``): counted as its floating-point
        outputs and its largest floating-point input (parameters and
        buffers aside: their gradients are counted apart), each storage
        once."""
        made, read = self._floating(out), self._floating((args, kwargs))
        largest = max((n for key, n in read.items() if key not in made), default=0)
        self.temporaries = max(self.temporaries, sum(made.values()) + largest)

    def _floating(self, tree) -> dict[int, int]:
        """Storage -> bytes of the floating-point tensors in ``tree``, not
        parameters or buffers."""
        found = {}
        for tensor in pytree.tree_leaves(tree):
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() \
                    or tensor.layout != torch.strided:
                continue
            try:
                key, nbytes = storage_key(tensor), tensor.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):  # a wrapper subclass
                continue
            if key is not None and key not in self.excluded:
                found[key] = nbytes
        return found

    def temporary_bytes(self) -> int:
        """The most one op's backward adds to what the region saved while it
        runs, bounded by its forward's inputs and outputs (the largest over
        the call's ops): an attention softmax's backward holds the gradient
        of its output and makes its input's beside the probabilities saved.
        Tiny HF Wav2Vec2, whose whole forward is a fallback region (a
        data-dependent layer-drop branch), measured 7.6% over the floor
        named without it."""
        return self.temporaries

    def count(self, *, inputs: Any, outputs: Any) -> tuple[dict[int, int], set[int]]:
        """(storage -> bytes held for backward, the storages not counted:
        the call's inputs and outputs, parameters and buffers)."""
        passed = {storage_key(t) for t in pytree.tree_leaves((inputs, outputs))
                  if isinstance(t, torch.Tensor)}
        held = dict(self.packed)
        for ref, key, nbytes in self.allocated.values():
            if nbytes and not ref.expired() and key not in passed:
                held.setdefault(key, nbytes)
        return ({key: n for key, n in held.items() if key not in self.excluded},
                passed | self.excluded)

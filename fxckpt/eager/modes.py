"""The two dispatch modes behind ``fxckpt.checkpoint``.

``Recorder`` runs during the forward. It logs every op (what ran, the shapes
and dtypes it produced, the user's line), asks the policy about it, and keeps
the outputs of the ops the policy saves.

``Replayer`` runs during the recomputation in backward. At each op it checks
that the recomputation runs what the forward ran, and serves a saved op's
outputs instead of running the op again.

Saved outputs are looked up by (op, how many times that op ran before), as in
``torch.utils.checkpoint``'s selective checkpointing, so that with the check
off a recomputation that wanders still finds the right values where it can.

Three kinds of op always run again, whatever the policy says (``OpKind``):
- ops that write to an argument (``relu_``, ``bernoulli_``, ``out=``): the
  recomputation's own tensors must be written, not a stored copy;
- ops whose outputs alias an input (views): free to run, and a stored alias
  would point into the forward's storage instead of the recomputation's;
- higher-order operators, whose schema is unknown.

A write to state from outside the function (BatchNorm's running statistics,
``num_batches_tracked``) must happen once, in the forward. The recomputation
gives such ops a copy of that state to write to, so that the buffers after
backward are those of a step without checkpointing. Outside state is told
apart without tracking every allocation: a storage the recomputation writes
that is the very storage the forward's op wrote (still alive) was not made
by the function, which makes new tensors each time it runs.
"""

from __future__ import annotations

import itertools
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import SAC_IGNORED_OPS, CheckpointPolicy
from torch.utils.weak import WeakTensorKeyDictionary

from fxckpt.compat.autograd import TorchDispatchMode, version
from fxckpt.compat.ops import pytree
from fxckpt.eager.tensors import (TensorMeta, alias, copy, describe_meta, run_on_copies,
                                  tensor_leaves, tensor_metas, written_tensors)
from fxckpt.eager.state import ModuleScope, RngSnapshot, format_where, user_frame
from fxckpt.errors import FxckptError, warn_once
from fxckpt.memory.values import storage_key
from fxckpt.naming import names_of
from fxckpt.ops import OpKind, op_kind
from fxckpt.policies.api import Decider, OpCall, check_answer, finish

_SAVE = frozenset({CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE,
                   # Offloading is not implemented on the eager path: kept in place.
                   CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD})

_OFFLOAD = frozenset({CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD})


def _warn_offload_kept(func) -> None:
    warn_once(
            "offload in fxckpt.checkpoint",
            f"the policy asks to offload {func} to CPU memory, but fxckpt.checkpoint "
            "(the eager path, and graph-break fallback regions) does not offload: the "
            "value is saved where it is. Compile the region (fxckpt.backend) to offload.",
            stacklevel=4)


# Checkpointing itself adds detach calls (the recomputation's pack hook) and
# metadata queries; they are not ops of the user's function.
IGNORED_OPS = SAC_IGNORED_OPS


def is_ignored(func) -> bool:
    """Ops that are not the function's computation: neither logged, checked
    nor saved. Besides ``IGNORED_OPS``, the profiler's ops
    (``record_function`` ranges), which also run when a recomputation stopped
    early unwinds through a ``record_function`` block."""
    return func in IGNORED_OPS or getattr(func, "namespace", None) == "profiler"


class RecomputeMismatchError(FxckptError):
    """The recomputation of a checkpointed function did not do what its
    forward did (other ops, shapes or dtypes, or other tensors saved)."""


# ---------------------------------------------------------------------------
# What the forward leaves for the recomputation
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class OpRecord:
    index: int
    op: Any
    outputs: tuple[TensorMeta, ...]
    where: Optional[tuple[str, int]]
    decision: Optional[CheckpointPolicy]

    def describe(self) -> str:
        return describe_op(self.op, self.outputs, self.where)


@dataclass
class SavedOutputs:
    """The outputs of one saved op, as detached aliases of the forward's."""

    record: OpRecord
    value: Any                          # the op's output structure
    versions: list[int]                 # version counter of each tensor leaf
    rng_after: Optional[RngSnapshot]    # generators after a random op ran
    # Written in place later in the forward: the stored value is a copy, and
    # each recomputation gets its own copy to write to.
    serve_copies: bool = False

    # After ``let_go``: the value is held only through what a recomputation
    # was served (weakly), as torch's selective checkpoint holds it.
    served: Any = None

    def is_stale(self) -> bool:
        tensors = tensor_leaves(self.value)
        return any(version(t) != v for t, v in zip(tensors, self.versions))

    def available(self) -> bool:
        """Whether the value can be served: kept, or still alive where a
        recomputation was served it, and not written in place since."""
        if self.value is None:
            self.value = _revived(self.served)
            if self.value is None:
                return False
        return not self.is_stale()

    def serve(self) -> Any:
        make = copy if self.serve_copies else alias
        out = pytree.tree_map(lambda x: make(x) if isinstance(x, torch.Tensor) else x,
                              self.value)
        if not self.serve_copies:
            self.served = pytree.tree_map(
                lambda x: weakref.ref(x) if isinstance(x, torch.Tensor) else x, out)
        return out

    def let_go(self) -> None:
        """Drop the strong reference once a recomputation has been served: the
        backward then frees the value as it goes, and a later backward
        (retain_graph) runs the op again where it is gone. Copies served for
        writing are kept (what was served may have been written)."""
        if not self.serve_copies and self.served is not None:
            self.value = None

    def copy_written_leaves(self, storage: int) -> None:
        """Keep the values from before a write to ``storage``."""
        def protect(x):
            if isinstance(x, torch.Tensor) and storage_key(x) == storage:
                return copy(x)
            return x
        self.value = pytree.tree_map(protect, self.value)
        self.versions = [version(x) for x in tensor_leaves(self.value)]
        self.serve_copies = True


def _revived(served: Any) -> Any:
    """``served``'s weak references as tensors; None if one has died."""
    if served is None:
        return None
    if any(isinstance(w, weakref.ref) and w() is None for w in pytree.tree_leaves(served)):
        return None
    return pytree.tree_map(lambda x: x() if isinstance(x, weakref.ref) else x, served)


@dataclass
class OpLog:
    """Every op the forward ran, in order, and the outputs it saved."""

    records: list[OpRecord] = field(default_factory=list)
    saved: dict[tuple[Any, int], SavedOutputs] = field(default_factory=dict)
    # storage -> the saved outputs living in it, to copy them before a write.
    by_storage: dict[int, list[SavedOutputs]] = field(default_factory=lambda: defaultdict(list))
    # (op, n) -> the storages this op wrote in the forward (weakly).
    writes: dict[tuple[Any, int], list[StorageWeakRef]] = field(default_factory=dict)
    # (op, n) -> (generator, state before, state after) for random ops given
    # an explicit generator, which the global RNG replay does not cover.
    generators: dict[tuple[Any, int], tuple[torch.Generator, torch.Tensor, torch.Tensor]] = \
        field(default_factory=dict)

    def let_go(self) -> None:
        """Each saved output held only where a recomputation was served it."""
        for saved in self.saved.values():
            saved.let_go()

    def forward_done(self) -> None:
        """Drop what only the forward needed."""
        self.by_storage.clear()


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------


@dataclass
class _Pending:
    """An op that ran and waits for the policy's answer (see ``Recorder``)."""

    key: tuple[Any, int]
    func: Any
    kind: OpKind
    args: tuple
    kwargs: dict
    out: Any
    where: Optional[tuple[str, int]]
    module_path: str
    rng_after: Optional[RngSnapshot]


class Recorder(TorchDispatchMode):
    """Logs the forward's ops and keeps the outputs the policy saves.

    The policy is asked about an op when the next op starts (or the forward
    ends), not at once: a name given with ``fxckpt.name`` right after the op
    returned is then known and goes into ``OpCall.value_names``. The answers
    still come once per op and in forward order."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Lets torch.compile'd code inside the function compile and run (its
        # aten ops then come through this mode) instead of falling back to eager.
        return True

    def __init__(self, log: OpLog, decide: Optional[Decider], *,
                 scope: Optional[ModuleScope], rng: Optional[RngSnapshot]) -> None:
        super().__init__()
        self.log = log
        self.decide = decide
        self.scope = scope
        self.rng = rng
        self.calls: dict[Any, int] = defaultdict(int)
        self.pending: Optional[_Pending] = None
        # True while the function's checkpoint recomputes within the forward
        # (the function called torch.autograd.grad): those ops are not logged.
        self.paused = False
        # Tensor -> name of the op that produced it, for ``OpCall.inputs``.
        self.producers = WeakTensorKeyDictionary() if decide is not None else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused or is_ignored(func):
            return func(*args, **kwargs)
        if self.pending is not None:
            self.flush()
        kind = op_kind(func)
        n = self.calls[func]
        self.calls[func] = n + 1
        key = (func, n)
        if kind.writes:
            self._before_write(key, func, args, kwargs)
        where = user_frame()
        generator = kwargs.get("generator") if kind.random else None
        before = generator.get_state() if generator is not None else None
        out = func(*args, **kwargs)
        if generator is not None:
            self.log.generators[key] = (generator, before, generator.get_state())
        if self.decide is None:
            records = self.log.records
            records.append(OpRecord(len(records), func, tensor_metas(out), where, None))
            return out
        rng_after = (self.rng.again() if kind.random and kind.cacheable
                     and self.rng is not None else None)
        self.pending = _Pending(key, func, kind, args, kwargs, out, where,
                                self.scope.current() if self.scope else "", rng_after)
        return out

    def __exit__(self, *exc):
        # Off the mode stack first: the policy, asked about the last op here,
        # may run ops of its own, which are not the function's.
        super().__exit__(*exc)
        try:
            if exc[0] is None:
                self.flush()
                self._revise()
        finally:
            self.pending = None
            self.log.forward_done()

    def flush(self) -> None:
        """Ask about the pending op and act on the answer."""
        op, self.pending = self.pending, None
        if op is None:
            return
        index = len(self.log.records)
        record = OpRecord(index, op.func, tensor_metas(op.out), op.where, self._ask(index, op))
        self.log.records.append(record)
        if record.decision in _SAVE and op.kind.cacheable:
            if record.decision in _OFFLOAD:
                _warn_offload_kept(op.func)
            self._save(op.key, record, op.out, op.rng_after)
        if self.producers is not None:
            for t in tensor_leaves(op.out):
                self.producers[t] = str(index)

    def _ask(self, index: int, op: _Pending) -> Optional[CheckpointPolicy]:
        call = OpCall(name=str(index), op=op.func, args=tuple(op.args),
                      kwargs=dict(op.kwargs), module_path=op.module_path,
                      source=format_where(op.where),
                      value_names=tuple(n for t in tensor_leaves(op.out) for n in names_of(t)),
                      output=op.out,
                      inputs=self._producers_of(op.args, op.kwargs))
        return check_answer(self.decide(call),
                            what=f"op #{index} ({op.func}) [{call.source}]")

    def _producers_of(self, args, kwargs) -> tuple[str, ...]:
        names = (self.producers.get(t) for t in tensor_leaves(args))
        if kwargs:
            names = itertools.chain(names, (self.producers.get(t)
                                            for t in tensor_leaves(kwargs)))
        return tuple(n for n in names if n is not None)

    def _revise(self) -> None:
        """Apply the policy's revised answers (``policies.api.finish``) that
        drop a saved output; one that asks to save an op whose output is gone
        cannot be followed, and the first answer is safe."""
        if self.decide is None:
            return
        revised = finish(self.decide)
        if not revised:
            return
        keys = {saved.record.index: key for key, saved in self.log.saved.items()}
        for name, answer in revised.items():
            key = keys.get(int(name))
            if answer not in _SAVE and key is not None:
                del self.log.saved[key]

    def _save(self, key, record: OpRecord, out, rng_after: Optional[RngSnapshot]) -> None:
        value = pytree.tree_map(lambda x: alias(x) if isinstance(x, torch.Tensor) else x, out)
        tensors = tensor_leaves(value)
        saved = SavedOutputs(record, value, [version(t) for t in tensors], rng_after)
        self.log.saved[key] = saved
        for t in tensors:
            storage = storage_key(t)
            if storage is not None:
                self.log.by_storage[storage].append(saved)

    def _before_write(self, key, func, args, kwargs) -> None:
        written = []
        for t in written_tensors(func, args, kwargs):
            storage = storage_key(t)
            if storage is None:
                continue
            for saved in self.log.by_storage.pop(storage, ()):
                saved.copy_written_leaves(storage)
            written.append(StorageWeakRef(t.untyped_storage()))
        if written:
            self.log.writes[key] = written


# ---------------------------------------------------------------------------
# Recomputation
# ---------------------------------------------------------------------------


class Replayer(TorchDispatchMode):
    """``check``: raise on ops other than the forward's. ``debug``: keep the
    ops run, for ``trace``. ``forward_done``: False for a recomputation
    within the forward, whose log ends where the forward is now (ops past
    it are not checked). ``stopped``: set when the recomputation is stopped
    early; ops run while unwinding are not the function's."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, log: OpLog, *, check: bool, debug: bool = False,
                 forward_done: bool = True) -> None:
        super().__init__()
        self.log = log
        self.check = check
        self.forward_done = forward_done
        self.stopped = False
        # (op, outputs or None when not run or served, where) of each op.
        self.ran: Optional[list[tuple]] = [] if debug else None
        self.position = 0
        self.calls: dict[Any, int] = defaultdict(int)
        # Explicit generators this recomputation moved, and their states
        # before it: put back on exit, as the global generators are.
        self.generators: dict[torch.Generator, torch.Tensor] = {}

    def __exit__(self, *exc):
        for generator, state in self.generators.items():
            generator.set_state(state)
        return super().__exit__(*exc)

    def _replay_generator(self, key, ran: bool) -> None:
        """Set an explicit generator to its state before the op (which then
        runs) or after it (the op is served from the forward)."""
        generator, before, after = self.log.generators[key]
        self.generators.setdefault(generator, generator.get_state())
        generator.set_state(after if not ran else before)

    def trace(self) -> str:
        """The ops of the forward and of this recomputation, for ``debug``."""
        forward = "\n".join(f"  #{r.index} {r.describe()}" for r in self.log.records)
        ran = "\n".join(f"  #{i} {_describe_ran(*entry)}"
                        for i, entry in enumerate(self.ran or ()))
        return (f"Ops of the forward:\n{forward or '  (none)'}\n"
                f"Ops of the recomputation:\n{ran or '  (none)'}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.stopped or is_ignored(func):
            return func(*args, **kwargs)
        index = self.position
        self.position += 1
        records = self.log.records
        record = records[index] if index < len(records) else None
        if self.ran is not None:
            self.ran.append((func, None, user_frame()))
        checked = self.check and (self.forward_done or index < len(records))
        if checked and (record is None or record.op is not func):
            raise op_mismatch(index, record, func, user_frame())
        key = (func, self.calls[func])
        self.calls[func] += 1
        saved = self.log.saved.get(key)
        # A stale output was written in place after the function returned,
        # where no copy could be taken: the op runs again instead (a random op
        # draws what it drew in the forward, the generators being replayed).
        replays_generator = key in self.log.generators
        if saved is not None and saved.available():
            if saved.rng_after is not None:
                # The op does not run, so the generators must be moved on as it
                # moved them, for the random ops after it.
                saved.rng_after.restore()
            if replays_generator:
                self._replay_generator(key, ran=False)
            return saved.serve()
        if replays_generator:
            self._replay_generator(key, ran=True)
        written = self.log.writes.get(key)
        outside = written and {ref.cdata for ref in written if not ref.expired()}
        if outside:
            out = run_on_copies(func, args, kwargs, outside)
        else:
            out = func(*args, **kwargs)
        if self.ran is not None:
            self.ran[index] = (func, tensor_metas(out), self.ran[index][2])
        if checked and record is not None:
            recomputed = tensor_metas(out)
            if recomputed != record.outputs:
                raise output_mismatch(record, recomputed, user_frame())
        return out


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

_FIX = ("The function must run the same ops on tensors of the same shapes and "
        "dtypes when it runs again in backward: make it independent of Python "
        "state that changes between calls (counters, flags, data-dependent "
        "branches, other random sources), or pass determinism_check=\"none\" "
        "to skip this check at the risk of wrong gradients.")


def describe_op(op, metas, where) -> str:
    text = f"{op} -> {describe_meta(metas)}"
    source = format_where(where)
    return f"{text} at {source}" if source else text


def _describe_ran(op, metas, where) -> str:
    if metas is not None:
        return describe_op(op, metas, where)
    source = format_where(where)
    return f"{op} at {source}" if source else f"{op}"


def op_mismatch(index: int, record: Optional[OpRecord], func,
                where) -> RecomputeMismatchError:
    if record is None:
        forward = "the forward had run no more ops"
    else:
        forward = f"the forward ran {record.describe()}"
    source = format_where(where)
    here = f"{func}" + (f" at {source}" if source else "")
    return RecomputeMismatchError(
        f"fxckpt.checkpoint: the recomputation differs from the forward at op "
        f"#{index}: {forward}, the recomputation ran {here}. {_FIX}")


def output_mismatch(record: OpRecord, recomputed, where) -> RecomputeMismatchError:
    source = format_where(where)
    return RecomputeMismatchError(
        f"fxckpt.checkpoint: the recomputation differs from the forward at op "
        f"#{record.index} ({record.op}"
        + (f" at {source}" if source else "")
        + f"): the forward produced {describe_meta(record.outputs)}, the "
        f"recomputation produced {describe_meta(recomputed)}. {_FIX}")

"""Count aten ops executed in a forward phase and a backward phase.

Usage::

    with OpCounter() as c:
        c.phase("forward")
        out = model(x)
        loss = out.sum()
        c.phase("backward")
        loss.backward()
    c.counts["forward"][torch.ops.aten.mm]
    c.total(torch.ops.aten.mm)

Ops are keyed by overload packet (``torch.ops.aten.mm``, not
``torch.ops.aten.mm.default``); ``c.overload_counts`` has the same data keyed
by overload.  The dispatch mode sees aten ops as they reach the Python
dispatch key, i.e. after autograd: in eager, CompositeImplicitAutograd ops
(``aten.linear``, ``aten.dropout``) show up as what they decompose into
(``aten.addmm``, ``aten.bernoulli_`` ...).  Ops run by compiled graphs that
execute aten ops from Python (``backend="aot_eager"``) are counted too, but
note that the ops in such a graph can differ from eager's (for example
``aten.native_dropout`` instead of ``aten.bernoulli_`` + ``aten.div_`` +
``aten.mul``).

torch.compile: by default dynamo neither compiles nor runs compiled code
while a (non-infra) TorchDispatchMode is active -- it silently falls back to
eager.  OpCounter avoids that by declaring ``ignore_compile_internals()``
(see ``count_compiled``), so compiled graphs do run and their aten ops are
counted; compilation itself (tracing with fake tensors) is not counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# View/metadata/copy noise that is usually not interesting when counting
# compute.  Pass ``ignore=DEFAULT_IGNORE`` to drop it.
DEFAULT_IGNORE: frozenset = frozenset({
    aten.detach,
    aten._to_copy,
    aten.alias,
    aten.lift_fresh,
})


def _packet(func: Any) -> Any:
    return getattr(func, "overloadpacket", func)


class _InstanceOrClassFlag:
    """``ignore_compile_internals`` is a classmethod on TorchDispatchMode;
    this lets each OpCounter instance choose, while a call on the class still
    gives the class default."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj, objtype=None):
        owner = obj if obj is not None else objtype
        return lambda: bool(getattr(owner, self.attr))


class OpCounter(TorchDispatchMode):
    """Counts aten op calls per phase (``"forward"``, ``"backward"`` or any
    other name).  Calls before the first :meth:`phase` call are counted
    under ``initial_phase``.

    ``count_compiled=True`` (default) makes ``torch.compile`` work under the
    counter: the mode reports ``ignore_compile_internals() == True``, so
    dynamo compiles with the mode switched off and switches it back on while
    the compiled artifact runs; with ``backend="aot_eager"`` (or any backend
    running aten ops from Python) the ops of the compiled forward and
    backward graphs are then counted.  With ``count_compiled=False`` dynamo
    refuses to compile or run compiled code while the counter is active
    ("non-infra torch dispatch mode present") and the module silently runs
    eagerly instead."""

    count_compiled: bool = True
    ignore_compile_internals = _InstanceOrClassFlag("count_compiled")

    def __init__(self, ignore: Iterable[Any] = (), *,
                 initial_phase: str = "forward",
                 count_compiled: bool = True) -> None:
        super().__init__()
        self.count_compiled = count_compiled
        self.ignore = frozenset(_packet(op) for op in ignore)
        self.current = initial_phase
        self.counts: dict[str, Counter] = {}
        self.overload_counts: dict[str, Counter] = {}
        self._ensure(initial_phase)

    def _ensure(self, name: str) -> None:
        self.counts.setdefault(name, Counter())
        self.overload_counts.setdefault(name, Counter())

    def phase(self, name: str) -> None:
        self._ensure(name)
        self.current = name

    # Compiled graphs can contain higher-order operators at runtime, e.g.
    # ``run_and_save_rng_state(op, *args)`` / ``run_with_rng_state(state,
    # op, *args)`` for dropout inside a user ``torch.utils.checkpoint``
    # region under aot_eager.  Without this flag such graphs raise
    # NotImplementedError under the counter.
    supports_higher_order_operators = True

    def _count(self, func: Any) -> None:
        packet = _packet(func)
        if packet not in self.ignore:
            self.counts[self.current][packet] += 1
            self.overload_counts[self.current][func] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._count(func)
        if isinstance(func, torch._ops.HigherOrderOperator):
            # The HOP runs with this mode switched off, so the aten op it
            # wraps is not seen; count the wrapped op (first OpOverload among
            # the leading arguments, as in the rng HOPs) explicitly.
            for a in args[:2]:
                if isinstance(a, torch._ops.OpOverload):
                    self._count(a)
                    break
        return func(*args, **kwargs)

    def total(self, op: Any, phase: str | None = None) -> int:
        """Calls of ``op`` (packet or overload) over all phases, or in one."""
        phases = [phase] if phase is not None else list(self.counts)
        if hasattr(op, "overloadpacket"):  # a specific overload
            return sum(self.overload_counts[p][op] for p in phases)
        return sum(self.counts[p][op] for p in phases)

    def ops(self, phase: str) -> set:
        return {op for op, n in self.counts[phase].items() if n}

    def summary(self) -> str:
        lines = []
        for ph, c in self.counts.items():
            lines.append(f"[{ph}]")
            for op, n in sorted(c.items(), key=lambda kv: str(kv[0])):
                lines.append(f"  {op}: {n}")
        return "\n".join(lines)


# fxckpt plans a host dropout as two ops (fxckpt/passes/dropout.py): the
# draw, ``fxckpt.dropout_mask``, and the product of the input with the mask,
# ``fxckpt.apply_dropout_mask``. Forward runs them as one native_dropout.
# A recomputed dropout runs them in backward: the draw is torch's recomputed
# native_dropout, the product the rest of it (not an op of its own in torch).
_DRAW, _PRODUCT = "fxckpt.dropout_mask", "fxckpt.apply_dropout_mask"


def as_torch_counts(counts: Counter) -> Counter:
    """``counts`` (keyed by packet or by its name) with each replayed draw
    counted as the ``aten.native_dropout`` torch recomputes, and the
    products left out."""
    named = isinstance(next(iter(counts), ""), str)
    out = Counter()
    for op, n in counts.items():
        name = op if named else str(op)
        if name == _PRODUCT:
            continue
        if name == _DRAW:
            op = "aten.native_dropout" if named else aten.native_dropout
        out[op] += n
    return out

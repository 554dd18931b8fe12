"""The policy vocabulary: what to save, what to recompute, what to offload.

A policy is a small frozen value: it prints, hashes and compares. Asked about
one forward op (an ``OpCall``) it answers a ``CheckpointPolicy``, None (no
opinion: in ``first(...)`` the next policy answers) or ``DEFER`` (leave it to
the planner's defaults). ``for_graph()`` gives the decider the tag stage asks,
once per forward op in forward order; policies that count keep their count
there, so each graph starts afresh. Stateless policies can also be called
directly on an ``OpCall``.

What no part of a policy answers is recomputed, as in torch's selective
checkpointing and JAX's checkpoint policies: ``save_matmuls()`` saves matmuls
and recomputes the rest. ``first(by_module("blocks.0.*", recompute_all()),
defaults())`` recomputes block 0 and plans the rest as without a policy.

``PREFER_*`` answers are followed unless a memory budget forces otherwise;
``MUST_*`` answers (``must(...)``, a policy function returning True or a MUST
value, a list of ops) are never overridden.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping

import torch

from fxckpt.compat.ops import (HigherOrderOperator, OpOverload, OpOverloadPacket,
                               dispatch_op_names)
from fxckpt.ops import is_matmul_op, op_packet
from fxckpt.policies.api import DEFER, P, Answer, OpCall, Policy, finish
from fxckpt.policies.attention import AttentionDecider

aten = torch.ops.aten

__all__ = [
    "save_all", "recompute_all", "defaults",
    "save_matmuls", "save_ops", "recompute_ops", "save_names", "by_module",
    "every_nth_matmul", "megatron_selective", "offload", "must", "first",
]


# ---------------------------------------------------------------------------
# Simple policies
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class save_all(Policy):
    """Save every value backward needs: nothing is recomputed."""

    def __call__(self, call: OpCall) -> Answer:
        return P.PREFER_SAVE


@dataclass(frozen=True)
class recompute_all(Policy):
    """Recompute every value that can be recomputed."""

    def __call__(self, call: OpCall) -> Answer:
        return P.PREFER_RECOMPUTE


@dataclass(frozen=True)
class defaults(Policy):
    """Leave the op to the planner: views and cheap pointwise ops prefer
    recompute, matmuls save, the rest is the solver's call."""

    def __call__(self, call: OpCall) -> Answer:
        return DEFER


@dataclass(frozen=True)
class save_matmuls(Policy):
    """Save matmul outputs (mm, addmm, bmm, baddbmm, ...). ``no_batch_dims``
    saves only those without batch dimensions (mm, addmm, linear; not bmm),
    like JAX's ``dots_with_no_batch_dims_saveable``."""

    no_batch_dims: bool = False

    def __call__(self, call: OpCall) -> Answer:
        if not is_matmul_op(call.op):
            return None
        if self.no_batch_dims and _has_batch_dims(call):
            return None
        return P.PREFER_SAVE


def _has_batch_dims(call: OpCall) -> bool:
    packet = op_packet(call.op)
    if packet in (aten.bmm, aten.baddbmm):
        return True
    if packet is aten.matmul:
        dims = [a.dim() for a in call.args[:2] if isinstance(a, torch.Tensor)]
        return len(dims) == 2 and min(dims) > 2
    return False


@dataclass(frozen=True, init=False, repr=False)
class save_ops(Policy):
    """Save the outputs of these ops: OpOverloads, packets (every overload) or
    names such as ``"aten.mm"`` or ``"aten.mm.default"``."""

    ops: tuple

    def __init__(self, *ops) -> None:
        object.__setattr__(self, "ops", _resolve_ops(ops, type(self).__name__))

    def __call__(self, call: OpCall) -> Answer:
        return P.PREFER_SAVE if _op_in(call.op, self.ops) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(str, self.ops))})"


class recompute_ops(save_ops):
    """Recompute the outputs of these ops (forms as ``save_ops``)."""

    def __call__(self, call: OpCall) -> Answer:
        return P.PREFER_RECOMPUTE if _op_in(call.op, self.ops) else None


def _op_in(op, ops: tuple) -> bool:
    return op in ops or op_packet(op) in ops


def _resolve_ops(ops, who: str) -> tuple:
    if len(ops) == 1 and isinstance(ops[0], (list, tuple, set, frozenset)):
        ops = tuple(ops[0])
    if not ops:
        raise ValueError(f"{who}() needs at least one op")
    return tuple(_resolve_op(op, who) for op in ops)


def _resolve_op(op, who: str):
    if isinstance(op, (OpOverload, OpOverloadPacket, HigherOrderOperator)):
        return op
    if not isinstance(op, str):
        raise TypeError(f"{who}: {op!r} is not an op; pass torch.ops.aten.mm.default, "
                        "torch.ops.aten.mm or a name such as 'aten.mm'")
    text = op.removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    if len(parts) == 1:
        parts = ["aten", *parts]
    if len(parts) > 3 or not all(parts):
        raise ValueError(f"{who}: cannot read op name {op!r}; write 'aten.mm' or 'aten.mm.default'")
    namespace, name, *overload = parts
    try:
        found = getattr(getattr(torch.ops, namespace), name)
        return getattr(found, overload[0]) if overload else found
    except (AttributeError, RuntimeError):
        known = [n.split("::", 1)[1] for n in dispatch_op_names()
                 if n.startswith(namespace + "::")]
        if overload:
            candidates = set(known) | {f"{n}.default" for n in known if "." not in n}
        else:
            candidates = {n.split(".")[0] for n in known}
        close = difflib.get_close_matches(".".join([name, *overload]), sorted(candidates), n=4)
        raise ValueError(
            f"{who}: there is no op {op!r}"
            + (f"; did you mean {', '.join(f'{namespace}.{c}' for c in close)}?" if close else "")
        ) from None


# ---------------------------------------------------------------------------
# Names and modules
# ---------------------------------------------------------------------------


@dataclass(frozen=True, init=False, repr=False)
class save_names(Policy):
    """Save the values named with ``fxckpt.name(tensor, name)`` in the model."""

    names: tuple[str, ...]

    def __init__(self, *names: str) -> None:
        if not names or not all(isinstance(n, str) and n for n in names):
            raise TypeError(f"save_names takes one or more names (str), got {names!r}")
        object.__setattr__(self, "names", tuple(names))

    def __call__(self, call: OpCall) -> Answer:
        return P.PREFER_SAVE if set(call.value_names) & set(self.names) else None

    def for_graph(self):
        return _NamesDecider(self)

    def __repr__(self) -> str:
        return f"save_names({', '.join(map(repr, self.names))})"


class _NamesDecider:
    def __init__(self, policy: save_names) -> None:
        self.policy = policy
        self.seen: set[str] = set()

    def __call__(self, call: OpCall) -> Answer:
        self.seen.update(call.value_names)
        return self.policy(call)

    def finish(self) -> dict:
        missing = [n for n in self.policy.names if n not in self.seen]
        if missing:
            warnings.warn(
                f"{self.policy!r}: no value in this graph is named {', '.join(map(repr, missing))}"
                f" (names seen: {sorted(self.seen) or 'none'}); name values in the "
                "model's forward with fxckpt.name(tensor, 'name')", stacklevel=2)
        return {}


@dataclass(frozen=True)
class by_module(Policy):
    """``policy`` for ops inside modules whose path (``blocks.0.attn``) matches
    the glob ``pattern`` (``blocks.*.attn``), submodules included; no opinion
    elsewhere."""

    pattern: str
    policy: Policy

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise TypeError(f"by_module: pattern must be a str, got {self.pattern!r}")
        if not isinstance(self.policy, Policy):
            raise TypeError(f"by_module: {self.policy!r} is not a policy from fxckpt.policies")

    def matches(self, module_path: str) -> bool:
        parts = module_path.split(".") if module_path else [""]
        return any(fnmatch.fnmatchcase(".".join(parts[:i]), self.pattern)
                   for i in range(1, len(parts) + 1))

    def __call__(self, call: OpCall) -> Answer:
        return self.policy(call) if self.matches(call.module_path) else None

    def for_graph(self):
        return _ModuleDecider(self)


class _ModuleDecider:
    def __init__(self, policy: by_module) -> None:
        self.policy = policy
        self.inner = policy.policy.for_graph()
        self.paths: set[str] = set()
        self.matched = False

    def __call__(self, call: OpCall) -> Answer:
        self.paths.add(call.module_path)
        if not self.policy.matches(call.module_path):
            return None
        self.matched = True
        return self.inner(call)

    def finish(self) -> Mapping[str, Answer]:
        if not self.matched:
            prefixes = {".".join(p.split(".")[:i]) for p in self.paths if p
                        for i in range(1, p.count(".") + 2)}
            close = difflib.get_close_matches(self.policy.pattern, sorted(prefixes), n=5,
                                              cutoff=0.4)
            warnings.warn(
                f"by_module({self.policy.pattern!r}, ...) matches no module in this graph; "
                + (f"close module paths: {', '.join(close)}" if close else
                   f"module paths here: {', '.join(sorted(prefixes)[:8]) or 'none'}"),
                stacklevel=2)
        return finish(self.inner)


# ---------------------------------------------------------------------------
# Counting and pattern policies
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class every_nth_matmul(Policy):
    """Save every matmul output except every ``n``-th, counting matmuls in
    forward order (torchtitan's selective op checkpointing, n=2)."""

    n: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"every_nth_matmul: n must be an int >= 1, got {self.n!r}")

    def __call__(self, call: OpCall) -> Answer:
        raise TypeError("every_nth_matmul counts matmuls, so it answers through "
                        "for_graph(), one decider per graph")

    def for_graph(self):
        return _NthMatmulDecider(self.n)


class _NthMatmulDecider:
    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0

    def __call__(self, call: OpCall) -> Answer:
        if not is_matmul_op(call.op):
            return None
        self.count += 1
        return P.PREFER_RECOMPUTE if self.count % self.n == 0 else P.PREFER_SAVE


@dataclass(frozen=True)
class megatron_selective(Policy):
    """Megatron-LM's selective recompute: recompute core attention (the score
    matmul, mask and scale, softmax, attention dropout and the matmul with the
    values, or a fused attention op), save everything else. Backward runs
    again only what it reads: the matmul with the values not, as the saved
    input of the output projection stands for it.

    Core attention is found in the graph: a softmax reached from a matmul
    through views and pointwise ops, that reaches a matmul through views,
    pointwise ops and dropout. The score matmul is only known once its softmax
    is seen, so it is revised in ``finish()``; a caller that ignores revisions
    recomputes softmax and fused attention only.
    """

    def __call__(self, call: OpCall) -> Answer:
        raise TypeError("megatron_selective finds attention across ops, so it answers "
                        "through for_graph(), one decider per graph")

    def for_graph(self):
        return AttentionDecider()


# ---------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------

_OFFLOAD = {P.PREFER_SAVE: P.PREFER_CPU_OFFLOAD, P.MUST_SAVE: P.MUST_CPU_OFFLOAD}
_MUST = {P.PREFER_SAVE: P.MUST_SAVE, P.PREFER_RECOMPUTE: P.MUST_RECOMPUTE,
         P.PREFER_CPU_OFFLOAD: P.MUST_CPU_OFFLOAD}


@dataclass(frozen=True)
class _Remapped(Policy):
    """``policy``'s answers, passed through ``mapping``."""

    policy: Policy
    mapping: ClassVar[dict] = {}

    def __call__(self, call: OpCall) -> Answer:
        return self._convert(self.policy(call))

    def for_graph(self):
        return MappedDecider(self.policy.for_graph(), self._convert)

    def _convert(self, answer: Answer) -> Answer:
        return self.mapping.get(answer, answer)


@dataclass(frozen=True)
class offload(_Remapped):
    """Offload to CPU memory what ``policy`` saves (PREFER_SAVE ->
    PREFER_CPU_OFFLOAD, MUST_SAVE -> MUST_CPU_OFFLOAD); its other answers stand."""

    mapping: ClassVar[dict] = _OFFLOAD


@dataclass(frozen=True)
class must(_Remapped):
    """``policy``'s answers as MUST_*: never overridden, not even by a budget."""

    mapping: ClassVar[dict] = _MUST


class MappedDecider:
    """A decider's answers, revisions included, passed through ``convert``."""

    def __init__(self, inner, convert: Callable[[Answer], Answer]) -> None:
        self.inner = inner
        self.convert = convert

    def __call__(self, call: OpCall) -> Answer:
        return self.convert(self.inner(call))

    def finish(self) -> dict[str, Answer]:
        return {n: self.convert(a) for n, a in finish(self.inner).items()}


@dataclass(frozen=True, init=False)
class first(Policy):
    """The first answer that is not None among ``policies``. Every policy is
    asked about every op, so counting policies count in forward order."""

    policies: tuple[Policy, ...]

    def __init__(self, *policies: Policy) -> None:
        if not policies or not all(isinstance(p, Policy) for p in policies):
            raise TypeError(f"first(...) takes policies from fxckpt.policies, got {policies!r}")
        object.__setattr__(self, "policies", tuple(policies))

    def __call__(self, call: OpCall) -> Answer:
        return _first_answer([p(call) for p in self.policies])

    def for_graph(self):
        return _FirstDecider([p.for_graph() for p in self.policies])

    def __repr__(self) -> str:
        return f"first({', '.join(map(repr, self.policies))})"


def _first_answer(answers) -> Answer:
    return next((a for a in answers if a is not None), None)


class _FirstDecider:
    def __init__(self, deciders: list) -> None:
        self.deciders = deciders
        self.answers: dict[str, list[Answer]] = {}

    def __call__(self, call: OpCall) -> Answer:
        answers = [decide(call) for decide in self.deciders]
        self.answers[call.name] = answers
        return _first_answer(answers)

    def finish(self) -> dict[str, Answer]:
        revisions = [finish(decide) for decide in self.deciders]
        revised = {}
        for name in set().union(*revisions):
            answers = list(self.answers.get(name, [None] * len(self.deciders)))
            for i, changed in enumerate(revisions):
                if name in changed:
                    answers[i] = changed[name]
            revised[name] = _first_answer(answers)
        return revised

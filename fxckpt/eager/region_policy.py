"""The policy a graph-break fallback region runs with, between its floor and
the user's policy, and what each choice holds for backward.

A region's **floor** keeps what no budget may take away: its inputs (which
``fxckpt.checkpoint`` saves) and the outputs the user's policy answers
``MUST_SAVE`` (or ``MUST_CPU_OFFLOAD``, kept in place on the eager path);
everything else is recomputed in backward. Its **optional saves** are the
ops the user's policy answers ``PREFER_SAVE`` (or ``PREFER_CPU_OFFLOAD``),
in forward order. ``RegionPolicy(user, keep=k)`` follows the first ``k`` of
them and recomputes the rest: ``keep=0`` is the floor, ``keep=None`` the
user's policy itself. (A wrapper of the user's decider rather than
``policies.first(...)``: the user's policy may be a torch policy function,
and its MUST answers must come through whatever it is.)

The decider records, call by call, the storages each optional save's output
lives in, whether it was followed or not: one step at any ``keep`` tells
what every other ``keep`` would hold (``RegionBytes.at``), so a budget can
choose without trying.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.eager.tensors import tensor_leaves
from fxckpt.memory.values import storage_key
from fxckpt.ops import op_kind
from fxckpt.policies.api import Answer, OpCall, PolicyFactory, finish

P = CheckpointPolicy
OPTIONAL_SAVES = frozenset({P.PREFER_SAVE, P.PREFER_CPU_OFFLOAD})


@dataclass(frozen=True)
class RegionPolicy:
    """The user's policy with only its first ``keep`` optional saves followed
    (None: all of them; 0: the region's floor). MUST answers always stand."""

    user: PolicyFactory | None
    keep: int | None = None

    def decider(self) -> "RegionDecider":
        return RegionDecider(self.user.for_graph() if self.user is not None else None,
                             self.keep)

    def describe(self) -> str:
        if self.user is None:
            return "everything recomputed (no policy: its floor)"
        user = repr(self.user)
        if self.keep is None:
            return f"the user's policy ({user})"
        if self.keep == 0:
            return f"its floor ({user}, only its MUST answers followed)"
        return f"{user}, its first {self.keep} optional save(s) followed"


class RegionDecider:
    """One region call's decider (and its own one-use policy factory, as
    ``fxckpt.checkpoint`` takes one): the user's answers, optional saves past
    the first ``keep`` turned into recompute. ``optional`` lists, per
    optional save in forward order, the output's storages and their bytes."""

    def __init__(self, user, keep: int | None) -> None:
        self.user = user
        self.keep = keep
        self.optional: list[dict[int, int]] = []
        self._index: dict[str, int] = {}

    def for_graph(self) -> "RegionDecider":
        return self

    def __call__(self, call: OpCall) -> Answer:
        answer = self.user(call) if self.user is not None else None
        if answer not in OPTIONAL_SAVES or not op_kind(call.op).cacheable:
            return answer    # MUST answers, recompute, and ops that always run again
        index = len(self.optional)
        self._index[call.name] = index
        self.optional.append(_storages(call.output))
        return answer if self._followed(index) else P.PREFER_RECOMPUTE

    def finish(self) -> Mapping[str, Answer]:
        """The user's revisions (``policies.api.finish``); a revision that
        drops an optional save leaves its entry holding nothing."""
        revised = dict(finish(self.user)) if self.user is not None else {}
        for name, answer in revised.items():
            index = self._index.get(name)
            if index is None:
                continue
            if answer not in OPTIONAL_SAVES:
                self.optional[index] = {}
            elif not self._followed(index):
                revised[name] = P.PREFER_RECOMPUTE
        return revised

    def _followed(self, index: int) -> bool:
        return self.keep is None or index < self.keep


def _storages(output: Any) -> dict[int, int]:
    found = {}
    for tensor in tensor_leaves(output):
        key = storage_key(tensor)
        if key is not None:
            found[key] = tensor.untyped_storage().nbytes()
    return found


@dataclass(frozen=True)
class RegionBytes:
    """What a region holds for backward over one step, measured: as it ran
    (``held``), at its floor, and the bytes each optional save adds, per
    call, in forward order; ``activations``, what autograd saved inside
    it, which a recomputation in backward re-creates at most; and
    ``temporaries``, the most one op's backward adds to those while it runs
    (the largest of any call)."""

    held: int
    floor: int
    optional: tuple[tuple[int, ...], ...]
    activations: int = 0
    temporaries: int = 0

    def at(self, keep: int | None) -> int:
        """Bytes held with the first ``keep`` optional saves followed."""
        return self.floor + sum(sum(call[:keep]) for call in self.optional)

    @property
    def policy(self) -> int:
        return self.at(None)

    @property
    def saves(self) -> int:
        """How many optional saves a call has (the most any call has)."""
        return max((len(call) for call in self.optional), default=0)

    def keep_for(self, fraction: float) -> int | None:
        """The most optional saves whose bytes stay within ``fraction`` of
        the way from the floor to the user's policy (None at 1: the user's
        policy itself)."""
        if fraction >= 1.0:
            return None
        target = self.floor + fraction * (self.policy - self.floor)
        keep = 0
        while keep < self.saves and self.at(keep + 1) <= target:
            keep += 1
        return keep

    def __add__(self, other: "RegionBytes") -> "RegionBytes":
        return RegionBytes(self.held + other.held, self.floor + other.floor,
                           self.optional + other.optional,
                           self.activations + other.activations,
                           max(self.temporaries, other.temporaries))


def region_bytes(held: Mapping[int, int], decider: RegionDecider, *,
                 not_held: set[int], activations: int = 0,
                 temporaries: int = 0) -> RegionBytes:
    """One call's ``RegionBytes`` from the storages it held for backward
    (storage -> bytes) and its decider's record. ``not_held``: storages that
    are not the region's to count (its inputs and outputs, parameters).

    The floor is what it held less what its followed optional saves add:
    counted by size, not by storage, since a saved output written in place
    later in the forward is kept as a copy (``eager/modes.py``)."""
    counted = set(not_held)
    optional = []
    for storages in decider.optional:
        fresh = {key: n for key, n in storages.items() if key not in counted}
        counted.update(fresh)
        optional.append(sum(fresh.values()))
    followed = optional if decider.keep is None else optional[:decider.keep]
    total = sum(held.values())
    return RegionBytes(total, total - sum(followed), (tuple(optional),), activations,
                       temporaries)

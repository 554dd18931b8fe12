"""Plain data passed between the stages: Profile -> Tags -> Decision (-> Plan,
in fxckpt.report.plan), and the small enums they use.

Nothing here holds an ``fx.Node``: every value is keyed by node name, so a stage
can be tested with data made by hand and printed without a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping

from torch.utils.checkpoint import CheckpointPolicy


class _Word(str, Enum):
    """An enum whose members are also their words: they print, format and
    compare as the plain strings they stand for."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Phase(_Word):
    FORWARD = "forward"
    BACKWARD = "backward"


FORWARD = Phase.FORWARD
BACKWARD = Phase.BACKWARD


class Action(_Word):
    """What a plan does with a forward value backward needs."""

    SAVED = "saved"
    OFFLOADED = "offloaded"      # saved in host memory between forward and backward
    RECOMPUTED = "recomputed"    # run in forward and again in backward
    DEFERRED = "deferred"        # only backward reads it: run once, there


class Origin(_Word):
    """Who asked for a tag. Default preferences are hints the planner may
    trade for fewer saved bytes; the others are followed unless a budget
    forces otherwise."""

    OP = "op"            # what the op allows
    REGION = "region"    # a torch.utils.checkpoint region in the model
    POLICY = "policy"    # the policy option
    DEFAULT = "default"


# The op a PlanEntry names for the generator state a recomputed random op replays.
RNG_STATE_OP = "rng state"
# A recompute clone in the backward graph is named after the forward value.
RECOMPUTED_SUFFIX = "_recomputed"
COPY_INFIX = "_copy"


def recomputed_name(name: str) -> str:
    return name + RECOMPUTED_SUFFIX


def copy_recomputed_name(name: str, copy: int) -> str:
    """The name of an earlier backward copy of a value recomputed more than
    once (see Decision.copy_steps); the last copy has ``recomputed_name``."""
    return f"{name}{COPY_INFIX}{copy}{RECOMPUTED_SUFFIX}"


def is_recomputed_name(name: str) -> bool:
    return name.endswith(RECOMPUTED_SUFFIX)


def point(phase: Phase, name: str) -> str:
    """A moment of the step: just after node ``name`` of ``phase`` ran."""
    return f"{phase}:{name}"


def split_point(at: str) -> tuple[Phase, str]:
    phase, _, name = at.partition(":")
    return Phase(phase), name


@dataclass(frozen=True)
class RematKind:
    """How torch's min-cut partitioner (functorch's partitioners) sees
    one op, so that a reference strategy can plan as torch.compile does."""

    view: bool = False          # on its list of views: never banned from recompute
    fusible: bool = False       # fuses with a fusible neighbour (a recompute it counts as free)
    allowed: bool = False       # on its allowlist of ops it may recompute
    fuses_inputs: bool = False  # any producer fuses into it (a concatenation)
    getitem: bool = False       # an element of a multi-output op
    reduction: bool = False     # its output is under a quarter of its inputs' size
    bytes: int = 0              # its size measure: elements times item size


@dataclass(frozen=True)
class NodeProfile:
    """What the planner needs to know of one value of the joint graph."""

    name: str
    op: str                      # printable target, e.g. "aten.mm.default"
    phase: Phase
    inputs: tuple[str, ...]      # names of the nodes this one reads
    bytes: int                   # bytes this node allocates (0 for views, non-tensors)
    storage: str                 # name of the node whose allocation this value lives in
    flops: int = 0
    cost: float = 0.0            # estimated seconds to compute (flops + memory traffic)
    is_input: bool = False       # a placeholder (primal or tangent)
    is_static: bool = False      # a parameter or buffer: alive for the whole step anyway
    # An input the step mutates in place (a BatchNorm running stat): it can be
    # neither saved (autograd's version check would fail) nor read by a recompute.
    is_mutated_input: bool = False
    is_tensor: bool = True
    device: str = ""             # device type of the value ("cpu", "cuda", ...)
    is_symbolic: bool = False    # a SymInt/SymFloat/SymBool (or plain number) value
    is_view: bool = False
    is_pointwise: bool = False
    is_random: bool = False
    replay_bytes: int = 0        # generator state saved if this random op is recomputed
    workspace: int = 0           # scratch bytes the op holds while it runs
    is_compute_intensive: bool = False
    # Why this value cannot be recomputed ("" when it can).
    not_recomputable: str = ""
    source: str = ""             # the user's source line that produced this op
    module_path: str = ""        # e.g. "blocks.0.attn" from nn_module_stack
    # The module whose forward op this node belongs to: module_path, or, for
    # nodes AOTAutograd adds for backward, the module of the op they serve
    # (fwd_nn_module_stack); "" when the graph records neither.
    owner_module_path: str = ""
    # Traced from the compiled module's own code (no module stack, not an
    # op AOTAutograd adds): outside every submodule.
    at_root: bool = False
    remat: RematKind | None = None   # None: derived from the fields above

    @property
    def recomputable(self) -> bool:
        return not self.not_recomputable


@dataclass(frozen=True)
class Profile:
    """The joint graph as numbers. ``nodes`` is in graph (topological) order."""

    nodes: Mapping[str, NodeProfile]
    # Forward values read directly by a backward node, or returned to backward's
    # caller: the values the backward needs, saved or recomputed.
    needed_by_backward: frozenset[str]
    forward_outputs: tuple[str, ...]
    backward_outputs: tuple[str, ...]

    def forward_nodes(self) -> list[NodeProfile]:
        return [n for n in self.nodes.values() if n.phase == FORWARD]

    def storage_bytes(self, names) -> int:
        """Bytes held by ``names``, counting each storage once and no static input."""
        seen: dict[str, int] = {}
        for name in names:
            owner = self.nodes[self.nodes[name].storage]
            if not owner.is_static:
                seen[owner.name] = owner.bytes
        return sum(seen.values())


@dataclass(frozen=True)
class Tag:
    policy: CheckpointPolicy | None   # None: no preference, the solver decides
    reason: str                       # why, in words
    origin: Origin = Origin.DEFAULT


@dataclass(frozen=True)
class Decision:
    """The solver's answer, before rewriting: which forward values backward gets
    saved, and which it recomputes."""

    saved: frozenset[str]
    recomputed: frozenset[str]
    solver: str
    solve_seconds: float = 0.0
    gap: float | None = None          # relative optimality gap (0 = proven optimal)
    overrides: tuple[str, ...] = ()   # PREFER_* tags the budget overrode, with reasons
    budget_bytes: int | None = None   # the budget it was solved for, resolved to bytes
    # Saved values kept in host memory between forward and backward.
    offloaded: frozenset[str] = frozenset()
    # Bytes per second one way between device and host that priced offload
    # (None when nothing could be offloaded).
    offload_bandwidth: float | None = None
    # Recomputed values backward computes more than once, each with the
    # backward steps (indices into the profile's backward nodes, in graph
    # order) from which a new copy serves: copy 0 serves what needs the value
    # before the first step, copy j what needs it from step j on. A copy is
    # freed once what it serves ran. Pairs (name, steps), sorted by name.
    copy_steps: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def recomputed_again(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.copy_steps)

"""The planning problem as numbers: what solvers see instead of a graph.

One adapter (``build_problem``) maps a Profile and its Tags to arrays indexed
by forward value; every strategy answers with two boolean masks, ``saved``
and ``recomputed`` (computed in backward), and ``to_decision`` maps them back
to names. Property tests drive solvers with Problems made from random data.

The memory proxy. Solvers need peak memory as a function of the masks; the
exact answer (memory.simulate on the rewritten graphs) is too slow to call
inside a search, so a Problem carries a linear model over a few stages:

* forward stage t:  base_fwd[t] + sum_i size_i * saved_i * [i made before t and
  forward is done reading it by t]  -- saving extends a value's life to the
  end of forward;
* backward stage k: base_bwd[k] + sum_i size_i * saved_i * [backward still
  reads i at or after k, or recomputes from it a value it first needs at or
  after k] + sum_i size_i * recomputed_i * [i is live at k once
  rematerialised just in time] + sum_i replay_i * recomputed_i.

Which values recompute chains run through is a guess the proxy refines from
the plans it is checked against (``refined``): a saved value read only by
recomputes in such a chain is held up to the point the chain runs, where
an unheld value would leave the proxy under such plans' exact peak
(tests/test_proxy_lifetimes.py).

``base`` is what is live at the stage whatever the plan (backward's own
temporaries and gradients, forward values in flight). solve/proxy_stages.py picks
the stages and makes these rows.

Offload, a third way to give backward a value: a value tagged *_CPU_OFFLOAD
may be saved in host memory (``offloaded``, a subset of ``saved``). It is
copied out right after forward made it, so on the device it lives as an
unsaved value does in forward and, reloaded just before backward first needs
it, as a recomputed value does in backward; its price is the transfer time
both ways (``transfer``) instead of recompute cost. The model is checked
against the exact simulation after every solve; where it is optimistic the
budgeted driver tightens its target and solves again.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.types import BACKWARD, Decision, Origin, Profile, Tag, point, split_point
from fxckpt.solve.common import run_in_forward
from fxckpt.solve.constant_fills import default_constant_fills
from fxckpt.solve.remat_classes import RematClasses, remat_classes
from fxckpt.solve.proxy_stages import Lifetimes, stage_model

_P = CheckpointPolicy
_MUST_KEEP = (_P.MUST_SAVE, _P.MUST_CPU_OFFLOAD)
_PREFER_KEEP = (_P.PREFER_SAVE, _P.PREFER_CPU_OFFLOAD)
_OFFLOAD = (_P.MUST_CPU_OFFLOAD, _P.PREFER_CPU_OFFLOAD)
# The first numbered component of a module path names a repeated block:
# "blocks.3.attn" -> "blocks.3", "model.layers.0.mlp" -> "model.layers.0".
_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")
# A block's direct submodule: "blocks.3.attn.proj" -> "blocks.3.attn".
_PART = re.compile(r"^(.*?\.\d+\.[^.]+)(?:\.|$)")
# Problem's cached edge lists, which follow from its values' inputs alone.
_GRAPH_CACHES = ("input_edges", "input_lists", "reader_lists", "input_readers")


@dataclass(frozen=True)
class Problem:
    names: tuple[str, ...]
    parents: tuple[np.ndarray, ...]   # forward inputs of each value (indices)
    size: np.ndarray                  # bytes held if saved (0 for parameters)
    cost: np.ndarray                  # extra seconds if recomputed
    replay: np.ndarray                # RNG state bytes saved if recomputed
    needed: np.ndarray                # backward reads it directly
    can_save: np.ndarray
    can_recompute: np.ndarray
    prefer_save: np.ndarray           # user PREFER_SAVE: overriding it is penalised
    prefer_recompute: np.ndarray      # user PREFER_RECOMPUTE: likewise
    hint_save: np.ndarray             # any PREFER_SAVE (matmuls by default)
    hint_recompute: np.ndarray        # any PREFER_RECOMPUTE (views, pointwise by default)
    block: np.ndarray                 # index of the repeated block (layer) a value is in; -1 none
    can_offload: np.ndarray           # *_CPU_OFFLOAD: if saved, may wait in host memory
    must_offload: np.ndarray          # MUST_CPU_OFFLOAD: if saved, waits in host memory
    transfer: np.ndarray              # seconds to copy it to host and back
    bandwidth: float | None           # bytes per second one way that priced transfer
    stage_saved: np.ndarray           # (stages, n): 1 where saving i adds size_i
    stage_recomputed: np.ndarray      # (stages, n): 1 where recomputing i adds size_i
    stage_base: np.ndarray            # (stages,)
    stage_names: tuple[str, ...] = field(default=())
    lifetimes: Lifetimes | None = field(default=None, repr=False)
    # Pointwise, not random, and read only by pointwise ops (forward and
    # backward): no reader needs it materialised. None: not known (all False).
    unmaterialized: np.ndarray | None = field(default=None, repr=False)
    # Values made from no other value that a decision never saves (under
    # Inductor, see constant_fill); None: none.
    constant_fills: np.ndarray | None = field(default=None, repr=False)
    through: np.ndarray | None = field(default=None, repr=False)  # see refined()
    # How torch's own partitioner sees each value (the per-block reference).
    remat: RematClasses | None = field(default=None, repr=False)
    # Index of the block's direct submodule (attention, MLP) a value is in;
    # -1 none. None: not known.
    part: np.ndarray | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.names)

    @cached_property
    def input_edges(self):
        """value -> input edges as a COO matrix, for graph searches."""
        rows = np.concatenate([np.full(len(p), i) for i, p in enumerate(self.parents)] or [[]])
        cols = np.concatenate(list(self.parents) or [[]])
        return sp.coo_array((np.ones(len(rows), dtype=np.int8),
                             (rows.astype(np.int64), cols.astype(np.int64))),
                            shape=(self.n, self.n))

    @cached_property
    def input_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices): each value's distinct inputs, CSR style (row i
        is indices[indptr[i]:indptr[i + 1]]), for the searches that drop
        saved values' rows (computed_in_backward)."""
        edges = sp.csr_array(self.input_edges)
        edges.sum_duplicates()
        return edges.indptr.astype(np.int64), edges.indices.astype(np.int64)

    @cached_property
    def reader_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices): the distinct values reading each value, CSR
        style, as ``input_lists`` gives their inputs."""
        edges = sp.csr_array(self.input_edges.T)
        edges.sum_duplicates()
        return edges.indptr.astype(np.int64), edges.indices.astype(np.int64)

    @cached_property
    def input_readers(self) -> np.ndarray:
        """The value reading each of ``input_lists``' edges, in their order."""
        indptr, _ = self.input_lists
        return np.repeat(np.arange(self.n, dtype=np.int64), np.diff(indptr))

    @cached_property
    def stage_steps(self) -> tuple[sp.csr_array, sp.csr_array]:
        """stage_saved and stage_recomputed as differences between
        consecutive stages: a value adds its bytes over one or two runs of
        stages, so each column has a few entries where the matrices have
        one per stage it is live. Their cumulative sum over stages
        gives the rows back, exactly: bytes are whole numbers."""
        def steps(rows: np.ndarray) -> sp.csr_array:
            return sp.csr_array(np.diff(rows, axis=0, prepend=np.zeros((1, rows.shape[1]))))
        return steps(self.stage_saved), steps(self.stage_recomputed)

    @cached_property
    def binding_stages(self) -> np.ndarray:
        """The stages whose live bytes no other stage's bound (indices, in
        order). Stage k is left out where some stage j holds at least as
        much as k under every plan: j's base and each value's bytes there,
        saved, recomputed or offloaded, are no smaller (of equal stages the
        first stays). A plan within a budget at the stages kept is within
        it at every stage, so the exact programme needs only their rows: on
        a 4-layer GPT 23 of 62, and HiGHS solves its programmes in three
        quarters of the time."""
        movable = np.flatnonzero(self.can_offload)
        rows = np.hstack([
            self.stage_base[:, None],
            self.stage_saved * self.size,
            self.stage_recomputed * self.size,
            (self.stage_recomputed - self.stage_saved)[:, movable] * self.size[movable]])
        earlier = np.arange(len(rows))
        kept = []
        for k, row in enumerate(rows):
            covers = (rows >= row).all(axis=1)
            covers &= ~(rows == row).all(axis=1) | (earlier < k)
            covers[k] = False
            if not covers.any():
                kept.append(k)
        return np.array(kept, dtype=np.int64)

    def peak(self, saved: np.ndarray, recomputed: np.ndarray,
             offloaded: np.ndarray | None = None) -> float:
        """The proxy's peak for the plan given by the masks (``offloaded``
        None: the tags' choice, see ``tagged_offload``)."""
        live = self.stage_live(saved, recomputed, offloaded)
        return peak_of(live)

    def stage_live(self, saved: np.ndarray, recomputed: np.ndarray,
                   offloaded: np.ndarray | None = None) -> np.ndarray:
        """Bytes live at each stage under the plan."""
        if offloaded is None:
            offloaded = self.tagged_offload(saved)
        s = (saved & ~offloaded).astype(float) * self.size
        r = (recomputed | offloaded).astype(float) * self.size
        saved_steps, recomputed_steps = self.stage_steps
        return self.stage_base + np.cumsum(saved_steps @ s + recomputed_steps @ r) \
            + float(recomputed.astype(float) @ self.replay)

    def moved_live(self, live: np.ndarray, plan: tuple, trial: tuple) -> np.ndarray:
        """``stage_live(*trial)``, given ``live``, ``stage_live(*plan)``
        (both plans' masks as (saved, recomputed, offloaded)): only the
        values whose masks differ are weighed. The same numbers exactly,
        bytes being whole: the greedy fill weighs thousands of moves, each
        a few values away from its plan, where every stage_live walks all
        the stage rows (a 16-layer GPT: 4,800 moves)."""
        saved, recomputed, offloaded = plan
        trial_saved, trial_recomputed, trial_offloaded = trial
        changed = np.flatnonzero((saved != trial_saved) | (recomputed != trial_recomputed)
                                 | (offloaded != trial_offloaded))
        if not len(changed):
            return live
        size, replay = self.size[changed], self.replay[changed]
        before_recomputed, after_recomputed = recomputed[changed], trial_recomputed[changed]
        before_offloaded, after_offloaded = offloaded[changed], trial_offloaded[changed]
        held = ((trial_saved[changed] & ~after_offloaded).astype(float)
                - (saved[changed] & ~before_offloaded)) * size
        made = ((after_recomputed | after_offloaded).astype(float)
                - (before_recomputed | before_offloaded)) * size
        return live + self.stage_saved[:, changed] @ held \
            + self.stage_recomputed[:, changed] @ made \
            + float((after_recomputed.astype(float) - before_recomputed) @ replay)

    def tagged_offload(self, saved: np.ndarray) -> np.ndarray:
        """What the tags offload of ``saved``: every *_CPU_OFFLOAD value, as a
        plan without a budget follows a PREFER_CPU_OFFLOAD answer."""
        return saved & self.can_offload

    def plan_cost(self, recomputed: np.ndarray, offloaded: np.ndarray | None = None, *,
                  copies: np.ndarray | None = None) -> float:
        """Seconds a plan adds to a step: recompute (``copies``: how many
        times backward computes each value, where more than once), plus
        transfers for offloaded values (priced as if no copy overlapped
        compute)."""
        extra = float(self.transfer[offloaded].sum()) if offloaded is not None else 0.0
        if copies is not None:
            extra += float(self.cost @ np.maximum(copies - 1, 0))
        return self.recompute_cost(recomputed) + extra

    def refined(self, recomputed: np.ndarray) -> "Problem":
        """The same problem, with recompute lifetimes that also follow chains
        through ``recomputed`` (a plan whose peak the proxy under-estimated):
        a value fed to other recomputes is live from when the first of those
        is needed. Refinements accumulate, so the proxy only grows more
        cautious."""
        if self.lifetimes is None or self.through is None:
            return self
        through = self.through | recomputed
        rows, saved = self.lifetimes.rows(self.parents, through, self.stage_saved)
        return self._same_graph(replace(self, stage_recomputed=rows, stage_saved=saved,
                                        through=through))

    def _same_graph(self, other: "Problem") -> "Problem":
        """``other`` (this problem with other stages) given the edge lists
        this one has built: they follow from ``parents`` alone, and the
        sweep refines the problem after every plan, and rebuilding them at
        each refinement would add to a deep graph's planning time."""
        for name in _GRAPH_CACHES:
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other

    def with_stages(self, points) -> "Problem":
        """The same problem measured at these backward points too
        (``stage_names``' labels, ``types.point(BACKWARD, node)``; others
        are ignored): the stages are a bounded few picked with no plan
        known, and a plan can peak between them, where the proxy reads
        plans of different exact peaks alike (tests/test_frontier_top.py)."""
        lifetimes = self.lifetimes
        if lifetimes is None or lifetimes.step_base is None:
            return self
        known = set(self.stage_names)
        wanted = {split_point(p)[1] for p in points if isinstance(p, str)
                  and p.startswith(point(BACKWARD, "")) and p not in known}
        steps = [t for t, name in enumerate(lifetimes.step_names) if name in wanted]
        if not steps:
            return self
        lifetimes = replace(lifetimes, stages=np.concatenate([lifetimes.stages, steps]))
        # Backward rows are made whole by Lifetimes.rows.
        saved = np.vstack([self.stage_saved, np.zeros((len(steps), self.n))])
        through = self.through if self.through is not None else np.zeros(self.n, dtype=bool)
        recomputed, saved = lifetimes.rows(self.parents, through, saved)
        return self._same_graph(replace(
            self, stage_saved=saved, stage_recomputed=recomputed,
            stage_base=np.concatenate([self.stage_base, lifetimes.step_base[steps]]),
            stage_names=self.stage_names + tuple(
                point(BACKWARD, lifetimes.step_names[t]) for t in steps),
            lifetimes=lifetimes))

    def recompute_cost(self, recomputed: np.ndarray) -> float:
        return float(self.cost[recomputed].sum())

    def overrides(self, saved: np.ndarray, recomputed: np.ndarray,
                  offloaded: np.ndarray | None = None) -> list[int]:
        """Values whose user preference the plan does not follow."""
        offloaded = self.tagged_offload(saved) if offloaded is None else offloaded
        return [i for i in range(self.n)
                if (self.prefer_save[i] and recomputed[i])
                or (self.prefer_recompute[i] and saved[i])
                or (self.can_offload[i] and not offloaded[i] and (saved[i] or recomputed[i]))]

    def is_feasible(self, saved: np.ndarray, recomputed: np.ndarray,
                    offloaded: np.ndarray | None = None) -> str:
        """"" if the masks describe a plan backward can run, else why not."""
        for i in range(self.n):
            if saved[i] and not self.can_save[i]:
                return f"{self.names[i]} saved but cannot be"
            if recomputed[i] and not self.can_recompute[i]:
                return f"{self.names[i]} recomputed but cannot be"
            if offloaded is not None and offloaded[i] and not (saved[i] and self.can_offload[i]):
                return f"{self.names[i]} offloaded but not saved or not offloadable"
            if offloaded is not None and saved[i] and self.must_offload[i] and not offloaded[i]:
                return f"{self.names[i]} must be offloaded when saved"
            if self.needed[i] and not (saved[i] or recomputed[i]):
                return f"{self.names[i]} needed but neither saved nor recomputed"
            if recomputed[i]:
                for j in self.parents[i]:
                    if not (saved[j] or recomputed[j]):
                        return f"{self.names[i]} recomputed without its input {self.names[j]}"
        return ""


def peak_of(live: np.ndarray) -> float:
    """The peak of a plan's stage bytes (``Problem.stage_live``)."""
    return float(live.max()) if len(live) else 0.0


def computed_in_backward(problem: Problem, saved: np.ndarray) -> np.ndarray:
    """Values backward must compute when ``saved`` crosses over: those it
    reads, and their inputs, back to saved values. A breadth-first search
    over the value -> input edges, where saved values are not expanded.

    The greedy fill calls it for every move it scores (3,800 times planning
    a 58-layer GPT), so the search graph is made without recounting rows:
    a saved value's input edges are pointed at a sink (node n + 1, no
    edges) rather than dropped, and row n, a virtual root, points at every
    value backward reads."""
    n = problem.n
    kept = ~saved
    start = np.flatnonzero(problem.needed & kept)
    if not len(start):
        return np.zeros(n, dtype=bool)
    indptr, indices = problem.input_lists
    columns = np.concatenate([np.where(np.take(kept, problem.input_readers), indices, n + 1),
                              start])
    end = len(columns)
    rows = np.concatenate([indptr, (end, end)])
    graph = sp.csr_array((np.ones(end), columns, rows), shape=(n + 2, n + 2))
    reached = breadth_first_order(graph, n, return_predecessors=False)
    computed = np.zeros(n + 2, dtype=bool)
    computed[reached] = True
    return computed[:n] & kept


def computed_after_saving(problem: Problem, computed: np.ndarray, members) -> np.ndarray:
    """computed_in_backward(problem, saved | members), given ``computed``,
    computed_in_backward(problem, saved): ``computed`` less the members and
    the values only they kept computed. Those lie up the chains the members
    are made from: walked from their inputs, highest-numbered first
    (forward values are numbered in program order, so every reader of a
    value on the chain is settled ahead of it), a value stays computed where
    backward reads it or a value still computed does. The greedy fill
    weighs every move so, since a search over the whole graph per move
    would take most of each move's time on a deep graph
    (`fxckpt bench --suite solvers`)."""
    out = computed.copy()
    members = [int(m) for m in members]
    out[members] = False
    indptr, indices = problem.reader_lists
    needed, parents = problem.needed, problem.parents
    waiting = [-int(p) for m in members for p in parents[m] if out[p]]
    heapq.heapify(waiting)
    settled: set[int] = set()
    while waiting:
        p = -heapq.heappop(waiting)
        if p in settled:
            continue
        settled.add(p)
        if needed[p] or out[indices[indptr[p]:indptr[p + 1]]].any():
            continue
        out[p] = False
        for q in parents[p]:
            if out[q]:
                heapq.heappush(waiting, -int(q))
    return out


def read_in_backward(problem: Problem, saved: np.ndarray) -> np.ndarray:
    """What backward reads under ``saved``, directly or to recompute: saved
    values outside it are not worth holding."""
    read = problem.needed.copy()
    for i in np.flatnonzero(computed_in_backward(problem, saved)):
        read[problem.parents[i]] = True
    return read


def _blocks(forward, parents, pattern: re.Pattern = _BLOCK) -> np.ndarray:
    """The repeated block (layer) of every forward value, -1 for none
    (``pattern``: what of a module path names the block).

    A value's block comes from the module that owns its op (for nodes
    AOTAutograd adds without a module stack of their own, the module of the
    forward op they serve). Ops of the compiled module's own code and graph
    inputs belong to no block. Any other value with no module at all takes
    the block its inputs agree on, else the one its users agree on, as it
    would run inside a checkpoint around that block."""
    n = len(forward)
    blocks: dict[str, int] = {}
    block = np.full(n, -1)
    unowned = []
    for i, node in enumerate(forward):
        match = pattern.match(node.owner_module_path)
        if match:
            block[i] = blocks.setdefault(match.group(1), len(blocks))
        elif not node.owner_module_path and not node.is_input and not node.at_root:
            unowned.append(i)
    users: list[list[int]] = [[] for _ in range(n)]
    for i, inputs in enumerate(parents):
        for j in inputs:
            users[j].append(i)
    for i in unowned:
        block[i] = _agreed(block[parents[i]].tolist())
    for i in reversed(unowned):
        if block[i] < 0:
            block[i] = _agreed(block[users[i]].tolist())
    return block


def _agreed(blocks: list[int]) -> int:
    """The one block ``blocks`` name (ignoring -1), else -1 (a set, not
    np.unique: a few thousand values have a handful of inputs each)."""
    found = {b for b in blocks if b >= 0}
    return found.pop() if len(found) == 1 else -1


def _unmaterialized(profile: Profile, forward) -> np.ndarray:
    """Per forward value: pointwise, not random, and every reader (forward
    and backward) pointwise too -- what torch's partitioner recomputes when it
    is free to (a value some reader needs materialised is banned there)."""
    readers: dict[str, list] = {}
    for node in profile.nodes.values():
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    return np.array([node.is_pointwise and not node.is_random and bool(readers.get(node.name))
                     and all(r.is_pointwise for r in readers[node.name])
                     and node.name not in profile.backward_outputs
                     and node.name not in profile.forward_outputs
                     for node in forward], dtype=bool)


def build_problem(profile: Profile, tags: dict[str, Tag], *,
                  bandwidth: float | None = None, fuses: bool = False) -> Problem:
    """``bandwidth``: bytes per second one way between device and host,
    which prices offload; needed only when some value is tagged *_CPU_OFFLOAD.
    ``fuses``: the compiler inlines pointwise code (Inductor): then constant
    fills are never saved (``kept_constant``)."""
    forward = profile.forward_nodes()
    names = tuple(n.name for n in forward)
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    parents = tuple(np.array([index[p] for p in node.inputs if p in index], dtype=np.int64)
                    for node in forward)
    ran_forward = run_in_forward(profile, frozenset())
    size, cost, replay = np.zeros(n), np.zeros(n), np.zeros(n)
    can_save, can_recompute = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    prefer_save, prefer_recompute = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    hint_save, hint_recompute = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    can_offload, must_offload = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    block = _blocks(forward, parents)
    for i, node in enumerate(forward):
        owner = profile.nodes[node.storage]
        size[i] = 0.0 if owner.is_static else float(owner.bytes)
        # Values only backward reads run once wherever they run: no extra cost.
        cost[i] = node.cost if node.name in ran_forward else 0.0
        replay[i] = node.replay_bytes
        policy, origin = tags[node.name].policy, tags[node.name].origin
        can_save[i] = ((node.is_tensor or node.is_symbolic) and not node.is_mutated_input
                       and policy != CheckpointPolicy.MUST_RECOMPUTE)
        can_recompute[i] = (node.recomputable and not node.is_input
                            and policy not in _MUST_KEEP)
        can_offload[i] = policy in _OFFLOAD and can_save[i] and size[i] > 0
        must_offload[i] = can_offload[i] and policy == CheckpointPolicy.MUST_CPU_OFFLOAD
        hint_save[i] = policy in _PREFER_KEEP
        hint_recompute[i] = policy == CheckpointPolicy.PREFER_RECOMPUTE
        if origin != Origin.DEFAULT:
            # PREFER_CPU_OFFLOAD carries no penalty: under a budget, keeping
            # the value on the device, offloading it and recomputing it are
            # priced against each other (memory, transfer time, recompute).
            prefer_save[i] = policy == CheckpointPolicy.PREFER_SAVE
            prefer_recompute[i] = hint_recompute[i]
    if can_offload.any() and not bandwidth:
        raise ValueError("values are tagged for CPU offload: build_problem needs the "
                         "device-host bandwidth that prices it")
    transfer = 2.0 * size / bandwidth if can_offload.any() else np.zeros(n)
    needed = np.array([name in profile.needed_by_backward for name in names])
    stages = stage_model(profile, names, index, size)
    # While no plan says otherwise, guess that values a default tag would
    # recompute (views, pointwise) are the ones recomputed chains run through.
    stages["through"] = hint_recompute | ~can_save
    stages["stage_recomputed"], stages["stage_saved"] = stages["lifetimes"].rows(
        parents, stages["through"], stages["stage_saved"])
    return Problem(names=names, parents=parents, size=size, cost=cost, replay=replay,
                   needed=needed, can_save=can_save, can_recompute=can_recompute,
                   prefer_save=prefer_save, prefer_recompute=prefer_recompute,
                   hint_save=hint_save, hint_recompute=hint_recompute, block=block,
                   can_offload=can_offload, must_offload=must_offload,
                   transfer=transfer, bandwidth=bandwidth if can_offload.any() else None,
                   remat=remat_classes(profile, index),
                   part=_blocks(forward, parents, _PART),
                   unmaterialized=_unmaterialized(profile, forward),
                   constant_fills=default_constant_fills(profile, tags, forward) if fuses else None, **stages)



def to_decision(problem: Problem, saved: np.ndarray, recomputed: np.ndarray,
                offloaded: np.ndarray | None = None, *,
                solver: str, seconds: float, gap: float | None,
                budget_bytes: int | None) -> Decision:
    if problem.constant_fills is not None and (saved & problem.constant_fills).any():
        # Made again in backward rather than kept: it has no inputs to keep.
        moved = saved & problem.constant_fills
        saved, recomputed = saved & ~moved, recomputed | moved
    if offloaded is None:
        offloaded = problem.tagged_offload(saved)
    overrides = tuple(_override(problem, i, recomputed[i])
                      for i in problem.overrides(saved, recomputed, offloaded))
    return Decision(
        saved=frozenset(problem.names[i] for i in np.flatnonzero(saved)),
        recomputed=frozenset(problem.names[i] for i in np.flatnonzero(recomputed)),
        solver=solver, solve_seconds=seconds, gap=gap, overrides=overrides,
        budget_bytes=budget_bytes,
        offloaded=frozenset(problem.names[i] for i in np.flatnonzero(offloaded)),
        offload_bandwidth=problem.bandwidth)


def _override(problem: Problem, i: int, recomputed: bool) -> str:
    name = problem.names[i]
    if problem.can_offload[i]:
        transfer = f"moving it to host and back costs {problem.transfer[i] * 1e6:.1f} us"
        if recomputed:
            return (f"{name}: PREFER_CPU_OFFLOAD not followed, recomputed "
                    f"({problem.cost[i] * 1e6:.1f} us) where {transfer}")
        return (f"{name}: PREFER_CPU_OFFLOAD not followed, kept on the device: the "
                f"budget has room for it and {transfer}")
    return (f"{name}: "
            + ("PREFER_SAVE overridden, recomputed" if recomputed
               else "PREFER_RECOMPUTE overridden, saved")
            + " to meet the budget")

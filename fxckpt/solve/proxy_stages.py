"""The memory proxy's stages: where a Problem measures live bytes.

A stage is a moment of the step (a forward or a backward node); at each, the
proxy counts what is live whatever the plan (``stage_base``: backward's own
temporaries and gradients, forward values in flight) and, per forward value,
whether saving it (``stage_saved``) or recomputing it (``stage_recomputed``)
adds its bytes there. A bounded set: the end of forward, the start of
backward, and in each phase ``MAX_STAGES // 4`` of its heaviest moments and
as many evenly spaced ones (in backward, the heaviest by each of two
weightings: at most ``5 * MAX_STAGES // 4 + 2`` stages in all).
solve/problem.py's docstring gives the model's formulas.

In backward, "heaviest" is taken twice: by the base, and by the base plus
the forward values a plan saving everything still holds there. Backward
frees forward's values as it runs, so by the base alone the heaviest
stages are late ones, while most plans peak early, where a proxy without
a stage reads plans of different exact peaks alike; the second weighting
holds the backward peak of saving everything (tests/test_stage_pick.py).
Plans that recompute most peak late, where the base is heavy, so the
second weighting alone would raise the floor.

``Lifetimes`` makes the recompute rows from which values recomputed chains
run through, so that Problem.refined can redo them as plans show where the
guess is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fxckpt.solve.common import run_in_forward
from fxckpt.types import BACKWARD, FORWARD, Profile, point

MAX_STAGES = 64


def stage_model(profile: Profile, names, index, size) -> dict:
    """The proxy's stages for the forward values ``names`` (``index``:
    name -> position; ``size``: bytes each holds if saved), as Problem's
    fields: stage_saved, stage_base, stage_names and the Lifetimes that
    make stage_recomputed."""
    nodes = list(profile.nodes.values())
    n = len(names)
    fwd_pos = {name: t for t, name in enumerate(names)}
    backward = [node for node in nodes if node.phase == BACKWARD]
    bwd_pos = {node.name: k for k, node in enumerate(backward)}
    # Python lists while they are filled one element at a time (numpy's
    # per-element reads and writes cost more), arrays after.
    last_fwd = list(range(n))
    first_bwd = [len(backward)] * n
    last_bwd = [-1] * n
    # A forward-side node the forward outputs do not need (a transpose or
    # detach AOTAutograd makes for backward, placed after the loss) runs in
    # forward only if saved: its reads do not hold its inputs through forward.
    runs_in_forward = run_in_forward(profile, frozenset())
    reads: list[list[int]] = [[] for _ in range(n)]
    for node in nodes:
        for parent in node.inputs:
            if parent not in index:
                continue
            i = index[parent]
            if node.phase == BACKWARD:
                reads[i].append(bwd_pos[node.name])
                first_bwd[i] = min(first_bwd[i], bwd_pos[node.name])
                last_bwd[i] = max(last_bwd[i], bwd_pos[node.name])
            elif node.name in runs_in_forward:
                last_fwd[i] = max(last_fwd[i], fwd_pos[node.name])
    outputs = {index[o] for o in profile.forward_outputs if o in index}
    for i in outputs:
        last_fwd[i] = n
    # Memory is held per storage: a storage lives from its first alias to the
    # last use of any alias (a view keeps its base alive).
    owners = [index.get(profile.nodes[name].storage, i) for i, name in enumerate(names)]
    for i, o in enumerate(owners):
        if names[i] in runs_in_forward:
            last_fwd[o] = max(last_fwd[o], last_fwd[i])
        last_bwd[o] = max(last_bwd[o], last_bwd[i])
    owner = np.array(owners, dtype=np.int64)
    is_owner = owner == np.arange(n)
    first_bwd = np.array(first_bwd, dtype=np.int64)
    last_fwd = np.array(last_fwd, dtype=np.int64)[owner]
    last_bwd = np.array(last_bwd, dtype=np.int64)[owner]
    base_fwd = _live_curve(n, [(t, int(last_fwd[t]), size[t]) for t in range(n) if is_owner[t]])
    base_fwd += np.array([profile.nodes[name].workspace for name in names], dtype=float)
    base_bwd = _backward_base(profile, backward, bwd_pos)
    held = sum(size[i] for i in outputs)
    # Backward's stages are picked by the base, and by the base plus what
    # saving everything would hold there (module docstring).
    saved_all = _live_curve(len(backward), [(0, int(last_bwd[i]), size[i]) for i in range(n)
                                             if is_owner[i] and last_bwd[i] >= 0])
    stages = _pick_stages(base_fwd, base_bwd + held, base_bwd + held + saved_all)
    rows_saved, base, labels = [], [], []
    for phase, t in stages:
        if phase == "forward":
            # A saved value holds its storage from the storage's creation
            # (a saved view made late keeps its base alive from the start).
            rows_saved.append((owner <= t) & (last_fwd < t))
            base.append(base_fwd[t])
            labels.append(point(FORWARD, names[t]))
        else:
            rows_saved.append(last_bwd >= t)
            base.append(base_bwd[t] + held)
            labels.append(point(BACKWARD, backward[t].name))
    shape = (len(stages), n)
    backward_stages = np.array([t if phase == "backward" else -1 for phase, t in stages])
    return dict(
        stage_saved=np.array(rows_saved, dtype=float).reshape(shape),
        stage_base=np.array(base, dtype=float), stage_names=tuple(labels),
        lifetimes=Lifetimes(first_bwd, owner, is_owner, last_bwd, backward_stages,
                            tuple(np.array(sorted(set(r)), dtype=np.int64) for r in reads),
                            steps=len(backward), step_base=base_bwd + held,
                            step_names=tuple(node.name for node in backward)))


@dataclass(frozen=True)
class Lifetimes:
    """When recomputed storages live in backward, given which values chains
    of recomputation run through."""

    first_bwd: np.ndarray        # first backward step reading each value (n_bwd if none)
    owner: np.ndarray            # index of the value owning each value's storage
    is_owner: np.ndarray
    last_bwd: np.ndarray         # last backward step reading the storage (-1 if none)
    stages: np.ndarray           # backward step of each stage row (-1: a forward stage)
    reads: tuple = ()            # backward steps reading each value directly, ascending
    steps: int = 0               # backward's steps
    # Every backward step's base (what is live whatever the plan) and node
    # name, for stages added later (Problem.with_stages).
    step_base: np.ndarray | None = None
    step_names: tuple[str, ...] = ()

    def first_need(self, parents, through: np.ndarray) -> np.ndarray:
        """The backward step at which each value is first needed: read by
        backward, or (a value recomputed only to feed another recompute) when
        the first of its readers in ``through`` is needed."""
        first_need = self.first_bwd.copy()
        for i in range(len(first_need) - 1, -1, -1):
            if through[i]:
                for j in parents[i]:
                    first_need[j] = min(first_need[j], first_need[i])
        return first_need

    def rows(self, parents, through: np.ndarray, stage_saved: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        """(stage_recomputed, stage_saved) given which values recompute
        chains run through; ``stage_saved``'s forward rows are kept."""
        first_need = self.first_need(parents, through)
        return (self._recompute_rows(first_need.copy()),
                self._saved_rows(first_need, parents, through, stage_saved))

    def _recompute_rows(self, first_need: np.ndarray) -> np.ndarray:
        n = len(self.first_bwd)
        for i in range(n):
            o = self.owner[i]
            first_need[o] = min(first_need[o], first_need[i])
        first_need = first_need[self.owner]
        end = np.maximum(self.last_bwd, first_need)
        rows = [(self.is_owner & (first_need <= t) & (end >= t)) if t >= 0
                else np.zeros(n, dtype=bool) for t in self.stages]
        return np.array(rows, dtype=float).reshape(len(self.stages), n)

    def _saved_rows(self, first_need: np.ndarray, parents, through: np.ndarray,
                    rows: np.ndarray) -> np.ndarray:
        """``rows`` with backward stages where a saved value is held up to
        the last recompute in ``through`` that reads it (at that
        recompute's first need), where that is after backward's last direct
        read of its storage."""
        n = len(self.first_bwd)
        read_by_copy = np.full(n, -1)
        for i in range(n):
            if through[i] and first_need[i] < self.steps:
                for j in parents[i]:
                    read_by_copy[j] = max(read_by_copy[j], first_need[i])
        held = np.full(n, -1)
        np.maximum.at(held, self.owner, read_by_copy)
        end = np.maximum(self.last_bwd, held[self.owner])
        extended = rows.copy()
        for k, t in enumerate(self.stages):
            if t >= 0:
                extended[k] = end >= t
        return extended


def _backward_base(profile: Profile, backward, bwd_pos) -> np.ndarray:
    """Bytes backward's own storages hold at each backward step; a storage
    nothing reads afterwards (a gradient) is kept to the end."""
    end = len(backward)
    last_read: dict[str, int] = {}
    for k, node in enumerate(backward):
        for parent in node.inputs:
            if parent in bwd_pos:
                owner = profile.nodes[parent].storage
                last_read[owner] = max(last_read.get(owner, -1), k)
    for name in profile.backward_outputs:       # gradients outlive the graph
        last_read[profile.nodes[name].storage] = end
    intervals = [(k, last_read.get(node.name, end), float(node.bytes))
                 for k, node in enumerate(backward) if node.storage == node.name]
    scratch = np.array([float(node.workspace) for node in backward])
    return _live_curve(end, intervals) + scratch


def _live_curve(length: int, intervals) -> np.ndarray:
    """Bytes live at each position given (start, end, bytes) intervals."""
    delta = np.zeros(length + 2)
    for start, end, nbytes in intervals:
        delta[start] += nbytes
        delta[min(end, length) + 1] -= nbytes
    return np.cumsum(delta)[:length]


def _pick_stages(base_fwd: np.ndarray, base_bwd: np.ndarray,
                 saving_bwd: np.ndarray) -> list[tuple[str, int]]:
    """A bounded set of stages: the end of forward, the start of backward, the
    heaviest stages of each phase and evenly spaced ones between them; in
    backward, the heaviest both by the base and by ``saving_bwd`` (the base
    plus what saving everything holds)."""
    stages: set[tuple[str, int]] = set()
    budget = MAX_STAGES // 2
    for phase, curves in (("forward", (base_fwd,)), ("backward", (base_bwd, saving_bwd))):
        length = len(curves[0])
        if not length:
            continue
        for curve in curves:
            stages.update((phase, int(t)) for t in np.argsort(-curve)[: budget // 2])
        stages.update((phase, int(t)) for t in np.linspace(0, length - 1,
                                                           budget // 2).astype(int))
        stages.add((phase, length - 1 if phase == "forward" else 0))
    return sorted(stages)

"""The walk of a schedule model's plan (memory/schedule.py): a sequence of
keys -- the joint graph's nodes by index, and the nodes a rewrite adds
(``Key``: copies of recomputed values and the generator states they
replay) -- walked with memory/model.py's rules on arrays (memory/walk.py):
which storages each step makes and reads, what Inductor would inline, and
the names the rewritten graph gives the nodes (a peak's place).

``KeyWalk`` is ScheduleModel's half that walks; the other half
(memory/schedule.py) replays the rewrite into such sequences. It reads the
model's per-node tables (``nodes``, ``storages``, ``workspace``, ...), set
up by ScheduleModel, and each plan's copies' storages (``fresh``).
"""

from __future__ import annotations

import numpy as np

from fxckpt.memory.model import inlined_keys
from fxckpt.memory.walk import Steps, Walk, advance
from fxckpt.types import copy_recomputed_name, recomputed_name


class Key:
    """A node the rewrite adds: a copy of recomputed value ``node``
    ("clone" the last, "copy" number ``j`` an earlier one) or the generator
    state forward saves for it ("state"). One object each for the model's
    life (ScheduleModel's clone_keys, state_keys, _copies_of), hashed and
    compared by identity: cheaper than tuples in the sets and dicts each
    plan fills."""

    __slots__ = ("kind", "node", "j")

    def __init__(self, kind: str, node: int, j: int | None) -> None:
        self.kind, self.node, self.j = kind, node, j

    def __repr__(self) -> str:
        return f"Key({self.kind!r}, {self.node}, {self.j})"


class KeyWalk:
    """The walk half of ScheduleModel (module docstring)."""

    def _name(self, key, pairs) -> str:
        """The node's name in the rewritten graph."""
        if key.__class__ is Key:
            name = self.nodes[key.node].name
            return copy_recomputed_name(name, key.j) if key.kind == "copy" \
                else recomputed_name(name)
        if key in pairs:  # named by FX as the rewrite creates them, in order
            k = sorted(pairs).index(key)
            return "run_and_save_rng_state" + (f"_{k}" if k else "")
        return self.nodes[key].name

    def _kind(self, key) -> str:
        return "op" if key.__class__ is Key and key.kind != "state" else \
            "state" if key.__class__ is Key else self.nodes[key].kind

    def _impure(self, key, random: bool, pairs: set) -> bool:
        """Kept by dead-code elimination (``random``: FX's default, random
        ops kept) or by the backward schedule (random ops dropped). A random
        op forward replaces by run_and_save_rng_state is pure."""
        if key.__class__ is Key:
            return random and self.nodes[key.node].state_bytes > 0 and self.replay_impure
        if key in pairs:
            return self.pair_impure
        node = self.nodes[key]
        return node.impure if random else node.side_effect

    def _impure_among(self, keys: list, random: bool, pairs: set) -> list:
        """The keys ``_impure`` says are kept, in order (sets, not a call
        per key: most keys are pure)."""
        ids = self.impure if random else self.side_effect
        replays = random and self.replay_impure
        return [k for k in keys
                if (k.__class__ is Key and replays and self.nodes[k.node].state_bytes > 0)
                or (k in pairs and self.pair_impure) or (k in ids and k not in pairs)]

    def _inlined(self, sequence: list, inputs: dict, outputs, pairs: set,
                 placeholders: set = frozenset()) -> set:
        """The keys of one graph's ops (``sequence`` without its
        ``placeholders``, in order) that Inductor computes inside their
        readers (memory.inlined_keys, as memory/model.py applies it to the
        rewritten graph), or none unless fused. A random op forward runs as
        run_and_save_rng_state, and its copies run by run_with_rng_state,
        are calls of their own, never inlined."""
        if not self.fused:
            return set()
        nodes = self.nodes
        ops = [k for k in sequence if k not in placeholders]
        within = set(ops)
        users: dict = {}
        for key in ops:
            for a in inputs.get(key, ()):
                if a in within:
                    users.setdefault(a, []).append(key)

        def node_of(key):
            return nodes[key.node] if key.__class__ is Key else nodes[key]

        def fuses(key):
            if key.__class__ is Key:
                return key.kind != "state" and node_of(key).fuses and not node_of(key).state_bytes
            return key not in pairs and nodes[key].fuses

        return inlined_keys(
            ops, inputs=lambda k: inputs.get(k, ()),
            users=lambda k: users.get(k, ()), outputs=set(outputs), fuses=fuses,
            reduction=lambda k: not (k.__class__ is Key and k.kind == "state")
            and node_of(k).reduction,
            op=lambda k: node_of(k).op, cpu=lambda k: node_of(k).cpu)

    def _storages(self, key) -> tuple:
        """A key's storages: (reference, bytes) each."""
        if key.__class__ is Key and key.kind == "state":
            return ((-1 - key.node, self.nodes[key.node].state_device_bytes),)
        if key.__class__ is Key:  # a copy or the clone
            return self.fresh[key]
        return self.nodes[key].storages

    def _refs(self, keys) -> set:
        return {ref for k in keys for ref, _ in self._storages(k)}

    def _allocate(self, key, walk: Walk, extra=(), storages=None) -> None:
        node = self.nodes[key.node if key.__class__ is Key else key]
        if not node.counted:
            return
        found = self._storages(key) if storages is None else storages
        for ref, nbytes in found + tuple(extra):
            if ref not in walk.live and ref not in walk.not_counted:
                walk.live[ref] = nbytes
                walk.total += nbytes

    def _run(self, sequence, reads: dict, keep: set, walk: Walk, phase: str,
             placeholders: set, pairs: set, inlined: set = frozenset()) -> int | None:
        """memory/model.py's walk of one graph (memory/walk.py, on arrays);
        ``reads``: the storages read by each key whose reads are not the
        joint graph's (``_reads`` of its inputs; a Key not in it reads
        none); ``pairs``: random nodes forward runs as
        run_and_save_rng_state, allocating their generator state;
        ``inlined``: keys never allocated (fused). Returns the step of
        ``sequence`` where the peak grew to its new height (None: it did
        not grow)."""
        n = len(sequence)
        if not n:
            return
        # Per step: its joint node (a Key: -1 - its node), what it adds
        # while it runs, whether it allocates.
        at = np.fromiter([key if key.__class__ is int else -1 - key.node for key in sequence],
                         np.int64, n)
        copy = at < 0
        node = np.where(copy, -1 - at, at)
        extra = self.workspace[node] + np.where(copy, self.state_device[node], 0)
        keys = np.flatnonzero(copy).tolist()
        if placeholders:
            extra[self._positions(at, copy, keys, sequence, placeholders)] = 0
        allocates = self.counted[node]
        if inlined:
            allocates &= ~np.fromiter(map(inlined.__contains__, sequence), bool, n)
        # Storages named and read: the joint graph's rows (memory.walk.Rows)
        # but for copies and generator states (self.fresh), pairs (their
        # state besides), and keys whose reads changed.
        fresh = self.fresh
        named = {p: fresh[sequence[p]] for p in keys}
        for p in self._positions(at, copy, (), sequence, pairs):
            named[p] = self.storages[at[p]] + ((-1 - int(at[p]), self.state_device[at[p]]),)
        named_at, ref, nbytes = self.named_rows.gather(at, named)
        read = {p: reads.get(sequence[p], ()) for p in keys}
        read.update((p, reads[sequence[p]])
                    for p in self._positions(at, copy, (), sequence, reads))
        read_at, read_ref = self.read_rows.gather(at, read)
        peaked = advance(walk, Steps(
            count=n, extra=extra, allocates=allocates, ref=ref, nbytes=nbytes,
            named_at=named_at, read_ref=read_ref, read_at=read_at,
            keep=np.fromiter(keep, np.int64, len(keep)), offset=self.ref_offset,
            size=self.ref_offset + self.first_fresh_ref + len(self.fresh_refs)))
        if peaked is not None:
            walk.peak_at = f"{phase}:{self._name(sequence[peaked], pairs)}"
        return peaked

    @staticmethod
    def _positions(at: np.ndarray, copy: np.ndarray, keys: list, sequence, among) -> list:
        """The steps of ``sequence`` whose key is in ``among``: joint nodes
        found by numpy (``at``, ``copy`` as _run has them), then those of
        the Key steps ``keys``."""
        ints = [k for k in among if k.__class__ is int]
        found = np.flatnonzero(np.isin(at, ints) & ~copy).tolist() if ints else []
        return found + [p for p in keys if sequence[p] in among]

"""memory/model.py's walk of one graph, on arrays: bytes live at each step.

The schedule model (memory/schedule.py) replays a plan's rewritten graphs as
sequences of steps without building them; this module walks such a sequence
with the memory model's rules, given as numbers: which storages each step
names (and their bytes), which it reads, what it adds while it runs
(workspace), whether it allocates. A storage is live from the step that
first allocates it to its last reader, or, where nothing reads it, to the
step that made it; storages in ``keep`` live to the end. The walk goes on
from the state another walk left (``Walk``): a graph's inputs are the
previous graph's survivors.

Walked step by step (allocate what the step names, check the peak, free
what it last read), every storage has at most two stretches live: from its
first allocation, or from the start where it is live already, to its free;
and, if it is allocated again after that free, to the end. Each is found
with numpy, their bytes summed per step, and the peak taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np


@dataclass
class Walk:
    """What is live between graphs: storages (by reference) and their bytes,
    storages never counted (graph inputs the caller owns), the peak so far,
    where it was, and the bytes live now."""

    live: dict = field(default_factory=dict)
    not_counted: set = field(default_factory=set)
    peak: int = 0
    peak_at: str = ""
    total: int = 0                  # sum of live's bytes

    def copy(self) -> "Walk":
        return Walk(dict(self.live), set(self.not_counted), self.peak, self.peak_at,
                    self.total)


@dataclass(frozen=True)
class Steps:
    """One graph's sequence of ``count`` steps, as arrays. Storage
    references are shifted by ``offset`` to index arrays of ``size``.

    ``extra``: bytes a step adds while it runs; ``allocates``: whether it
    allocates what it names; ``ref``, ``nbytes``, ``named_at``: each
    storage named, its bytes there and the step naming it, in order;
    ``read_ref``, ``read_at``: each storage read and the step reading it;
    ``keep``: references live to the end whoever reads them."""

    count: int
    extra: np.ndarray
    allocates: np.ndarray
    ref: np.ndarray
    nbytes: np.ndarray
    named_at: np.ndarray
    read_ref: np.ndarray
    read_at: np.ndarray
    keep: np.ndarray
    offset: int
    size: int


def advance(walk: Walk, steps: Steps) -> int | None:
    """Walk ``steps`` on from ``walk`` (updated in place); the step where a
    new peak was reached, or None where the peak did not grow."""
    n, size, offset = steps.count, steps.size, steps.offset
    ref, nbytes, named_at = steps.ref + offset, steps.nbytes, steps.named_at
    # Each storage is freed after its last reader, or where none reads it
    # its first producer, unless kept (never: n).
    free = np.full(size, n, np.int64)
    np.minimum.at(free, ref, named_at)
    last_read = np.full(size, -1, np.int64)
    np.maximum.at(last_read, steps.read_ref + offset, steps.read_at)
    free = np.where(last_read >= 0, last_read, free)
    free[steps.keep + offset] = n
    # Allocations tried: storages a counted step names, outside
    # not_counted; the first makes a storage live (its bytes counted).
    tried = steps.allocates[named_at] & ~_mask(walk.not_counted, offset, size)[ref]
    t_ref, t_at, t_bytes = ref[tried], named_at[tried], nbytes[tried]
    position = np.arange(len(t_ref))
    none = len(t_ref)
    first = np.full(size, none, np.int64)
    np.minimum.at(first, t_ref, position)
    live0 = _indices(walk.live, offset)
    begin = np.full(size, n, np.int64)
    held = np.zeros(size, np.int64)   # bytes of the first stretch
    made = (first < none) & ~_mask(walk.live, offset, size)
    begin[made] = t_at[first[made]]
    held[made] = t_bytes[first[made]]
    begin[live0] = -1
    held[live0] = np.fromiter(walk.live.values(), np.int64, len(walk.live))
    alive = made.copy()
    alive[live0] = True
    # The first stretch ends at the free if that comes after its start.
    ends = alive & (free < n) & (free >= begin)
    # Allocated again after the free: live to the end.
    after = ends[t_ref] & (t_at > free[t_ref])
    second = np.full(size, none, np.int64)
    np.minimum.at(second, t_ref[after], position[after])
    again = second < none
    change = np.zeros(n + 1, np.int64)
    np.add.at(change, begin[made], held[made])
    np.add.at(change, free[ends] + 1, -held[ends])
    np.add.at(change, t_at[second[again]], t_bytes[second[again]])
    level = walk.total + np.cumsum(change)
    now = level[:n] + steps.extra
    top = int(now.max())
    peaked = None
    if top > walk.peak:
        walk.peak = top
        peaked = int(now.argmax())
    walk.total = int(level[n])
    # What is live at the end, with the bytes it was allocated with.
    last_bytes = np.where(again, t_bytes[np.minimum(second, none - 1)], held) if none \
        else held
    remains = np.flatnonzero((alive & ~ends) | again)
    walk.live = dict(zip((remains - offset).tolist(), last_bytes[remains].tolist()))
    return peaked


def _indices(refs, offset: int) -> np.ndarray:
    """Storage references as indices into the walk's arrays."""
    return np.fromiter(refs, np.int64, len(refs)) + offset


def _mask(refs, offset: int, size: int) -> np.ndarray:
    """Which of ``size`` indices are among ``refs``."""
    mask = np.zeros(size, bool)
    mask[_indices(refs, offset)] = True
    return mask


@dataclass(frozen=True)
class Rows:
    """Variable-length rows of numbers, one per joint node (CSR): row ``i``
    holds entries ``ptr[i]:ptr[i + 1]`` of each of ``columns``."""

    ptr: np.ndarray
    columns: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, rows: list[tuple], width: int) -> "Rows":
        """From each row's entries, tuples of ``width`` numbers (``width``
        1: the numbers themselves)."""
        ptr = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(row) for row in rows], out=ptr[1:])
        table = np.array([entry for row in rows for entry in row], np.int64).reshape(-1, width)
        return cls(ptr, tuple(table[:, k] for k in range(width)))

    def gather(self, rows: np.ndarray, own: dict[int, tuple]) -> tuple[np.ndarray, ...]:
        """The entries of a sequence of steps: step ``p`` has row
        ``rows[p]``, or where ``p`` is in ``own`` the entries ``own[p]``
        (as ``of`` takes them; a step whose row is negative must be). Returns each entry's step, then each
        column's entries, in step order. Most steps of a plan's graphs are
        joint nodes with the joint graph's rows: gathered by numpy, the
        rest read one by one."""
        n = len(rows)
        width = len(self.columns)
        safe = np.where(rows >= 0, rows, 0)
        counts = self.ptr[safe + 1] - self.ptr[safe]
        mine = np.fromiter(own, np.int64, len(own))
        counts[mine] = np.fromiter(map(len, own.values()), np.int64, len(own))
        at = np.repeat(np.arange(n), counts)
        first = np.cumsum(counts) - counts
        within = np.arange(len(at)) - first[at]
        theirs = np.ones(n, bool)
        theirs[mine] = False
        from_rows = theirs[at]
        source = self.ptr[safe[at[from_rows]]] + within[from_rows]
        columns = [np.empty(len(at), np.int64) for _ in range(width)]
        for column, values in zip(columns, self.columns):
            column[from_rows] = values[source]
        if own:
            entries = chain.from_iterable(map(own.__getitem__, sorted(own)))
            if width > 1:
                entries = chain.from_iterable(entries)
            table = np.fromiter(entries, np.int64, width * int((~from_rows).sum()))
            table = table.reshape(-1, width)
            for k, column in enumerate(columns):
                column[~from_rows] = table[:, k]
        return (at, *columns)

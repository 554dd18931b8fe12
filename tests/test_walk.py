"""memory/walk.py: the array walk against the rule it implements, walked
step by step (allocate what a step names, check the peak, free what it read
last), on random sequences."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fxckpt.memory.walk import Rows, Steps, Walk, advance

OFFSET = 3   # references run from -OFFSET (generator states are negative)


def _stepwise(walk: Walk, steps: Steps):
    """The rule, one step at a time: (peak, peak step or None, total, live)."""
    n = steps.count
    refs = set(steps.ref.tolist()) | set(walk.live) | set(steps.read_ref.tolist())
    free = {}
    for r in refs:
        reads = steps.read_at[steps.read_ref == r]
        named = steps.named_at[steps.ref == r]
        free[r] = int(reads.max()) if len(reads) else int(named.min()) if len(named) else n
    for r in steps.keep.tolist():
        free[r] = n
    live, total, peak, at = dict(walk.live), walk.total, walk.peak, None
    stretch = {r: 1 for r in live}     # 1: first stretch, 2: after a free
    ended = set()
    for i in range(n):
        if steps.allocates[i]:
            for r, b in zip(steps.ref[steps.named_at == i].tolist(),
                            steps.nbytes[steps.named_at == i].tolist()):
                if r in walk.not_counted or r in live:
                    continue
                if r in ended and stretch.get(r) == 2:
                    continue
                live[r] = b
                total += b
                stretch[r] = 2 if r in ended else 1
        now = total + int(steps.extra[i])
        if now > peak:
            peak, at = now, i
        for r, f in free.items():
            if f == i and r in live and stretch.get(r) == 1 and r not in ended:
                total -= live.pop(r)
                ended.add(r)
    return peak, at, total, live


@st.composite
def sequences(draw):
    n = draw(st.integers(1, 8))
    refs = st.integers(-OFFSET, 6)
    named = draw(st.lists(st.tuples(st.integers(0, n - 1), refs, st.integers(1, 50)),
                          max_size=12))
    named.sort(key=lambda t: t[0])
    # A reference has one size wherever it is named.
    size_of = {}
    named = [(at, r, size_of.setdefault(r, b)) for at, r, b in named]
    reads = sorted(draw(st.lists(st.tuples(st.integers(0, n - 1), refs), max_size=12)))
    live = draw(st.dictionaries(refs, st.integers(1, 50), max_size=3))
    live = {r: size_of.get(r, b) for r, b in live.items()}
    not_counted = draw(st.sets(refs, max_size=2)) - set(live)
    keep = sorted(draw(st.sets(refs, max_size=2)))
    steps = Steps(
        count=n, extra=np.array(draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))),
        allocates=np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        ref=np.array([r for _, r, _ in named], np.int64),
        nbytes=np.array([b for _, _, b in named], np.int64),
        named_at=np.array([a for a, _, _ in named], np.int64),
        read_ref=np.array([r for _, r in reads], np.int64),
        read_at=np.array([a for a, _ in reads], np.int64),
        keep=np.array(keep, np.int64), offset=OFFSET, size=OFFSET + 7)
    walk = Walk(live=live, not_counted=not_counted, peak=draw(st.integers(0, 60)),
                total=sum(live.values()))
    return walk, steps


@settings(max_examples=300, deadline=None)
@given(sequences())
def test_advance_is_the_stepwise_rule(case):
    walk, steps = case
    expected = _stepwise(walk.copy(), steps)
    peaked = advance(walk, steps)
    assert (walk.peak, peaked, walk.total, walk.live) == expected


def test_a_storage_freed_and_made_again_lives_to_the_end():
    # Step 0 makes storage 0 (10 B), step 1 reads it last, step 2 makes it again.
    steps = Steps(count=4, extra=np.zeros(4, np.int64), allocates=np.ones(4, bool),
                  ref=np.array([0, 0]), nbytes=np.array([10, 10]), named_at=np.array([0, 2]),
                  read_ref=np.array([0]), read_at=np.array([1]), keep=np.array([], np.int64),
                  offset=0, size=1)
    walk = Walk()
    assert advance(walk, steps) == 0
    assert (walk.peak, walk.total, walk.live) == (10, 10, {0: 10})


@st.composite
def gathers(draw):
    """Rows of (reference, bytes) entries per node, and a sequence of steps:
    nodes (by index) or -1 (a step not in the table), some with entries of
    their own."""
    entry = st.tuples(st.integers(-5, 40), st.integers(0, 1000))
    rows = draw(st.lists(st.lists(entry, max_size=3).map(tuple), min_size=1, max_size=6))
    steps = draw(st.lists(st.integers(-1, len(rows) - 1), max_size=10))
    own = {p: draw(st.lists(entry, max_size=3).map(tuple))
           for p, node in enumerate(steps) if node < 0 or draw(st.booleans())}
    return rows, steps, own


@settings(max_examples=300, deadline=None)
@given(gathers())
def test_rows_gather_is_the_steps_entries_in_order(case):
    rows, steps, own = case
    table = Rows.of(rows, 2)
    at, ref, nbytes = table.gather(np.array(steps, np.int64), own)
    expected = [(p, r, b) for p, node in enumerate(steps)
                for r, b in (own[p] if p in own else rows[node])]
    assert list(zip(at.tolist(), ref.tolist(), nbytes.tolist())) == expected
    # One column: the same rows' references alone.
    refs = Rows.of([tuple(r for r, _ in row) for row in rows], 1)
    at, ref = refs.gather(np.array(steps, np.int64),
                          {p: tuple(r for r, _ in entries) for p, entries in own.items()})
    assert list(zip(at.tolist(), ref.tolist())) == [(p, r) for p, r, _ in expected]

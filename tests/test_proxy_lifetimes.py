"""The memory proxy's lifetimes of saved values (fxckpt/solve/problem.py):
a saved value read only by a recompute is held until that recompute runs."""

from __future__ import annotations

import numpy as np
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.solve.problem import build_problem
from fxckpt.types import BACKWARD, FORWARD, NodeProfile, Profile, Tag


def _chain() -> tuple[Profile, dict[str, Tag]]:
    """x -> a -> b -> c (forward); backward b0..b4, where only b4 reads b
    and b0 reads c. Saving ``a`` and recomputing ``b`` holds ``a`` until b4."""
    nodes, tags = {}, {}

    def add(name, phase, inputs, nbytes, **kw):
        nodes[name] = NodeProfile(name=name, op="aten.op.default", phase=phase, inputs=inputs,
                                  bytes=nbytes, storage=name, cost=1e-4, **kw)

    add("x", FORWARD, (), 64, is_input=True, not_recomputable="graph input")
    tags["x"] = Tag(CheckpointPolicy.MUST_SAVE, "graph input", "op")
    for name, parent, nbytes in (("a", "x", 4096), ("b", "a", 1024), ("c", "b", 64)):
        add(name, FORWARD, (parent,), nbytes)
        tags[name] = Tag(None, "default", "default")
    add("tangents_1", BACKWARD, (), 64, is_input=True, not_recomputable="graph input")
    previous = "tangents_1"
    for k in range(5):
        reads = {0: ("c", previous), 4: ("b", previous)}.get(k, (previous,))
        add(f"b{k}", BACKWARD, reads, 256)
        previous = f"b{k}"
    profile = Profile(nodes=nodes, needed_by_backward=frozenset({"b", "c"}),
                      forward_outputs=("c",), backward_outputs=("b4",))
    return profile, tags


def test_a_saved_value_read_by_a_recompute_is_held_until_it_runs():
    profile, tags = _chain()
    problem = build_problem(profile, tags)
    index = {name: i for i, name in enumerate(problem.names)}
    saved = np.zeros(problem.n, dtype=bool)
    recomputed = np.zeros(problem.n, dtype=bool)
    saved[[index["x"], index["a"], index["c"]]] = True
    recomputed[index["b"]] = True
    refined = problem.refined(recomputed)
    backward = [k for k, label in enumerate(refined.stage_names)
                if label.startswith("backward:") and label != "backward:b4"]
    a = index["a"]
    # Backward steps before b4 (where b is recomputed from a): a is held.
    assert backward and all(refined.stage_saved[k, a] == 1 for k in backward)
    live = refined.stage_live(saved, recomputed)
    assert all(live[k] >= problem.size[a] for k in backward)

"""Inductor's fusion choices, one refused: horizontal fusion of recomputed ops.

Inductor fuses two kernels that share no producer and consumer when they
read a common buffer (``InductorChoices.can_fuse_horizontal``), and a fused
kernel runs where its earlier part was. In a planned backward, recomputed
ops read what the forward saved, as do kernels of other layers (the
weights, the random seeds, a causal mask): fused with those, a layer's
recomputation runs while an earlier layer's backward runs, and its values
are held from there, and the copies of a value recomputed more than once
(Decision.again) are made all at once. Measured on the zoo GPT's floor
plan: the compiled peak falls from 4,496,256 to 3,815,040 bytes with this
refused. Vertical (producer to consumer) fusion of recomputed ops is kept:
it moves nothing earlier than its consumer.
"""

from __future__ import annotations

import contextlib

from fxckpt.types import RECOMPUTED_SUFFIX


class RecomputeApart:
    """An Inductor choices handler: the one it wraps, but no horizontal
    fusion of a kernel holding a recomputed op (named by fxckpt's rewrite)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def can_fuse(self, scheduler, node1, node2, shared_data_score) -> bool:
        if moves_recomputation(scheduler, node1, node2):
            return False
        return self._inner.can_fuse(scheduler, node1, node2, shared_data_score)

    def can_fuse_horizontal(self, scheduler, node1, node2, shared_data_score) -> bool:
        if holds_recomputed(node1) or holds_recomputed(node2):
            return False
        return self._inner.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)


def moves_recomputation(scheduler, node1, node2) -> bool:
    """Whether fusing two scheduler nodes moves a recomputation: the later
    one reads values made between them (the fused kernel runs where the
    earlier one was, so those are made earlier, and the earlier node's
    results later), and a recomputed op is among the fused or the moved."""
    first, second = sorted((node1, node2), key=lambda node: node.min_order)
    moved = []
    for name in second.ancestors - first.ancestors:
        node = scheduler.name_to_fused_node.get(name)
        if node is not None and node is not first and node.min_order > first.max_order:
            moved.append(node)
    if not moved:
        return False
    return any(holds_recomputed(node) for node in (first, second, *moved))


def holds_recomputed(scheduler_node) -> bool:
    """Whether an Inductor scheduler node computes a recomputed value."""
    for part in scheduler_node.get_nodes():
        node = getattr(part, "node", None)
        origins = node.get_origins() if node is not None else ()
        if any(origin.name.endswith(RECOMPUTED_SUFFIX) for origin in origins):
            return True
    return False


@contextlib.contextmanager
def recompute_apart():
    """Inductor compiles inside this context refuse horizontal fusion of
    recomputed ops."""
    from torch._inductor.virtualized import V

    with V.set_choices_handler(RecomputeApart(V.choices)):
        yield

"""Inductor's fusion choices, some refused where they move recomputation.

Inductor fuses two kernels that share no producer and consumer when they
read a common buffer (``InductorChoices.can_fuse_horizontal``), and a fused
kernel runs where its earlier part was. In a planned backward, recomputed
ops read what the forward saved, as do kernels of other layers (the
weights, the random seeds, a causal mask): fused with those, a layer's
recomputation runs while an earlier layer's backward runs, and its values
are held from there, and the copies of a value recomputed more than once
(Decision.copy_steps) are made all at once. Measured on the zoo GPT's floor
plan: the compiled peak falls from 4,496,256 to 3,815,040 bytes with this
refused.

Any fusion (``InductorChoices.can_fuse``) also moves work: the fused kernel
runs after everything its later part reads, so what is made between the
two parts is made before the earlier part, and the earlier part runs
later. Where that involves a recomputed op and the earlier part, run
later, holds memory longer, it is refused (``moves_recomputation``).
Measured on the zoo floor plans (compiled peaks): ResNet 707,824 ->
642,288 bytes (two copies of a recomputed convolution no longer live at
once), GPT 3,454,592 -> 3,317,320 (recomputed attention probabilities no
longer made beside their gradient). A fusion that only delays a producer
whose one reader is the other part (a recomputed dropout mask) is kept:
the mask is then never stored.

Neither is refused where the plan is torch's own partition (the
runtime-optimal plan under Inductor, solve/runtime_optimal.py): Inductor
then compiles what torch.compile compiles, kernel for kernel. A refusal
changes a kernel's loops, and with them float summation order: on the zoo's
BatchNorm CNN the two sums of BatchNorm's backward, run in one loop by
torch, ran in two, and the first convolution's weight gradient differed
from torch.compile's in the last bit.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from fxckpt.compat.inductor import choices_wrapped
from fxckpt.types import RECOMPUTED_SUFFIX


class RecomputeApart:
    """An Inductor choices handler: the one it wraps, but no horizontal
    fusion of a kernel holding a recomputed op (named by fxckpt's rewrite),
    and no fusion that moves a recomputation where it holds more memory
    (``moves_recomputation``); both only while ``applies()`` says so (the
    plan being compiled is not torch's own partition)."""

    def __init__(self, inner, applies: Callable[[], bool] = lambda: True) -> None:
        self._inner = inner
        self._applies = applies

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def can_fuse(self, scheduler, node1, node2, shared_data_score) -> bool:
        if self._applies() and moves_recomputation(scheduler, node1, node2):
            return False
        return self._inner.can_fuse(scheduler, node1, node2, shared_data_score)

    def can_fuse_horizontal(self, scheduler, node1, node2, shared_data_score) -> bool:
        if self._applies() and (holds_recomputed(node1) or holds_recomputed(node2)):
            return False
        return self._inner.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)


def moves_recomputation(scheduler, node1, node2) -> bool:
    """Whether fusing two scheduler nodes moves a recomputation to where it
    holds more memory. A fused kernel runs where the earlier node was, after
    whatever the later one reads: values the later node reads that are made
    between the two are made first, and the earlier node runs after them.
    Refused where a recomputed op is among the fused or the moved and the
    earlier node, run later, holds memory longer: a buffer it is the last to
    read (the zoo ResNet's two copies of a recomputed convolution, live at
    once), or a value other kernels read (the zoo GPT's recomputed attention
    probabilities, made beside their gradient)."""
    first, second = sorted((node1, node2), key=lambda node: node.min_order)
    moved = []
    for name in second.ancestors - first.ancestors:
        node = scheduler.name_to_fused_node.get(name)
        if node is not None and node is not first and node.min_order > first.max_order:
            moved.append(node)
    if not moved or not any(holds_recomputed(node) for node in (first, second, *moved)):
        return False
    return _holds_longer_when_later(scheduler, first, second)


def _holds_longer_when_later(scheduler, first, second) -> bool:
    """Whether ``first`` run later holds memory longer: a value it makes that
    a kernel other than ``second`` reads, or a buffer it is the last to read
    (that ``second`` does not read)."""
    def group(user):
        return scheduler.name_to_fused_node.get(user.node.get_name())

    for buffer in first.get_outputs():
        if any(group(user) not in (None, first, second) for user in buffer.users):
            return True
    read_by_second = {dep.name for dep in second.read_writes.reads}
    for dep in first.read_writes.reads:
        buffer = scheduler.name_to_buf.get(dep.name)
        if buffer is None or dep.name in read_by_second:
            continue
        readers = [group(user) for user in buffer.users]
        if all(reader is first or (reader is not None and reader.max_order < first.min_order)
               for reader in readers):
            return True
    return False


def holds_recomputed(scheduler_node) -> bool:
    """Whether an Inductor scheduler node computes a recomputed value."""
    for part in scheduler_node.get_nodes():
        node = getattr(part, "node", None)
        origins = node.get_origins() if node is not None else ()
        if any(origin.name.endswith(RECOMPUTED_SUFFIX) for origin in origins):
            return True
    return False


@contextlib.contextmanager
def recompute_apart(applies: Callable[[], bool] = lambda: True):
    """Inductor compiles inside this context refuse the fusions
    ``RecomputeApart`` refuses, while ``applies()``."""
    with choices_wrapped(lambda choices: RecomputeApart(choices, applies)):
        yield

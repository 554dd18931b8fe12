"""Finding core attention in a graph's ops, for ``megatron_selective``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from fxckpt.ops import ATTENTION_OPS
from fxckpt.ops import is_matmul_op, op_packet
from fxckpt.policies.api import DEFER, P, Answer, OpCall

aten = torch.ops.aten


_SOFTMAX_OPS = frozenset({aten._softmax, aten._safe_softmax, aten.softmax})
_DROPOUT_OPS = frozenset({aten.native_dropout, aten.dropout})
_COPY_OPS = frozenset({aten.clone, aten._unsafe_view, aten._to_copy, aten.contiguous})
_MAX_PATH = 24   # ops between a matmul and its softmax; attention needs a handful


class AttentionDecider:
    """Finds core attention (scores matmul -> softmax -> dropout -> weighted
    sum) once the whole forward has been seen, for megatron_selective."""

    def __init__(self) -> None:
        self.ops: dict[str, Any] = {}
        self.inputs: dict[str, tuple[str, ...]] = {}
        self.users: dict[str, list[str]] = defaultdict(list)

    def __call__(self, call: OpCall) -> Answer:
        self.ops[call.name] = call.op
        self.inputs[call.name] = call.inputs
        for name in call.inputs:
            self.users[name].append(call.name)
        if op_packet(call.op) in ATTENTION_OPS | _SOFTMAX_OPS:
            return P.PREFER_RECOMPUTE
        # A view holds its base's bytes: saving the rest means saving values,
        # and a view of a recomputed softmax must not keep the softmax alive.
        return DEFER if getattr(call.op, "is_view", False) else P.PREFER_SAVE

    def finish(self) -> dict[str, Answer]:
        core: set[str] = set()
        softmaxes = [n for n, op in self.ops.items() if op_packet(op) in _SOFTMAX_OPS]
        for name in softmaxes:
            scores = self._path_to_matmul(name, self.inputs, _passes_before)
            weighted = self._path_to_matmul(name, self.users, _passes_after)
            if scores and weighted:
                core |= scores | weighted | {name}
        revised: dict[str, Answer] = {n: P.PREFER_RECOMPUTE for n in core}
        revised.update({n: P.PREFER_SAVE for n in softmaxes if n not in core})
        return revised

    def _path_to_matmul(self, start: str, edges, passes) -> set[str]:
        """Ops on the paths from ``start`` along ``edges`` through ops that
        ``passes`` admits to the first matmul, that matmul included."""
        on_path: set[str] = set()
        memo: dict[str, bool] = {}

        def reaches(name: str, depth: int) -> bool:
            if name in memo:
                return memo[name]
            memo[name] = False
            op = self.ops.get(name)
            if op is None or depth > _MAX_PATH:
                return False
            if name != start and is_matmul_op(op):
                found = True
            elif name == start or passes(op):
                found = any([reaches(n, depth + 1) for n in edges.get(name, ())])
            else:
                found = False
            memo[name] = found
            if found and name != start:
                on_path.add(name)
            return found

        reaches(start, 0)
        return on_path


def _passes_before(op) -> bool:
    """Ops between a score matmul and its softmax: views, scaling, masking, casts."""
    return (getattr(op, "is_view", False) or op_packet(op) in _COPY_OPS
            or torch.Tag.pointwise in getattr(op, "tags", ()))


def _passes_after(op) -> bool:
    return _passes_before(op) or op_packet(op) in _DROPOUT_OPS

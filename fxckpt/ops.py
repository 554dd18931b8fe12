"""What kind of op a node is: the one place that classifies ops."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fxckpt.compat.aot import partitioner_op_lists
from fxckpt.compat.ops import (HigherOrderOperator, OpOverload, is_impure, is_mutable,
                               overload_name, qualified_name, schema)
from fxckpt.types import RematKind

aten = torch.ops.aten

# Ops whose cost is dominated by arithmetic: the runtime-optimal plan never
# recomputes them, and policies such as "save matmuls" select them.
MATMUL_OPS = frozenset({
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.matmul, aten.linear,
    aten._scaled_mm, aten._int_mm,
})
ATTENTION_OPS = frozenset({
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._flash_attention_forward, aten._efficient_attention_forward,
})
CONV_OPS = frozenset({aten.convolution, aten._convolution, aten.conv2d, aten.conv1d,
                      aten.conv3d})
COMPUTE_INTENSIVE_OPS = MATMUL_OPS | ATTENTION_OPS | CONV_OPS
# Namespaces whose ops are pure functions of their inputs (random ones aside,
# which replay their RNG state). Ops from elsewhere (custom operators) run a
# second time only where the user asked for that: inside a
# torch.utils.checkpoint region, or under solver="per_block", which stands
# for one around each block (passes/profile.py).
PURE_NAMESPACES = frozenset({"aten", "prims", "fxckpt"})
SEED_DRAW = ("Inductor's seed draw (saved, a few bytes; the random ops it seeds are "
             "recomputed from it and replay exactly)")


def op_packet(op):
    """The overload packet of an op (aten.mm for aten.mm.default), or the op itself."""
    return getattr(op, "overloadpacket", op)


def is_matmul_op(op) -> bool:
    return op_packet(op) in MATMUL_OPS


def is_random_op(op) -> bool:
    return isinstance(op, OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


def packet(node: fx.Node):
    target = node.target
    if isinstance(target, OpOverload):
        return target.overloadpacket
    return None


def op_name(node: fx.Node) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op == "get_attr":
        return "constant"
    target = node.target
    if isinstance(target, OpOverload):
        return f"{target.namespace}.{schema(target).name.split('::')[-1]}.{overload_name(target)}"
    if target is operator.getitem:
        return f"getitem[{node.args[1]}]"
    return getattr(target, "__name__", str(target))


def is_view(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, OpOverload) and target.is_view


def is_pointwise(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, OpOverload) and torch.Tag.pointwise in target.tags


def is_random(node: fx.Node) -> bool:
    return is_random_op(node.target)


def is_seed_draw(node: fx.Node) -> bool:
    """Inductor's draw of seeds for its native random ops (``fallback_random``
    off): the ``inductor_random`` ops it feeds are pure functions of a seed, so
    saving the seeds replays them exactly."""
    # Matched by name: Inductor registers the op when it is first imported.
    target = node.target
    return (node.op == "call_function" and isinstance(target, OpOverload)
            and target.namespace == "prims" and target.__name__ == "inductor_seeds.default")


def is_compute_intensive(node: fx.Node) -> bool:
    return packet(node) in COMPUTE_INTENSIVE_OPS


def is_matmul(node: fx.Node) -> bool:
    return is_matmul_op(node.target)


def is_collective(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, OpOverload) and \
        target.namespace in ("_c10d_functional", "c10d_functional", "c10d", "_dtensor")


def is_custom_op(node: fx.Node) -> bool:
    """An operator from outside torch's and fxckpt's own namespaces
    (torch.library.custom_op, TORCH_LIBRARY)."""
    target = node.target
    return isinstance(target, OpOverload) and target.namespace not in PURE_NAMESPACES


def not_recomputable_reason(node: fx.Node, *, rerun_custom: bool = False) -> str:
    """Why this node's value cannot be computed a second time; "" if it can.
    An op overload's reason depends on the op alone (FX's purity test asks
    only a higher-order operator's arguments), unless it is random (its
    generator and device are the call's): ``PerOp(not_recomputable_reason,
    unless=is_random_op)`` reads it once per op. ``rerun_custom``: the user
    asked for this call to run again (a torch.utils.checkpoint region), so
    being a custom operator is no reason; mutating, side effects and
    randomness still are."""
    if node.op == "placeholder":
        return "graph input"
    if node.op != "call_function":
        return ""
    target = node.target
    if target is operator.getitem and isinstance(node.args[0], fx.Node):
        return not_recomputable_reason(node.args[0])
    if is_collective(node):
        return "collective communication (recomputing it would communicate again)"
    if isinstance(target, HigherOrderOperator):
        return f"higher-order op {target.name()} (fxckpt does not recompute it)"
    if isinstance(target, OpOverload):
        if is_mutable(target):
            return "mutates its input in place"
        if target.namespace not in PURE_NAMESPACES and not rerun_custom:
            return (f"custom op {target.namespace}::{schema(target).name.split('::')[-1]} "
                    "(fxckpt cannot know it is deterministic, so it runs it twice only "
                    "inside a torch.utils.checkpoint or fxckpt.checkpoint region, as "
                    "torch does)")
        if is_seed_draw(node):
            return SEED_DRAW
        if is_random(node):
            return _random_replay_obstacle(node)
    if is_impure(target, args=node.args, kwargs=node.kwargs, impure_random=False):
        return "has side effects"
    return ""


def _random_replay_obstacle(node: fx.Node) -> str:
    if node.kwargs.get("generator") is not None:
        return "random op with an explicit generator (its state cannot be replayed)"
    if random_op_device(node) is None:
        return "random op on an unknown device (its state cannot be replayed)"
    return ""


def random_op_device(node: fx.Node) -> torch.device | None:
    """The device whose generator a random op draws from."""
    device = node.kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.device
    return None


def source_line(node: fx.Node) -> str:
    """``file:line  code`` of the user's frame that produced this op."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            parts = lines[i].split('"')
            where = parts[1].rsplit("/", 1)[-1] if len(parts) > 1 else lines[i]
            lineno = lines[i].split("line ")[-1].split(",")[0]
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{where}:{lineno} {code}".strip()
    return ""


def module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return _clean_module_path(path)


def owner_module_path(node: fx.Node) -> str:
    """module_path, or for a node without a module stack (one AOTAutograd adds
    for backward: a transpose or detach of a saved value) the module of the
    forward op it serves."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    return _clean_module_path(list(stack.values())[-1][0])


def _clean_module_path(path: str) -> str:
    # Dynamo records paths such as "L['self'].blocks[0].attn"; users write "blocks.0.attn".
    for prefix in ("L['self'].", "L['self']", "self."):
        if path.startswith(prefix):
            path = path[len(prefix):]
    path = path.replace("[", ".").replace("]", "").replace("'", "")
    return path.replace("_modules.", "").strip(".")


def at_root(node: fx.Node) -> bool:
    """Traced from the compiled module's own code: Dynamo records a module
    stack for every op a submodule runs, and the ops AOTAutograd adds carry
    the stack of the op they serve (or mark themselves autograd's)."""
    meta = node.meta
    return (node.op == "call_function" and not meta.get("nn_module_stack")
            and not meta.get("fwd_nn_module_stack") and not meta.get("autograd_backward")
            and bool(meta.get("stack_trace")))


# Ops that read some arguments only to return their new values: BatchNorm in
# training reads the running statistics (arguments 3 and 4) only to return
# them updated (outputs 3 and 4); its other outputs do not depend on them.
# Per op: the argument positions, the output positions, the training flag's.
_STATE_ARGUMENTS = {aten._native_batch_norm_legit_functional.default: ((3, 4), (3, 4), 5)}


def reads_only_for_state(node: fx.Node, arg: fx.Node) -> bool:
    """``node`` reads ``arg`` only for outputs that return its new value."""
    spec = _STATE_ARGUMENTS.get(node.target)
    if spec is None or len(node.args) <= spec[2] or node.args[spec[2]] is not True:
        return False
    positions = [k for k, a in enumerate(node.args) if a is arg]
    return bool(positions) and all(k in spec[0] for k in positions) and \
        arg not in node.kwargs.values()


def returns_state(node: fx.Node, index) -> bool:
    """Output ``index`` of ``node`` is the new value of a state it read."""
    spec = _STATE_ARGUMENTS.get(node.target)
    return spec is not None and index in spec[1]


# --- how torch's min-cut partitioner classes ops ------------------------------

# The halves of a host dropout split for planning (passes/dropout.py), as
# torch's partitioner classes what they stand for: the draw as dropout, the
# product as a multiplication.
_CLASSED_AS = {"fxckpt::dropout_mask": aten.native_dropout,
               "fxckpt::apply_dropout_mask": aten.mul}


class PerOp:
    """``read(node)`` for the nodes of one graph, read once per op overload
    (where the op alone decides it) and each time for other targets, and
    for ops ``unless(op)`` says the call decides: a 10,000-node graph holds
    a few dozen ops. Made per graph, never kept."""

    def __init__(self, read, unless=None) -> None:
        self._read = read
        self._unless = unless
        self._known: dict = {}

    def __call__(self, node: fx.Node):
        target = node.target
        if not isinstance(target, OpOverload) \
                or (self._unless is not None and self._unless(target)):
            return self._read(node)
        try:
            return self._known[target]
        except KeyError:
            found = self._known[target] = self._read(node)
            return found


def remat_kind(node: fx.Node) -> RematKind:
    """The op classes torch's min-cut partitioner plans with (its lists of
    views, fusible and recomputable ops; its size measure)."""
    return RematKinds()(node)


class RematKinds:
    """``remat_kind`` of the nodes of one graph: each value's size read
    once (as a node's own, then as its readers' argument), each op looked
    up in the partitioner's lists once, and equal records shared (they are
    frozen): a 10,000-node graph holds a few dozen ops."""

    def __init__(self) -> None:
        self._sizes: dict[fx.Node, int] = {}
        self._classes: dict = {}     # op -> (view, fusible, allowed, fuses_inputs)
        self._kinds: dict[tuple, RematKind] = {}

    def __call__(self, node: fx.Node) -> RematKind:
        size = self._size(node)
        args_size = sum(self._size(a) for a in node.args if isinstance(a, fx.Node))
        classes = self._classes.get(node.target)
        if classes is None:
            classes = self._classes[node.target] = _remat_classes(node)
        fields = (*classes, node.target is operator.getitem, size * 4 < args_size, size)
        kind = self._kinds.get(fields)
        if kind is None:
            view, fusible, allowed, fuses_inputs, getitem, reduction, size = fields
            kind = self._kinds[fields] = RematKind(
                view=view, fusible=fusible, allowed=allowed, fuses_inputs=fuses_inputs,
                getitem=getitem, reduction=reduction, bytes=size)
        return kind

    def _size(self, node: fx.Node) -> int:
        size = self._sizes.get(node)
        if size is None:
            size = self._sizes[node] = remat_bytes(node.meta.get("val"))
        return size


def _remat_classes(node: fx.Node) -> tuple[bool, bool, bool, bool]:
    """(view, fusible, allowed, fuses_inputs) of ``node``'s op (its target
    alone decides them)."""
    lists = partitioner_op_lists()
    target = packet(node) or node.target
    target = _CLASSED_AS.get(qualified_name(target), target)
    return (target in lists.view_ops, target in lists.fusible_ops,
            target in lists.recomputable_ops, target is aten.cat)


def remat_bytes(val) -> int:
    """torch's partitioner's size of a value: elements times item size,
    summed over a tuple's tensors; 1 for a symbolic number."""
    if isinstance(val, (list, tuple)):
        return sum(remat_bytes(v) for v in val if isinstance(v, torch.Tensor))
    if isinstance(val, torch.Tensor):
        numel = val.numel()
        numel = numel if isinstance(numel, int) else _hint(numel)
        return numel * val.dtype.itemsize
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return 1
    return 0


def _hint(value, fallback: int = 4096) -> int:
    try:
        return int(value.node.hint) if value.node.hint is not None else fallback
    except Exception:  # an unbacked size: the fallback torch uses
        return fallback


# --- what an op does to its arguments (the eager path) ------------------------

@dataclass(frozen=True)
class OpKind:
    writes: bool      # writes to one of its arguments
    aliases: bool     # an output aliases an input
    random: bool

    @property
    def cacheable(self) -> bool:
        return not (self.writes or self.aliases)


_kinds: dict[Any, OpKind] = {}

# Ops that write to arguments their schema does not mark as written: the
# BatchNorm kernels update running_mean and running_var (positions 3 and 4)
# when ``training`` (position 5) is true.
UNDECLARED_WRITES = {
    aten.native_batch_norm.default: (3, 4),
    aten.cudnn_batch_norm.default: (3, 4),
    aten.miopen_batch_norm.default: (3, 4),
}
TRAINING_ARGUMENT = 5


def op_kind(func) -> OpKind:
    """What an op does to its arguments, as the eager checkpoint needs to know."""
    kind = _kinds.get(func)
    if kind is None:
        found = schema(func) if isinstance(func, OpOverload) else None
        if found is None:  # a higher-order operator
            kind = OpKind(writes=False, aliases=True, random=False)
        else:
            kind = OpKind(
                writes=func in UNDECLARED_WRITES or any(
                    a.alias_info is not None and a.alias_info.is_write
                    for a in found.arguments),
                aliases=any(r.alias_info is not None for r in found.returns),
                random=is_random_op(func))
        _kinds[func] = kind
    return kind


class Impurity:
    """``node.is_impure(impure_random)``, read once per op. For a
    call_function node FX asks torch's ``is_impure`` of its target
    alone, except for higher-order operators (auto_functionalized asks of
    its first argument), which are asked each time. A 10,000-node graph
    holds a few dozen distinct ops."""

    def __init__(self) -> None:
        self._known: dict[tuple, bool] = {}

    def __call__(self, node: fx.Node, impure_random: bool = True) -> bool:
        target = node.target
        if node.op != "call_function" or isinstance(target, HigherOrderOperator):
            return node.is_impure(impure_random)
        key = (target, impure_random)
        try:
            known = self._known.get(key)
        except TypeError:  # an unhashable target
            return node.is_impure(impure_random)
        if known is None:
            known = self._known[key] = node.is_impure(impure_random)
        return known


def rng_state_bytes(device: torch.device | None) -> int:
    """Bytes of the generator state ``run_and_save_rng_state`` saves."""
    if device is not None and device.type == "cuda":
        return 16  # philox seed and offset
    return torch.get_rng_state().numel()  # the CPU Mersenne Twister state

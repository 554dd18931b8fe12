"""What the eager checkpoint needs to know of an op and its tensors.

Which ops write to their arguments (including the BatchNorm kernels, whose
schemas do not say so), which return aliases, which draw random numbers; how
to run an op with its writes redirected to copies; detached aliases and
copies of saved outputs.
"""

from __future__ import annotations


import torch

from fxckpt.compat.autograd import exclude_inplace_or_view
from fxckpt.compat.ops import pytree, schema
from fxckpt.memory.values import storage_key
from fxckpt.ops import TRAINING_ARGUMENT, UNDECLARED_WRITES

TensorMeta = tuple[tuple[int, ...], torch.dtype, torch.device]


def _written_arguments(func, args, kwargs):
    """(position or keyword, value) of every argument ``func`` writes to."""
    undeclared = UNDECLARED_WRITES.get(func)
    if undeclared is not None:
        if len(args) > TRAINING_ARGUMENT and args[TRAINING_ARGUMENT]:
            yield from ((i, args[i]) for i in undeclared if i < len(args))
        return
    for i, arg in enumerate(schema(func).arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            if arg.name in kwargs:
                yield arg.name, kwargs[arg.name]
        else:
            yield i, args[i]


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    written = []
    for _, value in _written_arguments(func, args, kwargs):
        if isinstance(value, torch.Tensor):
            written.append(value)
        elif isinstance(value, (list, tuple)):
            written.extend(v for v in value if isinstance(v, torch.Tensor))
    return written


def run_on_copies(func, args, kwargs, storages: set[int]):
    """Run ``func`` with the writes to ``storages`` going to copies."""
    originals: dict[int, torch.Tensor] = {}

    def substitute(value):
        if isinstance(value, torch.Tensor) and storage_key(value) in storages:
            scratch = value.clone()
            originals[id(scratch)] = value
            return scratch
        return value

    args, kwargs = list(args), dict(kwargs)
    for where, value in list(_written_arguments(func, args, kwargs)):
        if isinstance(value, (list, tuple)):
            value = type(value)(substitute(v) for v in value)
        else:
            value = substitute(value)
        if isinstance(where, int):
            args[where] = value
        else:
            kwargs[where] = value
    out = func(*args, **kwargs)
    # An op returning what it wrote (add_, out=) returns the caller's tensor.
    return pytree.tree_map(lambda x: originals.get(id(x), x) if isinstance(x, torch.Tensor) else x,
                    out)


def tensor_leaves(tree) -> list[torch.Tensor]:
    # Most ops return a tensor or a flat tuple of them: skip pytree for those.
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)) and all(
            isinstance(x, torch.Tensor) or x is None or isinstance(x, (int, float, bool))
            for x in tree):
        return [x for x in tree if isinstance(x, torch.Tensor)]
    leaves, _ = pytree.tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def tensor_metas(out) -> tuple[TensorMeta, ...]:
    return tuple((tuple(x.shape), x.dtype, x.device) for x in tensor_leaves(out))



def alias(t: torch.Tensor) -> torch.Tensor:
    # A detached alias that shares the version counter (so writes show) and
    # carries no autograd metadata (so autograd can give it a fresh history
    # when a recomputation returns it).
    with exclude_inplace_or_view():
        return t.detach()


def copy(t: torch.Tensor) -> torch.Tensor:
    return t.clone()  # preserve_format: same strides for dense tensors




def describe_meta(metas: tuple[TensorMeta, ...]) -> str:
    """``float32[4, 8] on cpu, ...`` for error messages."""
    return ", ".join(f"{str(dtype).removeprefix('torch.')}{list(shape)} on {device}"
                     for shape, dtype, device in metas) or "no tensors"

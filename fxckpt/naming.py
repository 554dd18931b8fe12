"""``fxckpt.name(tensor, "attn_out")``: give a value a name that policies see.

Eagerly it returns ``tensor`` itself. Under ``torch.compile`` (or an FX trace)
it is the op ``fxckpt::named``, which Dynamo records like any op. When
AOTAutograd traces the joint graph the op decomposes into ``aten.alias`` (a
view: no copy, no bytes, the same numbers), and on its way writes the name on
the node that produced the value, ``node.meta["fxckpt_names"]``, where the
tag stage reads it. The name sits on the producer, not on the alias, because
Inductor drops no-op aliases from the joint graph before fxckpt plans it.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakTensorKeyDictionary

_LIB = torch.library.Library("fxckpt", "DEF")
_LIB.define("named(Tensor(a) self, str name) -> Tensor(a)")

# Names given eagerly, for the eager path; weak, so they hold no memory.
_EAGER_NAMES: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def name(tensor: torch.Tensor, value_name: str) -> torch.Tensor:
    """Name ``tensor`` for ``fxckpt.policies.save_names``.

    Args:
        tensor: a tensor of the forward (eager or being compiled).
        value_name: a non-empty name the policy can ask for.

    Returns:
        ``tensor`` unchanged.

    Raises:
        TypeError: ``value_name`` is not a non-empty str, or ``tensor`` is
            not a tensor.

    Example:
        >>> h = fxckpt.name(self.attn(x), "attn_out")
    """
    if not isinstance(value_name, str) or not value_name:
        raise TypeError(f"fxckpt.name: a value's name is a non-empty str, got {value_name!r}")
    if torch.compiler.is_compiling() or isinstance(tensor, torch.fx.Proxy):
        return torch.ops.fxckpt.named(tensor, value_name)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"fxckpt.name names a tensor, got {type(tensor).__name__}")
    _EAGER_NAMES[tensor] = _EAGER_NAMES.get(tensor, ()) + (value_name,)
    return tensor


def names_of(tensor: torch.Tensor) -> tuple[str, ...]:
    """The names ``fxckpt.name`` gave ``tensor`` eagerly."""
    return _EAGER_NAMES.get(tensor, ())


def _named(tensor: torch.Tensor, value_name: str) -> torch.Tensor:
    node = _producer_node(tensor)
    if node is not None:
        names = node.meta.setdefault("fxckpt_names", [])
        if value_name not in names:
            names.append(value_name)
    return torch.ops.aten.alias.default(tensor)


def _producer_node(tensor: torch.Tensor):
    """The fx node being traced for ``tensor``, or None outside make_fx tracing
    (Dynamo's fake run, AOTAutograd's metadata pass, plain eager)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

    from fxckpt.compat.ops import unwrapped_functional

    mode = get_proxy_mode()
    if mode is None:
        return None
    tensor = unwrapped_functional(tensor)
    slot = get_proxy_slot(tensor, mode.tracer, None)
    return slot.proxy.node if slot is not None else None


_LIB.impl("named", _named, "CompositeImplicitAutograd")

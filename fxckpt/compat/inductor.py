"""Inductor's entry points, configuration, passes and scheduler, as
fxckpt hooks into them (see fxckpt/compat/__init__.py). The code Inductor
generates is read in fxckpt/compat/wrapper_code.py."""

from __future__ import annotations

import contextlib
from typing import Callable

from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, CustomPartitionerFn

__all__ = ["inductor_config", "CustomGraphPass", "CustomPartitionerFn", "compile_fx",
           "compile_fx_inner", "post_grad_passes", "choices_wrapped", "cache_dir",
           "realize_thresholds", "config_text", "mode_options", "modes"]


def compile_fx(*args, **kwargs):
    from torch._inductor.compile_fx import compile_fx as inductor_compile

    return inductor_compile(*args, **kwargs)


def compile_fx_inner(*args, **kwargs):
    from torch._inductor.compile_fx import compile_fx_inner as inductor_compile_inner

    return inductor_compile_inner(*args, **kwargs)


def post_grad_passes(ours: CustomGraphPass):
    """The value of ``post_grad_custom_post_pass`` that runs the user's own
    post-grad passes, then ``ours``. torch 2.13 and newer take a tuple;
    before, one pass: the user's and ours as one."""
    try:
        from torch._inductor.custom_graph_pass import get_custom_graph_passes
    except ImportError:
        user = inductor_config.post_grad_custom_post_pass
        return ours if user is None else _Both(user, ours)
    return (*get_custom_graph_passes(inductor_config.post_grad_custom_post_pass), ours)


class _Both(CustomGraphPass):
    """Two post-grad passes as one (torch before 2.13); uncacheable where
    the first has no uuid, as Inductor treats such a pass."""

    def __init__(self, first, second: CustomGraphPass) -> None:
        self.first, self.second = first, second

    def __call__(self, graph) -> None:
        self.first(graph)
        self.second(graph)

    def uuid(self):
        first = self.first.uuid() if hasattr(self.first, "uuid") else None
        return None if first is None else (first, self.second.uuid())


@contextlib.contextmanager
def choices_wrapped(wrap: Callable):
    """Inductor compiles inside this context consult ``wrap(choices)`` for
    their fusion choices, ``choices`` being the handler in force."""
    from torch._inductor.virtualized import V

    with V.set_choices_handler(wrap(V.choices)):
        yield


def cache_dir() -> str:
    """Inductor's cache directory."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return inductor_cache_dir()


def realize_thresholds() -> tuple[int, int]:
    """(ops, reads) beyond which Inductor stores a pointwise value its
    several readers share, rather than computing it in each."""
    return inductor_config.realize_opcount_threshold or 30, \
        inductor_config.realize_reads_threshold


def config_text() -> dict:
    """Inductor's configuration as its caches key it."""
    return inductor_config.save_config_portable(ignore_private_configs=False)


def mode_options(mode: str) -> dict:
    """The Inductor configuration ``torch.compile(mode=...)`` sets, as a
    mapping for ``inductor_config.patch``; KeyError for a mode torch does
    not know."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options()[mode])


def modes() -> tuple[str, ...]:
    """The modes ``torch.compile`` takes on this release."""
    from torch._inductor import list_mode_options

    return tuple(list_mode_options())

"""The ways ``fxckpt bench`` trains a model, each as a ``Way``: what it is
and how to turn a (model, loss) pair into a step function.

Every way trains the same ``Step`` module (model and loss together), so a
compiled way's graph covers the whole step, as in the memory-model tests.
Compiled ways other than Inductor run their graphs the way ``aot_eager``
does (the generated Python code of each graph), so step times compare plans
rather than graph runners; fxckpt's rows run through ``fxckpt.backend``,
as users call it (``compiler="eager"`` runs generated code too).
"""

from __future__ import annotations

import contextlib
import functools
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

from fxckpt.compat.aot import aot_autograd, boxed_nop, functorch_config, torch_partitions
from fxckpt.compat.inductor import inductor_config
from fxckpt.entry.backend import Backend
from fxckpt.options import Options

aten = torch.ops.aten

# Families: who made the plan.
EAGER, TORCH, FXCKPT = "eager", "torch", "fxckpt"


class Step(torch.nn.Module):
    """A model and its loss as one module, so one graph covers the step.

    Each Step's forward has a code object of its own. Dynamo keeps what it
    compiled per code object, so every Step compiles afresh, counts against
    no other Step's recompile limit, and leaves what Dynamo compiled before
    (the caller's models) as it was: no ``torch.compiler.reset()`` needed."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn
        self.forward = types.MethodType(with_own_code(_step_forward), self)


def _step_forward(self: Step, *inputs):
    return self.loss_fn(self.model(*inputs))


def with_own_code(function: Callable) -> Callable:
    """A copy of ``function`` with a code object of its own."""
    code = function.__code__.replace()
    copy = types.FunctionType(code, function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__qualname__ = function.__qualname__
    return copy


@dataclass(frozen=True)
class Way:
    key: str                               # stable id, used in bench.json
    label: str                             # as printed in the table
    family: str                            # EAGER, TORCH or FXCKPT
    backend: str                           # what runs the graphs, in words
    torch_budget: float | None = None      # activation_memory_budget, torch rows
    budget_of: str | None = None           # fxckpt rows: the key of the torch row
                                           # whose measured peak is the budget
    floor: bool = False                    # fxckpt at its floor
    reference: bool = False                # the no-checkpoint compiled step
    per_block: bool = False                # torch rows: torch.utils.checkpoint per
                                           # block; fxckpt rows: solver="per_block"


def ways(*, inductor: bool, torch_budgets=(0.5, 0.25, 0.0)) -> list[Way]:
    """Every way, in the order they run (an fxckpt row at a torch row's
    peak runs after that torch row)."""
    rows = [
        Way("eager", "eager, no checkpointing", EAGER, "eager"),
        Way("eager_checkpoint", "eager, checkpoint per block", EAGER, "eager"),
        Way("eager_sac", "eager, SAC torchtitan policy", EAGER, "eager"),
        Way("eager_fxckpt_checkpoint", "eager, fxckpt.checkpoint per block", EAGER, "eager"),
        Way("compile_save_all", "compile, saves all (no checkpointing)", TORCH,
            "aot_eager, default_partition", reference=True),
        Way("compile_default", "compile default", TORCH, "aot_eager"),
        Way("compile_checkpoint", "compile, checkpoint per block", TORCH, "aot_eager",
            per_block=True),
    ]
    rows += [Way(torch_key(b), f"compile, budget {b:g}", TORCH, "aot_eager", torch_budget=b)
             for b in torch_budgets]
    if inductor:
        rows += [Way("compile_inductor", "compile default", TORCH, "inductor"),
                 Way("compile_checkpoint_inductor", "compile, checkpoint per block", TORCH,
                     "inductor", per_block=True)]
        rows += [Way(torch_key(b, "inductor"), f"compile, budget {b:g}", TORCH, "inductor",
                     torch_budget=b) for b in torch_budgets]
    rows += [Way("fxckpt_default", "fxckpt default", FXCKPT, "fxckpt, aot_eager runtime"),
             Way("fxckpt_per_block", "fxckpt per_block", FXCKPT, "fxckpt, aot_eager runtime",
                 per_block=True)]
    rows += [Way(f"fxckpt_at_{torch_key(b)}", f"fxckpt at torch {b:g}'s peak", FXCKPT,
                 "fxckpt, aot_eager runtime", budget_of=torch_key(b)) for b in torch_budgets]
    rows.append(Way("fxckpt_floor", "fxckpt at its floor", FXCKPT,
                    "fxckpt, aot_eager runtime", floor=True))
    if inductor:
        rows += [Way("fxckpt_inductor", "fxckpt default", FXCKPT, "fxckpt, inductor"),
                 Way("fxckpt_per_block_inductor", "fxckpt per_block", FXCKPT,
                     "fxckpt, inductor", per_block=True)]
        rows += [Way(f"fxckpt_at_{torch_key(b, 'inductor')}", f"fxckpt at torch {b:g}'s peak",
                     FXCKPT, "fxckpt, inductor", budget_of=torch_key(b, "inductor"))
                 for b in torch_budgets]
    return rows


def torch_key(budget: float, compiler: str = "aot_eager") -> str:
    """The key of torch's row compiled with ``activation_memory_budget=budget``."""
    key = f"torch_budget_{budget:g}"
    return key if compiler == "aot_eager" else f"{key}_{compiler}"


# --- building a way's step ---------------------------------------------------

@dataclass
class Built:
    """A way made ready: ``run(*inputs)`` computes the loss; ``scope`` is the
    context every call must run in (torch's budget is read when it
    compiles, and a recompile must see the same); ``plans`` are fxckpt's;
    ``partition_seconds`` accumulates the partitioner's time."""

    run: Callable
    scope: Callable[[], Any] = contextlib.nullcontext
    plans: list = None
    partition_seconds: list = None


def build(way: Way, step: Step, *, budget_bytes: int | None = None) -> Built:
    """Make ``way``'s step function from a fresh ``step`` (its model is
    changed in place for the ways that checkpoint per block with torch)."""
    if way.family == EAGER:
        if way.key == "eager_checkpoint":
            wrap_blocks(step.model, torch_checkpointed)
        elif way.key == "eager_sac":
            wrap_blocks(step.model, _selective)
        elif way.key == "eager_fxckpt_checkpoint":
            wrap_blocks(step.model, _fxckpt_per_block)
        return Built(step)
    if way.family == TORCH:
        if way.per_block:
            wrap_blocks(step.model, torch_checkpointed)
        scope = contextlib.nullcontext
        if way.torch_budget is not None:
            scope = functools.partial(functorch_config.patch,
                                      activation_memory_budget=way.torch_budget)
        if way.backend == "inductor":
            # Compile caches off, as for fxckpt's Inductor way, so that
            # compile times are of a compile.
            return Built(torch.compile(step, backend="inductor"),
                         scope=functools.partial(_both, scope, _uncached_inductor))
        seconds: list[float] = []
        default_partition, min_cut_rematerialization_partition = torch_partitions()
        partition = default_partition if way.reference else min_cut_rematerialization_partition
        return Built(torch.compile(step, backend=_aot_eager(_timed(partition, seconds))),
                     scope=scope, partition_seconds=seconds)
    if way.backend == "fxckpt, inductor":
        import fxckpt

        backend = fxckpt.backend(budget=budget_bytes, compiler="inductor",
                                 solver="per_block" if way.per_block else "auto")
        # Caches off (torch's and with them fxckpt's plan cache): compile
        # times are of a compile, and plans are made, not read back.
        return Built(torch.compile(step, backend=backend), plans=backend.plans,
                     scope=_uncached_inductor)
    backend = Backend(Options.create(budget=budget_bytes, compiler="eager",
                                     solver="per_block" if way.per_block else "auto"))
    return Built(torch.compile(step, backend=backend), plans=backend.plans)


@contextlib.contextmanager
def _both(first, second):
    with first(), second():
        yield


@contextlib.contextmanager
def _uncached_inductor():
    with functorch_config.patch(enable_autograd_cache=False), \
            inductor_config.patch(fx_graph_cache=False):
        yield


def _aot_eager(partition_fn, *, keep_inference_input_mutations: bool = True):
    """torch's aot_eager backend, with the given partitioner."""
    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop,
                        partition_fn=partition_fn,
                        keep_inference_input_mutations=keep_inference_input_mutations)


def _timed(partition_fn, seconds: list[float]):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return partition_fn(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)
    return timed



# --- eager checkpointing -----------------------------------------------------

def wrap_blocks(model: torch.nn.Module, wrap: Callable) -> None:
    """Replace each block's forward (model.blocks, an nn.ModuleList in every
    built-in model) with ``wrap(forward)``; parameters are untouched."""
    wrap_each(model.blocks, wrap)


def wrap_each(blocks, wrap: Callable) -> None:
    """Replace the forward of each of ``blocks`` (any modules: a Hugging
    Face decoder's layers) with ``wrap(forward)``."""
    for block in blocks:
        block.forward = wrap(block.forward)


def torch_checkpointed(forward):
    """``forward`` under torch.utils.checkpoint, non-reentrant: what a user
    writes around each block."""
    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpointed


def _fxckpt_per_block(forward):
    from fxckpt.eager.checkpoint import checkpoint as fxckpt_checkpoint

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return fxckpt_checkpoint(forward, *args, **kwargs)
    return checkpointed


def _selective(forward):
    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=torchtitan_contexts, **kwargs)
    return checkpointed


# torchtitan's selective activation checkpointing ("op" mode): save matmuls
# and attention, except every second matmul, recompute everything else. On
# the CPU a Linear with a bias is addmm, so addmm counts as a matmul with mm.
SAC_SAVE = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
})
SAC_ALTERNATING = frozenset({aten.mm.default, aten.addmm.default})


def torchtitan_contexts():
    """Fresh SAC contexts for one checkpointed region. Matmuls are counted
    separately in forward and in recompute, so both see the same sequence
    and make the same choices."""
    seen = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in SAC_ALTERNATING:
            seen[ctx.is_recompute] += 1
            if seen[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if op in SAC_SAVE:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)

"""GraphModule + example inputs -> a callable whose forward and backward follow
fxckpt's plan. AOTAutograd traces the joint graph (make_fx, with fake tensors
on every node) and hands it to the Planner as its partition function; the two
graphs it returns go to the inner compiler. Plans are cached with the
compiled graphs (fxckpt/planning/cache.py): ``compile_planned`` keys them, and
records the stored plans where torch serves a compile from its caches.

``capture_once`` runs a model once under a backend without training it, for
explain, pareto and the benchmarks."""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.fx as fx

from fxckpt.compat.aot import aot_autograd, boxed_nop, functorch_config
from fxckpt.compat.dynamo import compile_isolated
from fxckpt.compat.releases import TESTED, newer_than_tested
from fxckpt.compat.inductor import (CustomPartitionerFn, compile_fx, compile_fx_inner,
                                    inductor_config, mode_options, post_grad_passes)
from fxckpt.compat.wrapper_code import UnreadableCode
from fxckpt.memory.compiled_peak import (fallback_outputs, fallback_scratch, step_peak,
                                           tangent_bytes)
from fxckpt.inductor.addmm import SplitLateAddmm
from fxckpt.inductor.fusion import recompute_apart
from fxckpt.errors import BudgetError, warn_once
from fxckpt.planning.cache import CacheKey, PlanStore, Stored, caches_enabled, plan_key
from fxckpt.memory.values import has_symbolic_sizes
from fxckpt.planning.pipeline import Planner
from fxckpt.solve.select import Fits, Floor, Request, RuntimeOptimal

log = logging.getLogger("fxckpt.planning.capture")


def compile_planned(gm: fx.GraphModule, example_inputs: list[Any], planner: Planner):
    """Compile ``gm`` with ``planner`` as its partition function. A Planner's
    plans are cached (fxckpt/planning/cache.py): where torch serves the compiled
    graphs from its caches, the Planner does not run and adopts the plans
    stored with them; where it runs, it follows a stored decision rather
    than solving again, and stores what it made."""
    key, store = _cache_for(gm, example_inputs, planner)
    stored = store.load(key.digest) if store is not None else None
    if stored is not None and stored.why_not is not None:
        planner.cache_note = f"not cached: {stored.why_not}"
        key, store = CacheKey(None, stored.why_not), None
    elif stored is not None:
        planner.reusable = list(stored.records)
        # Under a byte budget, the compile that fitted was cached under its
        # own attempt's uuid: ask for that one first.
        planner.start_with = stored.kept
    records = getattr(planner, "records", [])
    made_before = len(records)
    compiled = _compile(gm, example_inputs, planner, key.digest)
    made = tuple(records[made_before:])
    if made:
        if store is not None:
            store.save(key.digest, _to_store(made, planner.options, planner.kept))
    elif key.digest is not None and _needs_backward(gm, example_inputs):
        if stored is not None:
            log.info("fxckpt: compiled graphs served from torch's caches, their plans "
                     "from the plan cache (key %s); nothing planned", key.short)
            planner.adopt(stored.records, note=f"compiled graphs served from torch's "
                          f"caches, this plan from fxckpt's plan cache (key {key.short})")
        else:
            # Served from torch's caches, but the plans made with them are not
            # in the store (removed, or never written): compile again with
            # torch's cache of partitioned graphs off, so the Planner runs. A
            # cache hit happens before Inductor's passes touch ``gm``.
            log.info("fxckpt: compiled graphs served from torch's caches without their "
                     "plans (key %s); compiling again to plan", key.short)
            compiled = _compile(gm, example_inputs, planner, None)
            # Stored even when empty (AOTAutograd found nothing to partition):
            # the next process then takes torch's compile as it is.
            store.save(key.digest, _to_store(tuple(records[made_before:]), planner.options,
                                             planner.kept))
    return compiled


def _cache_for(gm, example_inputs, planner) -> tuple[CacheKey, PlanStore | None]:
    """The plan cache's key for this compile and the store, or (a key of
    None, None) where plans are not cached (the plans' notes say why where
    that is not the caller's choice)."""
    if not getattr(planner, "caches_plans", False):
        return CacheKey(None, "a planner whose plans are not cached"), None
    if not caches_enabled():
        return CacheKey(None, "torch's caches are off"), None
    key = plan_key(gm, example_inputs, planner.options, request=planner.named_request,
                   num_lifted_params=planner.num_lifted_params)
    if key.digest is None:
        log.info("fxckpt: plans not cached: %s", key.why_not)
        planner.cache_note = f"not cached: {key.why_not}"
        return key, None
    return key, PlanStore()


def _to_store(made, options, kept: Request | None) -> Stored:
    """What the store keeps of the plans just made: not a plan priced with a
    bandwidth measured in this process, which another process would measure
    again and might plan differently by."""
    if options.offload_bandwidth is None and \
            any(planned.decision.offload_bandwidth is not None for planned in made):
        log.info("fxckpt: plans priced offload at a bandwidth measured here; not cached")
        return Stored(why_not="offload priced at a bandwidth measured in the process; "
                              "give offload_bandwidth= to cache it")
    return Stored(records=made, kept=kept)


def _needs_backward(gm: fx.GraphModule, example_inputs) -> bool:
    """Whether AOTAutograd builds a backward for ``gm``, and so partitions."""
    tensors = [*example_inputs, *gm.parameters()]
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in tensors)


def _compile(gm, example_inputs, planner, uuid: str | None):
    """AOTAutograd and the options' compiler, ``uuid`` the partitioner's
    (None: torch's cache of partitioned graphs is off for this compile)."""
    if planner.options.compiler == "eager":
        # Dynamo's aot_autograd wrapper rather than aot_module_simplified: DDP's
        # graph splitter counts its calls to tell that a bucket's graph went
        # through AOTAutograd; uncounted, the first real call returns fake tensors.
        return aot_autograd(
            # The planned graphs run as their generated code, as aot_eager
            # runs its own (not through fx.Interpreter, which costs Python
            # time per op).
            fw_compiler=boxed_nop,
            bw_compiler=boxed_nop,
            partition_fn=planner,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)
    return _compile_inductor(gm, example_inputs, planner, uuid)


# Compiles of one graph at most, where each compiled plan peaks over its
# byte budget and the graph is planned again below it by the excess; the
# last of them is the floor's plan.
_ATTEMPTS = 4


def _compile_inductor(gm, example_inputs, planner, uuid: str | None):
    """Compile with Inductor and read each plan's real peak off the code it
    generated (fxckpt/memory/compiled_peak.py): that is the plan's peak from then
    on. Asked to fit bytes, a plan whose compiled code peaks over them is
    thrown away and the graph planned again (``_fitted``); asked for the
    floor, the lowest compiled of three plans is kept (``_lowest``). Their
    plans reach the caller only then."""
    on_plan, planner.on_plan = planner.on_plan, None
    mark = len(planner.plans)
    try:
        if isinstance(planner.request, Fits):
            # Each attempt has a uuid of its own (_attempt_uuid). A process
            # whose plan cache says which attempt fitted starts there
            # (compile_planned sets start_with), and torch serves it.
            compiled, planner.kept = _fitted(gm, example_inputs, planner, mark, uuid)
        elif isinstance(planner.request, Floor):
            compiled, planner.kept = _lowest(gm, example_inputs, planner, mark, uuid)
        else:
            (compiled, _), planner.kept = _attempt(gm, example_inputs, planner, uuid, mark), None
    finally:
        planner.on_plan, planner.start_with = on_plan, None
    if on_plan is not None:
        for plan in planner.plans[mark:]:
            on_plan(plan)
    return compiled


def _attempt_uuid(planner, uuid: str | None) -> str | None:
    """The uuid of one compile of a graph: asked to fit bytes, each attempt
    (what it selects by) is cached apart, so that a compile thrown away
    for peaking over the budget is never served for another."""
    if uuid is None or planner.attempt is None:
        return uuid
    return f"{uuid}/planned for {planner.attempt}"


def _fitted(gm, example_inputs, planner, mark: int, uuid: str | None):
    """The compile of a plan whose compiled code meets the byte budget:
    planned at the budget, then lower by what each compiled plan exceeded,
    the last try the memory model's floor plan; failing those, the
    runtime-optimal plan if its code fits, then the plan halfway between
    them (``_middle``). Otherwise a BudgetError naming the lowest compiled
    peak of those three: planning is deterministic, so asking that budget
    gets one of them. Returns (compiled, what its plan was planned for)."""
    budget = planner.request.bytes
    start = planner.start_with
    if isinstance(start, RuntimeOptimal):
        return _runtime_optimal_or_refuse(gm, example_inputs, planner, mark, None, uuid)
    target = start if start is not None else Fits(budget)
    tried: list[str] = []
    floor_peak = floor_model_peak = None
    for attempt in range(_ATTEMPTS):
        if attempt == _ATTEMPTS - 1:
            target = Floor()
        try:
            compiled, over = _attempt(gm, example_inputs, planner, uuid, mark, target)
        except BudgetError as below_floor:
            if below_floor.floor_bytes is None or isinstance(target, Floor):
                raise
            # Below the memory model's floor: its plan's compiled peak is
            # the floor to name.
            target = Floor()
            compiled, over = _attempt(gm, example_inputs, planner, uuid, mark, target)
        if not over:
            return compiled, target
        plan = planner.plans[-1]
        planner.retract(mark)
        if isinstance(target, Floor):
            floor_peak, floor_model_peak = plan.peak_bytes, plan.model_peak_bytes
            break
        lower = target.bytes - over
        log.info("fxckpt: compiled plan peaks %d bytes over its budget; planning "
                 "again %d bytes lower", over, budget - lower)
        target = Floor() if plan.fingerprint in tried else Fits(lower)
        tried.append(plan.fingerprint)
    return _runtime_optimal_or_refuse(gm, example_inputs, planner, mark, floor_peak, uuid,
                                      floor_model_peak)


def _runtime_optimal_or_refuse(gm, example_inputs, planner, mark: int, floor_peak, uuid,
                               floor_model_peak=None):
    budget = planner.request.bytes
    compiled, _ = _attempt(gm, example_inputs, planner, uuid, mark, RuntimeOptimal())
    if len(planner.plans) == mark:
        # Served from torch's caches: compile_planned adopts its plan.
        return compiled, RuntimeOptimal()
    optimal = planner.plans[mark]
    if optimal.peak_bytes <= budget:
        planner.replace_plan(mark, replace(optimal, budget_bytes=budget, notes=optimal.notes + (
            "the runtime-optimal plan: its compiled code meets the budget, the "
            "plans made for the budget did not",)))
        return compiled, RuntimeOptimal()
    planner.retract(mark)
    middle = _middle(gm, example_inputs, planner, mark, uuid, floor_model_peak,
                     optimal.model_peak_bytes)
    if middle is not None and middle[1] <= budget:
        return middle[0], middle[2]
    lowest = min(p for p in (floor_peak, optimal.peak_bytes, middle and middle[1])
                 if p is not None)
    raise _still_over(budget, lowest)


def _middle(gm, example_inputs, planner, mark: int, uuid, floor_model_peak, top_model_peak):
    """(compiled, compiled peak, what it was planned for) of the plan
    halfway between the memory model's floor and the runtime-optimal plan
    (what budget=0.5 plans), or None; its compile is kept only where it fits the budget. Inductor's
    code can peak lower there than at the memory model's floor (tiny HF
    GLM, sequence 64), so the floor a BudgetError names is the lowest of
    the three. Tried whatever the budget (the target does not depend on
    it), so that asking for that floor compiles this plan again where it
    was the lowest; a later compile of the graph asks for it first."""
    if floor_model_peak is None or top_model_peak is None:
        return None
    target: Request = Fits((floor_model_peak + top_model_peak) // 2)
    try:
        compiled, over = _attempt(gm, example_inputs, planner, uuid, mark, target)
    except BudgetError:
        target = Floor()
        compiled, over = _attempt(gm, example_inputs, planner, uuid, mark, target)
    if len(planner.plans) == mark:
        # Served from torch's caches: it fitted before.
        return compiled, planner.request.bytes, target
    peak = planner.plans[mark].peak_bytes
    if over:
        planner.retract(mark)
    return compiled, peak, target


def _lowest(gm, example_inputs, planner, mark: int, uuid: str | None):
    """The compile of the plan whose code peaks lowest of three: the memory
    model's floor plan, the runtime-optimal plan and the plan halfway
    between them (Inductor's code can peak lower above the memory model's
    floor: tests/test_inductor_floor.py). Returns (compiled, what its plan
    was planned for)."""
    if planner.start_with is not None:
        # Served from torch's caches, this is the compile kept before.
        compiled, _ = _attempt(gm, example_inputs, planner, uuid, mark, planner.start_with)
        if len(planner.plans) == mark:
            return compiled, planner.start_with
        planner.retract(mark)
    made = []

    def tried(target: Request):
        compiled, _ = _attempt(gm, example_inputs, planner, uuid, mark, target)
        if len(planner.plans) > mark:
            made.append((planner.retract(mark), compiled, target))
        return compiled

    floor_compiled = tried(Floor())
    if not made:
        # Served from torch's caches: compile_planned adopts its plan.
        return floor_compiled, Floor()
    tried(RuntimeOptimal())
    if len(made) == 2:
        floor, top = made[0][0][0][0], made[1][0][0][0]
        tried(Fits((floor.model_peak_bytes + top.model_peak_bytes) // 2))
    removed, compiled, kept = min(made, key=lambda m: m[0][0][0].peak_bytes)
    planner.restore(removed)
    return compiled, kept


def _attempt(gm, example_inputs, planner, uuid, mark: int, target: Request | None = None):
    """(compiled, bytes its plan's compiled code peaks over the budget), the
    graph planned for ``target`` (None: for the planner's request)."""
    code: dict[str, str] = {}
    facts: list[tuple[dict, dict, dict]] = []
    with planner.trying(target) if target is not None else contextlib.nullcontext():
        compiled = _inductor(gm, example_inputs, planner, _attempt_uuid(planner, uuid),
                             code, facts)
    return compiled, _note_compiled_peaks(planner, mark, code, facts)


def _inductor(gm, example_inputs, planner, uuid, code: dict[str, str],
              facts: list[tuple[dict, dict, dict]]):
    """compile_fx with the planner as partitioner; ``code`` gets the wrapper
    code Inductor generated for the forward and the backward, ``facts``
    the planned graphs' kernel scratch, fallback outputs and tangents
    (``fallback_scratch``, ``fallback_outputs``, ``tangent_bytes``), read
    as the partitioner hands them to Inductor. (Read after compiling, on an H100
    with torch 2.11, the compiled peak lacked the attention backward's
    573,440 bytes and the zoo GPT's floor plan peaked 12% over it; why was
    not found. Read here, it does not depend on what Inductor's passes do
    to the graphs.)"""
    def own() -> bool:
        return _compiled_as_own(planner)

    def inner_compile(graph, inputs, **kwargs):
        # A plan of fxckpt's own compiles with the C++ kernels' loop tails
        # scalar (the backward too where Inductor lowers it at its first
        # run). Vectorized, Inductor's CPU code for a plan's backward can be
        # wrong: HF Mamba's at budget 0.5, run eagerly, gives gradients
        # within 7e-7 of eager PyTorch's; compiled with vectorized tails,
        # 1.15 times their largest value apart (Inductor's compile of
        # that graph alone does the same; with cpp.enable_loop_tail_vec
        # off, or no vectorization, it is right). torch's own partitions of
        # that model do not meet it. CUDA code has no such tails.
        tails = {"cpp.enable_loop_tail_vec": False} if own() else {}
        with inductor_config.patch(tails):
            compiled = compile_fx_inner(graph, inputs, **kwargs)
        phase = "backward" if kwargs.get("is_backward") else "forward"
        code[phase] = getattr(compiled, "source_code", None)
        return compiled

    # Inductor's FX graph cache keys the planned forward and backward graphs,
    # so it may serve them whatever the uuid; a cache of partitioned graphs
    # skips the partitioner, and may only where the uuid keys the plan. The
    # backward is compiled now, not at its first run, so that its code is
    # read while the graph can still be planned again.
    # Symbolic sizes: the code's peak cannot be read (the memory model's
    # stands), and Inductor's early backward lowering fails on them.
    patches = {"force_non_lazy_backward_lowering": not _symbolic(example_inputs)}
    if uuid is None:
        patches["enable_autograd_cache"] = False

    with functorch_config.patch(patches), recompute_apart(own):
        # torch.compile's mode as Inductor would take it (its options first,
        # so that fxckpt's own entries stand).
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches={
            **mode_options(planner.options.mode),
            "custom_partitioner_fn": _InductorPartitioner(planner, uuid, facts),
            # The user's post-grad passes, then fxckpt's: an ``addmm`` Inductor
            # made of a matmul and a late add split back (inductor/addmm.py).
            "post_grad_custom_post_pass": post_grad_passes(SplitLateAddmm(own))})


def _compiled_as_own(planner) -> bool:
    """Whether Inductor compiles the plan last made with fxckpt's changes to
    how it compiles: the fusions inductor/fusion.py refuses and the late
    addmm split (inductor/addmm.py). Not where it is torch's own partition
    (the runtime-optimal plan), which compiles as torch.compile compiles
    it: on one thread, gradients bitwise equal to torch.compile's
    (tests/test_inductor.py). (On several threads Inductor's CPU kernel
    accumulating an embedding's gradient is not deterministic: two
    torch.compile runs of the zoo GPT differ there by 1.9e-9.)"""
    return not planner.plans or planner.plans[-1].solver != "mincut"


def _symbolic(example_inputs) -> bool:
    """Whether any input has a symbolic size (or is a symbolic number)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt | torch.SymFloat):
            return True
        if isinstance(x, torch.Tensor) and has_symbolic_sizes(x):
            return True
    return False


def _note_compiled_peaks(planner, mark: int, code: dict[str, str],
                        facts: list[tuple[dict, dict, dict]]) -> int:
    """Give the plan made since ``mark`` its compiled peak; return the bytes
    it is over its byte budget (0 when within it, or not known). Code this
    reading does not know is said, once per kind of statement, and the plan
    keeps the memory model's peak, with a note saying so."""
    if len(planner.plans) != mark + 1 or not code.get("forward"):
        return 0
    plan = planner.plans[mark]
    kernel_scratch, outputs, tangents = facts[-1] if facts else ({}, {}, {})
    try:
        compiled = step_peak(code["forward"], code.get("backward"), kernel_scratch, outputs,
                             tangents)
    except UnreadableCode as unread:
        if not unread.expected:
            planner.replace_plan(mark, replace(plan, notes=plan.notes + (
                f"peak not read from Inductor's generated code ({unread}): the memory "
                "model's prediction stands",)))
            warn_once(f"unreadable inductor code: {unread.why}", unreadable_warning(unread),
                      stacklevel=4)
        return 0
    if code.get("backward") is None:
        return 0
    peak = compiled.peak_bytes
    note = (f"peak read from Inductor's generated code: {peak} bytes "
            f"(the memory model predicted {plan.peak_bytes})")
    if newer_than_tested():
        # A release whose code fxckpt was not checked against: its reading
        # is not trusted to put the plan's peak below the memory model's.
        peak = max(peak, plan.peak_bytes)
        note += (f"; torch {torch.__version__} is newer than the releases fxckpt is tested "
                 f"on, so the plan's peak is the higher of the two, {peak} bytes")
    # What the graph holds while later graphs of the step run: the higher
    # of the two readings (the code can save a copy the graph does not, a
    # convolution's weight in another layout).
    saved = max(plan.saved_bytes, compiled.saved_bytes or 0)
    if saved != plan.saved_bytes:
        note += (f"; it saves {saved} bytes for backward (the memory model "
                 f"read {plan.saved_bytes})")
    planner.replace_plan(mark, replace(plan, peak_bytes=peak,
                                       model_peak_bytes=plan.peak_bytes,
                                       saved_bytes=saved, notes=plan.notes + (note,)))
    budget = plan.budget_bytes
    if budget is None or not isinstance(planner.request, Fits):
        return 0
    return max(0, peak - budget)


def unreadable_warning(unread: UnreadableCode) -> str:
    return (f"fxckpt: the code Inductor generated on torch {torch.__version__} holds a "
            f"statement fxckpt cannot read for memory ({unread}). The plans compiled with "
            "such code keep the memory model's peak, which Inductor's code can exceed, and a "
            "byte budget under Inductor rests on that prediction (on CUDA, also on the "
            "measured step). fxckpt reads the code of the torch releases it is tested on "
            f"({', '.join(map(str, TESTED))}); compiler='eager' does not depend on it.")


def _still_over(budget: int, lowest: int) -> BudgetError:
    return BudgetError(
        f"no plan fits a budget of {budget} bytes for this graph under Inductor: "
        f"the code Inductor generated peaks over it for the plans made for it, down "
        f"to the memory model's floor, for the plan halfway from there to the "
        f"runtime-optimal plan, and for the runtime-optimal plan. The lowest "
        f"compiled peak of those is {lowest} "
        f"bytes: raise the budget to at least {lowest} bytes, or shrink the batch.",
        floor_bytes=lowest)


class _InductorPartitioner(CustomPartitionerFn):
    """Inductor runs its joint-graph passes, then asks us to partition."""

    def __init__(self, planner: Planner, uuid: str | None,
                 facts: list[tuple[dict, dict, dict]]) -> None:
        self.planner = planner
        self._uuid = uuid
        self._facts = facts

    def __call__(self, gm: fx.GraphModule, joint_inputs, **kwargs):
        kwargs.pop("compiler", None)
        forward, backward = self.planner(gm, joint_inputs, **kwargs)
        graphs = (forward.graph, backward.graph)
        self._facts.append((fallback_scratch(graphs), fallback_outputs(graphs),
                            tangent_bytes(graphs)))
        return forward, backward

    def uuid(self):
        # The plan cache's key (fxckpt/planning/cache.py), or None: then the caller
        # turns AOTAutograd's cache off, as torch keys by the uuid only.
        return self._uuid

    def __reduce__(self):
        # Inductor writes its configuration, this object included, into its
        # cache keys: the uuid stands for it, not the Planner's state.
        # The fusion rules (fxckpt/inductor/fusion.py) the plan last made is
        # compiled under are named too (Inductor keys each graph after the
        # partition): code compiled under other rules must not be served.
        rules = ("recomputed ops apart, recomputation not moved where it holds more, "
                 "late addmm split, loop tails scalar" if _compiled_as_own(self.planner)
                 else "fusions and addmm as torch's")
        return (str, (f"fxckpt partitioner {self._uuid}, {rules}",))


def capture_once(model, example_inputs, backend: Callable, *,
                 dynamic: bool | None = None) -> None:
    """Run one forward of ``model`` (a copy of it, when it is an nn.Module:
    its buffers stay untouched) under ``backend`` with the caller's RNG
    state left as it was, so the backend sees the graphs training would.
    Other compiled models in the process are left as they were.
    ``dynamic``: torch.compile's (False: sizes never symbolic, not even
    where Dynamo saw the model's code run at other sizes before)."""
    target = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    devices = sorted({t.device for t in example_inputs
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"}, key=str)
    # Its own recompile region: the entries compiled here neither replace
    # nor count against those of models compiled elsewhere in the process
    # (no global reset), and a different backend never reuses theirs.
    with torch.random.fork_rng(devices=devices):
        compile_isolated(target, backend=backend, dynamic=dynamic)(*example_inputs)

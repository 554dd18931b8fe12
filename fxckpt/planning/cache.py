"""The plan cache: plans kept where torch keeps compiled graphs.

AOTAutograd's cache (with Inductor's FX graph cache under it) keys a compile
by the graph, its inputs, torch's configuration and each custom pass's
``uuid()``; a hit skips partitioning, so fxckpt's Planner does not run.
fxckpt's partitioner gives ``plan_key`` as its uuid: a digest of everything
a plan is a function of. The plans made under a key are kept under it in
``PlanStore``, beside torch's caches, and a compile that torch serves from
cache takes its plans from there (capture.compile_planned).

The key holds: the Dynamo graph (every node's op, target, arguments and the
metadata the tag stage reads: module paths, source lines, fxckpt.name
names, checkpoint regions), its inputs (sizes, strides, dtypes, devices,
requires_grad, aliasing), the options the graph is planned with (its share
of the budget, compiler, solver, runs per step, offload bandwidth, the
policy written out by fxckpt/policies/digest.py), torch's compiler
configuration (which shapes the joint graph), grad mode and autocast, the
thread count and the CUDA devices (the memory model counts kernels' scratch
by them), and the versions of Python, torch and fxckpt's own source.

There is no key -- the plan is not cached, and its notes say why -- for a
graph with symbolic sizes (planned at sizes the graph does not show), a
tensor-subclass input, or a policy that cannot be written out. A plan
priced with an offload bandwidth measured in this process is not stored.

The store follows torch's switch for its own cache of partitioned graphs,
functorch's ``enable_autograd_cache``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from fxckpt.compat.aot import functorch_config
from fxckpt.compat.inductor import cache_dir, config_text as inductor_config_text
from fxckpt.compat.ops import FakeTensor, HigherOrderOperator, OpOverload, OpOverloadPacket
from fxckpt.memory.values import has_symbolic_sizes
from fxckpt.options import Options
from fxckpt.policies.digest import Unkeyable, encode

log = logging.getLogger("fxckpt.planning.cache")

# Written into every key: bump when what the store keeps changes shape.
_FORMAT = "fxckpt plan cache 2"
# Node metadata the tag and profile stages read (see fxckpt/passes/tag.py).
_META = ("nn_module_stack", "stack_trace", "fxckpt_names", "recompute", "ac_graph_id",
         "custom")
_SYMBOLIC = "the graph has symbolic sizes, planned at sizes its key cannot see"
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter, FakeTensor)


def caches_enabled() -> bool:
    """Whether torch caches partitioned graphs, and so fxckpt its plans."""
    return bool(functorch_config.enable_autograd_cache) and \
        not torch.compiler.config.force_disable_caches


@dataclass(frozen=True)
class CacheKey:
    digest: str | None        # None: not cached
    why_not: str = ""         # when digest is None

    @property
    def short(self) -> str:
        return (self.digest or "")[:12]


def plan_key(gm: fx.GraphModule, example_inputs, options: Options, *, request=None,
             num_lifted_params: int = 0) -> CacheKey:
    """The key of ``gm`` planned with ``options`` (see the module docstring)
    and, where the graph is asked for something other than the options'
    budget, ``request`` (solve/select.py)."""
    try:
        text = "\n".join((
            _FORMAT, f"python {sys.version}", f"torch {torch.__version__}",
            f"fxckpt {_source_digest()}", _options_text(options, num_lifted_params),
            *([f"request {request!r}"] if request is not None else []),
            _state_text(), _config_text(), _inputs_text(example_inputs), _graph_text(gm)))
    except Unkeyable as error:
        return CacheKey(None, str(error))
    return CacheKey(hashlib.sha256(text.encode()).hexdigest())


def _options_text(options: Options, num_lifted_params: int) -> str:
    policy = "none"
    if options.policy is not None:
        cache_text = getattr(options.policy, "cache_text", None)
        if cache_text is None:
            raise Unkeyable(f"the policy {options.policy!r} is an object with for_graph(), "
                            "whose answers cannot be written out")
        policy = cache_text()
    return (f"budget={options.budget!r} compiler={options.compiler} solver={options.solver} "
            f"offload_bandwidth={options.offload_bandwidth!r} mode={options.mode} "
            f"runs_per_step={options.runs_per_step} lifted={num_lifted_params} policy={policy}")


def _state_text() -> str:
    autocast = {device: (torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device)))
                for device in ("cpu", "cuda")}
    # The memory model reads the thread count (CPU kernels' per-thread
    # buffers) and the device's SM count (flash attention splits its keys
    # by it): a plan made under other ones counts other scratch.
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return (f"grad={torch.is_grad_enabled()} autocast={autocast} "
            f"default_dtype={torch.get_default_dtype()} "
            f"deterministic={torch.are_deterministic_algorithms_enabled()} "
            f"threads={torch.get_num_threads()} cuda={devices}")


def _config_text() -> str:
    configs = (("inductor", inductor_config_text()),
               ("functorch", functorch_config.save_config_portable()))
    # Left out: fxckpt's own partitioner, and the cache switches, which
    # change where graphs come from, not what they are.
    return "\n".join(
        f"{name} " + _canonical({key: value for key, value in config.items()
                                 if "cache" not in key and key != "custom_partitioner_fn"})
        for name, config in configs)


def _canonical(value) -> str:
    """Configuration values as text; sets sorted, as their order is salted."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_canonical(v)}" for k, v in
                              sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(_canonical, value)) + "]"
    if isinstance(value, (set, frozenset)):
        return "{" + ",".join(sorted(map(_canonical, value))) + "}"
    try:
        return encode(value)
    except Unkeyable:
        pass
    try:
        return pickle.dumps(value, protocol=4).hex()
    except Exception:
        raise Unkeyable(f"torch's compiler configuration holds {type(value).__name__} "
                        f"{value!r}, which cannot be written out") from None


def _inputs_text(example_inputs) -> str:
    first_of_storage: dict[Any, int] = {}
    parts = []
    for index, value in enumerate(example_inputs):
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or \
                isinstance(value, torch.Tensor) and has_symbolic_sizes(value):
            raise Unkeyable(_SYMBOLIC)
        if isinstance(value, torch.Tensor):
            if type(value) not in _PLAIN_TENSORS:
                raise Unkeyable(f"input {index} is a {type(value).__name__}, a tensor "
                                "subclass whose layout the key cannot see")
            alias = first_of_storage.setdefault(StorageWeakRef(value.untyped_storage()), index)
            parts.append(f"{index}: {type(value).__name__} {tuple(value.shape)} "
                         f"{value.stride()} +{value.storage_offset()} {value.dtype} "
                         f"{value.device} {value.layout} grad={value.requires_grad} "
                         f"storage of {alias}")
        else:
            parts.append(f"{index}: {_canonical(value)}")
    return "\n".join(parts)


def _graph_text(gm: fx.GraphModule) -> str:
    for node in gm.graph.find_nodes(op="placeholder"):
        # Dynamo passes sizes as ints; its graph shows them as symbols.
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.SymInt) or \
                isinstance(value, torch.Tensor) and has_symbolic_sizes(value):
            raise Unkeyable(_SYMBOLIC)
    lines = []
    for name, module in gm.named_modules():
        if isinstance(module, fx.GraphModule):
            lines.append(f"module {name}")
            lines += [_node_text(node) for node in module.graph.nodes]
    return "\n".join(lines)


def _node_text(node: fx.Node) -> str:
    args = fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{n.name}")
    meta = {key: node.meta[key] for key in _META if key in node.meta}
    if "nn_module_stack" in meta:
        # Keyed by module id(), which differs per process: the paths and types.
        meta["nn_module_stack"] = [(path, _target(kind)) for path, kind in
                                   meta["nn_module_stack"].values()]
    return f"{node.op} {node.name} {_target(node.target)} {args!r} {meta!r}"


def _target(target) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    if isinstance(target, HigherOrderOperator):
        return target.name()
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"


@functools.cache
def _source_digest() -> str:
    """fxckpt's own source: a change to any stage makes new keys."""
    root = package_root()
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()


def package_root() -> str:
    """The fxckpt package's folder (this module lives in its planning/)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_files() -> list[str]:
    """Every Python file of the fxckpt package, in a fixed order: what
    ``_source_digest`` reads. (It once read planning/ alone, the
    folder this module moved into, so a change to any other stage kept the
    keys, and plans made by the older code were taken.)"""
    paths = []
    for folder, dirs, files in sorted(os.walk(package_root())):
        dirs.sort()
        paths += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
    return paths


@dataclass(frozen=True)
class Stored:
    """What one key holds: the Planned records (fxckpt/planning/pipeline.py) of one
    compile, or why its plans may not be reused (``why_not``)."""

    records: tuple = ()
    why_not: str | None = None
    # Under Inductor: what the kept compile was planned for (solve/select.py),
    # which its uuid names (fxckpt/planning/capture.py); None: the request.
    kept: Any = None


class PlanStore:
    """Plans on disk under their key, one file each, in torch's cache
    directory (``TORCHINDUCTOR_CACHE_DIR``) unless ``directory`` is given.
    A file that cannot be read is a miss; one that cannot be written is
    skipped (and logged)."""

    def __init__(self, directory: str | None = None) -> None:
        if directory is None:
            directory = os.path.join(cache_dir(), "fxckpt", "plans")
        self.directory = directory

    def path(self, digest: str) -> str:
        return os.path.join(self.directory, digest[:2], f"{digest}.pickle")

    def load(self, digest: str) -> Stored | None:
        try:
            with open(self.path(digest), "rb") as stored_file:
                stored = pickle.load(stored_file)
        except FileNotFoundError:
            return None
        except Exception as error:    # a file from another version, or cut short
            log.info("fxckpt: plan cache entry %s unreadable (%s); planning afresh",
                     digest[:12], error)
            return None
        return stored if isinstance(stored, Stored) else None

    def save(self, digest: str, stored: Stored) -> None:
        path = self.path(digest)
        partial = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Written aside and moved in: a reader never sees half a file.
            with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path),
                                             delete=False) as partial:
                pickle.dump(stored, partial, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial.name, path)
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as error:
            log.info("fxckpt: could not store plans under %s (%s)", digest[:12], error)
            if partial is not None and os.path.exists(partial.name):
                os.unlink(partial.name)

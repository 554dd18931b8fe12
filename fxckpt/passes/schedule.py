"""The memory model of a rewritten plan, without rewriting: a plan's peak
from the joint graph read once.

``rewrite`` builds FX graphs (a copy of the joint graph, the recompute
clones, AOTAutograd's extraction of forward and backward, the backward
scheduled just in time) and ``memory.simulate`` walks them. Both are exact,
and for a candidate plan that only needs its peak, slow: thousands of nodes
created per plan. ``ScheduleModel`` reads the joint graph once into plain
lists (each node's inputs, storages, bytes, workspace, device, purity) and
for a Decision replays what the rewrite would produce -- which nodes each
graph keeps, in which order, which values forward saves, where backward
runs each clone -- and walks that sequence with memory.py's rules (storages
live from their producer to their last reader, outputs kept, views free,
graph inputs not counted, workspace counted while its op runs).

It covers what the budgeted frontier mostly asks for: plans that save and
recompute, random recomputes replaying a saved generator state included,
values recomputed more than once (Decision.again: one copy per range of
backward steps, each reader reading the copy serving its step, earlier
copies with storages of their own or, for views, their input copy's),
simulated unfused (``compiler="eager"``). It declines (``peak`` returns
None, and the caller rewrites for real) plans that offload, Inductor's fused
model, graphs with in-place ops or seeds, and recomputes whose clones would
make the rewrite move forward nodes. The pipeline checks its answer on the
plan that runs, against the real rewrite and simulation.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch.fx as fx

from fxckpt.memory import inlined_keys
from fxckpt.passes.model_nodes import ModelNode, read_joint, rng_calls_impure
from fxckpt.types import Decision, Profile, copy_recomputed_name, recomputed_name


@dataclass(frozen=True)
class Simulated:
    """What the frontier keeps of a plan the model simulated: no graphs, the
    generator-state bytes forward saves (as Rewritten has them)."""

    rng_state_bytes: dict[str, int]


@dataclass(frozen=True)
class ModelTimeline:
    peak_bytes: int
    peak_at: str
    fused: bool = False
    sink_growing: bool | None = None   # the backward order that peaks lower


@dataclass
class _Walk:
    live: dict = field(default_factory=dict)
    not_counted: set = field(default_factory=set)
    peak: int = 0
    peak_at: str = ""
    total: int = 0                  # sum of live's bytes


class ScheduleModel:
    """Built by ``build``; ``peak(decision)`` -> ModelTimeline or None."""

    def __init__(self, nodes: list[ModelNode], fwd_outputs: list[int], bwd_outputs: list[int],
                 first_backward: int, *, sinks: bool = False, fused: bool = False) -> None:
        self.nodes = nodes
        # Inductor's inlining (memory.py's fused=True): pointwise values
        # their readers compute in their own kernels are never allocated.
        self.fused = fused
        # The rewrite's backward orders (rewrite.rewrite_orders): without and,
        # where ``sinks``, with growing nodes sunk; a plan peaks at the lower.
        self.orders = (False, True) if sinks else (False,)
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.fwd_outputs, self.bwd_outputs = fwd_outputs, bwd_outputs
        self.first_backward = first_backward
        self.inputs = {i: node.inputs for i, node in enumerate(nodes)}
        self.primals = [i for i, n in enumerate(nodes) if n.kind == "primal"]
        self.tangents = [i for i, n in enumerate(nodes) if n.kind == "tangent"]
        self.kinds = [n.kind for n in nodes]
        self.storages = [n.storages for n in nodes]
        # Kept by dead-code elimination (random ops too), by the backward
        # schedule (random ops not): see _impure.
        self.impure = {i for i, n in enumerate(nodes) if n.impure}
        self.side_effect = {i for i, n in enumerate(nodes) if n.side_effect}
        self.forward_nodes = _forward_nodes(nodes, self.primals)
        self.users: list[list[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for a in dict.fromkeys(node.inputs):
                self.users[a].append(i)
        # Backward steps (Decision.again's): each backward node's index
        # among the backward nodes, in graph order.
        self.steps = {i: k for k, i in enumerate(i for i, n in enumerate(nodes) if n.backward)}
        # Whether dead-code elimination keeps a replay nobody reads.
        self.replay_impure, self.pair_impure = rng_calls_impure()

    def state_bytes(self, decision: Decision) -> dict[str, int]:
        """Generator-state bytes forward saves, by random recomputed value."""
        return {n: self.nodes[self.index[n]].state_bytes for n in decision.recomputed
                if self.nodes[self.index[n]].state_bytes}

    def peak(self, decision: Decision) -> ModelTimeline | None:
        if decision.offloaded:
            return None
        recomputed = sorted(self.index[n] for n in decision.recomputed)
        saved = {self.index[n] for n in decision.saved}
        states = [("state", r) for r in recomputed if self.nodes[r].state_bytes]
        tangents = self.tangents
        placeholders = sorted(saved) + states + tangents
        again = {self.index[n]: steps for n, steps in decision.again}
        order, inputs, copies = self._edited(recomputed, again)
        forward_nodes = self.forward_nodes
        if any(a >= self.first_backward for r in recomputed for a in self.nodes[r].inputs):
            # Copies read forward-side values the joint graph placed among
            # backward nodes: the rewrite moves those up (and so forward runs
            # them in another order).
            order = _placed(order, inputs)
            position = {key: p for p, key in enumerate(order)}
            forward_nodes = sorted(forward_nodes, key=position.__getitem__)
            # Forward saves values in the edited graph's order.
            placeholders = sorted(saved, key=position.__getitem__) + states + tangents
        inputs.update((p, ()) for p in placeholders)  # backward's inputs read nothing
        outputs = [copies[o][-1][1] if o in copies else o for o in self.bwd_outputs]
        pairs = {r for _, r in states}  # forward runs these as run_and_save_rng_state
        # Saved values backward does not read are dropped from both graphs
        # (the same whichever the order).
        used, orders = self._backward(order, inputs, placeholders, outputs, pairs, self.orders)
        saved_used = [p for p in placeholders if p in used and p not in tangents]
        placeholders = saved_used + tangents
        fwd, kept = self._forward(saved_used, pairs, forward_nodes)
        walk = _Walk()
        primals = self.primals
        walk.not_counted.update(ref for i in primals for ref, _ in self.nodes[i].storages)
        fwd_inputs = {i: self.nodes[i].inputs for i in fwd}
        self._run(primals + fwd, fwd_inputs, self._refs(kept), walk, "forward", set(primals),
                  pairs, self._inlined(fwd, fwd_inputs, kept, pairs))
        for p in placeholders:
            self._allocate(p, walk)
        best, sink = None, None
        outside = set(placeholders)
        for (bwd, after), order in zip(orders, self.orders):
            walked = _Walk(dict(walk.live), set(walk.not_counted), walk.peak, walk.peak_at,
                           walk.total)
            sequence = [k for p in placeholders for k in (p, *after.get(p, ()))] + bwd
            # Autograd holds the incoming gradients until backward returns.
            self._run(sequence, inputs, self._refs(outputs + tangents), walked, "backward",
                      outside, set(), self._inlined(sequence, inputs, outputs, pairs, outside))
            if best is None or walked.peak < best.peak:
                best, sink = walked, order
        return ModelTimeline(best.peak, best.peak_at, fused=self.fused, sink_growing=sink)

    # --- the rewrite, replayed ---------------------------------------------

    def _edited(self, recomputed: list[int], again: dict):
        """The edited joint graph's order (copies in front of the first
        backward node: ("clone", i) the last copy of value i, ("copy", i, j)
        its earlier ones), every node's inputs after backward was pointed at
        the copies serving its step, and each value's copies as [(first step
        served, copy)]. Every copy's storages (its own, or views of its
        inputs' copies) go to ``self.fresh``."""
        need = self._first_needs(recomputed)
        copies: dict[int, list] = {}
        inputs: dict = {}
        self.fresh = {}
        for r in recomputed:
            starts = [need[r], *(s for s in again.get(r, ()) if s > need[r])]
            made = []
            for j, start in enumerate(starts):
                key = ("clone", r) if j == len(starts) - 1 else ("copy", r, j)
                mapped = tuple(_pick(a, start, copies) for a in self.nodes[r].inputs)
                self.fresh[key] = self._fresh_storages(key, mapped)
                if self.nodes[r].state_bytes:
                    mapped = (("state", r),) + mapped
                inputs[key] = tuple(dict.fromkeys(mapped))
                made.append((start, key))
            copies[r] = made
        inputs.update(self.inputs)
        for u in {u for r in recomputed for u in self.users[r] if self.nodes[u].backward}:
            inputs[u] = tuple(dict.fromkeys(_pick(a, self.steps[u], copies)
                                            for a in self.nodes[u].inputs))
        order = list(range(self.first_backward)) \
            + [key for r in recomputed for _, key in copies[r]] \
            + list(range(self.first_backward, len(self.nodes)))
        return order, inputs, copies

    def _first_needs(self, recomputed: list[int]) -> dict[int, int]:
        """The first backward step needing each recomputed value: reading
        it, or a recomputed value backward needs (rewrite.py's rule)."""
        chosen = set(recomputed)
        need = {r: min((self.steps[u] for u in self.users[r] if u in self.steps),
                       default=len(self.steps)) for r in recomputed}
        for r in reversed(recomputed):
            for u in self.users[r]:
                if u in chosen:
                    need[r] = min(need[r], need[u])
        return need

    def _fresh_storages(self, key, mapped: tuple) -> tuple:
        """A copy's storages: its own, or where the op is a view, those of
        the (copy of the) input it reads -- never the original's, which a
        saved view of it can keep alive."""
        node = self.nodes[key[1]]
        found = []
        for p, ((_, nbytes), alias) in enumerate(zip(node.storages, node.aliases)):
            if alias is None:
                found.append(((*key, p), nbytes))
            else:
                found.append((self._storages(mapped[alias[0]])[alias[1]][0], nbytes))
        return tuple(found)

    def _backward(self, order, inputs, placeholders: list, outputs: list, pairs: set,
                  sinks: tuple = (False,)) -> tuple[set, list]:
        """The values backward reads (the placeholders among them are those
        its extraction keeps), and per backward order in ``sinks``:
        backward's nodes in the order the just-in-time schedule runs them
        (a sink: growing nodes and their views wait for a user) and each
        placeholder's elements taken out right after it. What the orders
        share (which nodes backward keeps) is found once."""
        valid, kept = set(placeholders), []
        kinds = self.kinds
        for key in order:
            if key in valid or (key[0] == "state" if key.__class__ is tuple
                                else kinds[key] != "op"):
                continue
            if all(a in valid for a in inputs[key]):
                valid.add(key)
                kept.append(key)
        dce = _ancestors(outputs + self._impure_among(kept, True, pairs), inputs)
        outside = set(placeholders)
        used = {a for k in dce if k not in outside for a in inputs[k]} | set(outputs)
        needed = _ancestors(outputs + [k for k in self._impure_among(kept, False, pairs)
                                       if k in dce], inputs)
        # A tuple's elements are taken out right after it (rewrite.py).
        elements: dict = {}
        for key in kept:
            if key in needed and self.nodes[key[1] if isinstance(key, tuple) else key].getitem:
                for a in inputs[key]:
                    elements.setdefault(a, []).append(key)

        return used, [self._scheduled(kept, needed, inputs, placeholders, outputs, pairs,
                                      elements, sink) for sink in sinks]

    def _scheduled(self, kept: list, needed: set, inputs, placeholders: list, outputs: list,
                   pairs: set, elements: dict, sink: bool):
        """One backward order of ``_backward``."""
        grown = self._grown(kept, needed, pairs) if sink else set()
        emitted: set = set(placeholders)
        sequence: list = []

        def emit(key) -> None:
            if key in emitted:
                return
            # A grown input last: it is not held while recomputes run.
            for a in sorted(inputs[key], key=grown.__contains__) if grown else inputs[key]:
                emit(a)
            emitted.add(key)
            sequence.append(key)
            for element in elements.get(key, ()):
                emit(element)

        after = {}  # placeholder -> its elements, taken out right after it
        for p in placeholders:
            sequence = []
            for element in elements.get(p, ()):
                emit(element)
            if sequence:
                after[p] = sequence
        sequence = []
        for key in kept:
            if key in needed and key not in grown \
                    and not (isinstance(key, tuple) and key[0] != "state"):
                emit(key)
        # The output node runs last and emits what is still waiting (a grown
        # gradient nothing else reads), grown inputs last.
        for key in sorted(dict.fromkeys(outputs), key=lambda a: a in grown):
            emit(key)
        # ``emit`` refers to itself (it recurses): a reference cycle that
        # would hold everything it reads (a plan's inputs and sequences:
        # some 300,000 objects over a 58-layer GPT's frontier) for Python's
        # cyclic collector. Cleared, they are freed as this returns.
        emit = None
        return sequence, after

    def _grown(self, kept: list, needed: set, pairs: set) -> set:
        """rewrite._grown: backward's own nodes that grow memory, and views
        of them."""
        grown: set = set()
        for key in kept:
            if isinstance(key, tuple) or key not in needed or self._impure(key, False, pairs):
                continue
            node = self.nodes[key]
            if node.grows or (not node.allocates and any(a in grown for a in node.inputs)):
                grown.add(key)
        return grown

    def _forward(self, saved_used: list, pairs: set, kept: list):
        """Forward's nodes in order (``kept``: the forward nodes AOTAutograd
        keeps, in the edited graph's order), and its outputs (kept to the
        end)."""
        outputs = list(self.fwd_outputs) + saved_used
        roots = [o[1] if isinstance(o, tuple) else o for o in outputs]
        inputs = {i: self.nodes[i].inputs for i in kept}
        live = _ancestors(roots + [i for i in kept if self._impure(i, True, pairs)], inputs)
        return [i for i in kept if i in live], outputs

    # --- the walk, as memory.py does it ------------------------------------

    def _name(self, key, pairs) -> str:
        """The node's name in the rewritten graph."""
        if isinstance(key, tuple):
            name = self.nodes[key[1]].name
            return copy_recomputed_name(name, key[2]) if key[0] == "copy" \
                else recomputed_name(name)
        if key in pairs:  # named by FX as the rewrite creates them, in order
            k = sorted(pairs).index(key)
            return "run_and_save_rng_state" + (f"_{k}" if k else "")
        return self.nodes[key].name

    def _kind(self, key) -> str:
        return "op" if isinstance(key, tuple) and key[0] != "state" else \
            "state" if isinstance(key, tuple) else self.nodes[key].kind

    def _impure(self, key, random: bool, pairs: set) -> bool:
        """Kept by dead-code elimination (``random``: FX's default, random
        ops kept) or by the backward schedule (random ops dropped). A random
        op forward replaces by run_and_save_rng_state is pure."""
        if isinstance(key, tuple):
            return random and self.nodes[key[1]].state_bytes > 0 and self.replay_impure
        if key in pairs:
            return self.pair_impure
        node = self.nodes[key]
        return node.impure if random else node.side_effect

    def _impure_among(self, keys: list, random: bool, pairs: set) -> list:
        """The keys ``_impure`` says are kept, in order (sets, not a call
        per key: most keys are pure)."""
        ids = self.impure if random else self.side_effect
        replays = random and self.replay_impure
        return [k for k in keys
                if (k.__class__ is tuple and replays and self.nodes[k[1]].state_bytes > 0)
                or (k in pairs and self.pair_impure) or (k in ids and k not in pairs)]

    def _inlined(self, sequence: list, inputs: dict, outputs, pairs: set,
                 placeholders: set = frozenset()) -> set:
        """The keys of one graph's ops (``sequence`` without its
        ``placeholders``, in order) that Inductor computes inside their
        readers (memory.inlined_keys, as memory.py applies it to the
        rewritten graph), or none unless fused. A random op forward runs as
        run_and_save_rng_state, and its copies run by run_with_rng_state,
        are calls of their own, never inlined."""
        if not self.fused:
            return set()
        nodes = self.nodes
        ops = [k for k in sequence if k not in placeholders]
        within = set(ops)
        users: dict = {}
        for key in ops:
            for a in inputs.get(key, ()):
                if a in within:
                    users.setdefault(a, []).append(key)

        def node_of(key):
            return nodes[key[1]] if key.__class__ is tuple else nodes[key]

        def fuses(key):
            if key.__class__ is tuple:
                return key[0] != "state" and node_of(key).fuses and not node_of(key).state_bytes
            return key not in pairs and nodes[key].fuses

        return inlined_keys(
            ops, inputs=lambda k: inputs.get(k, ()),
            users=lambda k: users.get(k, ()), outputs=set(outputs), fuses=fuses,
            reduction=lambda k: not (k.__class__ is tuple and k[0] == "state")
            and node_of(k).reduction,
            op=lambda k: node_of(k).op, cpu=lambda k: node_of(k).cpu)

    def _storages(self, key) -> tuple:
        if isinstance(key, tuple) and key[0] == "state":
            return ((-1 - key[1], self.nodes[key[1]].state_device_bytes),)
        if isinstance(key, tuple):  # a copy or the clone
            return self.fresh[key]
        return self.nodes[key].storages

    def _refs(self, keys) -> set:
        return {ref for k in keys for ref, _ in self._storages(k)}

    def _allocate(self, key, walk: _Walk, extra=(), storages=None) -> None:
        node = self.nodes[key[1] if isinstance(key, tuple) else key]
        if not node.counted:
            return
        found = self._storages(key) if storages is None else storages
        for ref, nbytes in found + tuple(extra):
            if ref not in walk.live and ref not in walk.not_counted:
                walk.live[ref] = nbytes
                walk.total += nbytes

    def _run(self, sequence, inputs, keep: set, walk: _Walk, phase: str,
             placeholders: set, pairs: set, inlined: set = frozenset()) -> None:
        """memory.py's walk of one graph; ``pairs``: random nodes forward
        runs as run_and_save_rng_state, allocating their generator state;
        ``inlined``: keys never allocated (fused). (``_allocate``, inlined:
        this loop is most of a candidate's time.)"""
        memo: dict = {}
        storages, own = self._storages, self.storages

        def storages_of(key):
            if key.__class__ is int:
                return own[key]
            found = memo.get(key)
            if found is None:
                found = memo[key] = storages(key)
            return found

        found_at = [storages_of(key) for key in sequence]
        last: dict = {}
        first = last.setdefault
        for index, key in enumerate(sequence):
            for ref, _ in found_at[index]:
                first(ref, index)
            if key in pairs:
                first(-1 - key, index)
            for arg in inputs.get(key, ()):
                for ref, _ in storages_of(arg):
                    last[ref] = index
        frees: dict[int, list] = {}
        for ref, index in last.items():
            if ref not in keep:
                frees.setdefault(index, []).append(ref)
        nodes, live, not_counted = self.nodes, walk.live, walk.not_counted
        total, peak, peak_key = walk.total, walk.peak, None
        for index, key in enumerate(sequence):
            copy = key.__class__ is tuple
            node = nodes[key[1]] if copy else nodes[key]
            if node.counted and key not in inlined:
                found = found_at[index]
                if key in pairs:
                    found = found + ((-1 - key, node.state_device_bytes),)
                for ref, nbytes in found:
                    if ref not in live and ref not in not_counted:
                        live[ref] = nbytes
                        total += nbytes
            now = total
            if key not in placeholders:
                now += node.workspace
                if copy and node.state_device_bytes:
                    now += node.state_device_bytes  # a replay holds the state it replaces
            if now > peak:
                peak, peak_key = now, key
            for ref in frees.get(index, ()):
                total -= live.pop(ref, 0)
        walk.total, walk.peak = total, peak
        if peak_key is not None:
            walk.peak_at = f"{phase}:{self._name(peak_key, pairs)}"


def _pick(value, step: int, copies: dict):
    """What a reader needing ``value`` at backward ``step`` reads: the last
    of its copies begun by then (the first if none is), or the value."""
    made = copies.get(value)
    if made is None:
        return value
    k = bisect.bisect_right([start for start, _ in made], step) - 1
    return made[max(k, 0)][1]


def _placed(order: list, inputs: dict) -> list:
    """``order`` with each node moved after its inputs, as the rewrite's
    ``_ensure_topological`` moves them: a node whose input comes later gets
    that input (after the input's own, recursively) right in front of it;
    everything else keeps its order. Keys not in ``order`` (generator
    states) count as placed."""
    within = set(order)
    placed: set = set()
    moved: list = []
    for key in order:
        if key in placed:
            continue
        # Post-order walk: a node's unplaced inputs, in argument order, each
        # after its own, then the node.
        stack = [(key, iter(inputs.get(key, ())))]
        while stack:
            node, pending = stack[-1]
            for parent in pending:
                if parent in within and parent not in placed:
                    stack.append((parent, iter(inputs.get(parent, ()))))
                    break
            else:
                stack.pop()
                placed.add(node)
                moved.append(node)
    return moved


def _forward_nodes(nodes: list[ModelNode], primals: list[int]) -> list[int]:
    """The forward ops AOTAutograd's extraction keeps (those the primals
    reach), in order: what forward runs before dead-code elimination."""
    valid, kept = set(primals), []
    for i, node in enumerate(nodes):
        if node.kind == "op" and not node.backward and all(a in valid for a in node.inputs):
            valid.add(i)
            kept.append(i)
    return kept


def _ancestors(roots, inputs) -> set:
    """``roots`` and what they read, through ``inputs``."""
    seen: set = set()
    stack = list(roots)
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        stack.extend(inputs.get(key, ()))
    return seen


def build(joint: fx.GraphModule, profile: Profile, *, num_fwd_outputs: int,
          sinks: bool = False, fused: bool = False) -> ScheduleModel | None:
    """The model of ``joint`` (the graph ``rewrite`` is given), or None for
    a graph it does not cover. ``sinks``: plans are rewritten in both
    backward orders (rewrite.rewrite_orders) and peak at the lower.
    ``fused``: simulated as memory.simulate(fused=True) does (Inductor)."""
    read = read_joint(joint, profile, num_fwd_outputs=num_fwd_outputs)
    if read is None:
        return None
    return ScheduleModel(read.nodes, read.fwd_outputs, read.bwd_outputs, read.first_backward,
                         sinks=sinks, fused=fused)

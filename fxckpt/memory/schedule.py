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
runs each clone -- and walks that sequence with memory/model.py's rules
(storages live from their producer to their last reader, outputs kept,
views free, graph inputs not counted, workspace counted while its op runs),
as arrays, by memory/walk.py. This module replays; the walk is
memory/schedule_walk.py's (KeyWalk, ScheduleModel's other half).

It covers what the budgeted frontier mostly asks for: plans that save and
recompute, random recomputes replaying a saved generator state included,
values recomputed more than once (Decision.copy_steps: one copy per range of
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
from dataclasses import dataclass

import numpy as np

import torch.fx as fx

from fxckpt.memory.walk import Rows, Walk
from fxckpt.memory.model_nodes import ModelNode, read_joint, rng_calls_impure
from fxckpt.memory.schedule_walk import Key, KeyWalk
from fxckpt.types import Decision, Profile


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
    # Bytes live as backward starts: what forward left and backward's inputs
    # (saved values, generator states, incoming gradients). The same for
    # every plan with this saved set, whatever it recomputes or when, and
    # none of them peaks lower (the frontier's recompute-again stage).
    held_at_backward: int = 0


class ScheduleModel(KeyWalk):
    """Built by ``build``; ``peak(decision)`` -> ModelTimeline or None."""

    def __init__(self, nodes: list[ModelNode], fwd_outputs: list[int], bwd_outputs: list[int],
                 first_backward: int, *, sinks: bool = False, fused: bool = False) -> None:
        self.nodes = nodes
        # Inductor's inlining (memory/model.py's fused=True): pointwise values
        # their readers compute in their own kernels are never allocated.
        self.fused = fused
        # The rewrite's backward orders (rewrite.rewrite_orders): without and,
        # where ``sinks``, with growing nodes sunk; a plan peaks at the lower.
        self.orders = (False, True) if sinks else (False,)
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.fwd_outputs, self.bwd_outputs = fwd_outputs, bwd_outputs
        self.first_backward = first_backward
        self.inputs = {i: node.inputs for i, node in enumerate(nodes)}
        # Each node's inputs without repeats, in order.
        self.distinct_inputs = [tuple(dict.fromkeys(node.inputs)) for node in nodes]
        self.primals = [i for i, n in enumerate(nodes) if n.kind == "primal"]
        self.tangents = [i for i, n in enumerate(nodes) if n.kind == "tangent"]
        self.not_ops = {i for i, n in enumerate(nodes) if n.kind != "op"}
        # Input mutations: AOTAutograd's extraction keeps them out of backward.
        self.forward_only = {i for i, n in enumerate(nodes) if n.forward_only}
        self.storages = [n.storages for n in nodes]
        # Kept by dead-code elimination (random ops too), by the backward
        # schedule (random ops not): see _impure.
        self.impure = {i for i, n in enumerate(nodes) if n.impure}
        self.side_effect = {i for i, n in enumerate(nodes) if n.side_effect}
        self.getitem = {i for i, n in enumerate(nodes) if n.getitem}
        self.forward_nodes = _forward_nodes(nodes, self.primals)
        # What forward's kept nodes read (whatever their order), its impure
        # ones, and what its own outputs read: the same for every plan.
        self.forward_inputs = {i: nodes[i].inputs for i in self.forward_nodes}
        self.forward_impure = [i for i in self.forward_nodes if nodes[i].impure]
        self.forward_live = _ancestors(fwd_outputs, self.forward_inputs)
        # Nodes reading a node the joint graph placed among backward's.
        self.reads_late = {i for i, n in enumerate(nodes)
                           if any(a >= first_backward for a in n.inputs)}
        self.users: list[list[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for a in dict.fromkeys(node.inputs):
                self.users[a].append(i)
        # The same for every plan, so read once: each node's backward
        # readers (those the rewrite points at copies), and, as rows of
        # numbers for _run, the storages each node names and those it reads
        # as the joint graph has it (what _run frees by).
        self.backward_users = [[u for u in users if nodes[u].backward] for users in self.users]
        self.named_rows = Rows.of(self.storages, 2)
        self.read_rows = Rows.of([_reads(node.inputs, self.storages.__getitem__)
                                  for node in nodes], 1)
        # _copy's storages of copies of nodes making all theirs, by key.
        self.own_fresh: dict = {}
        self.makes_own = [not any(n.aliases) for n in nodes]
        # Per node, for _run's arrays.
        self.workspace = np.array([n.workspace for n in nodes], np.int64)
        self.state_device = np.array([n.state_device_bytes for n in nodes], np.int64)
        self.counted = np.array([n.counted for n in nodes], bool)
        self.ref_offset = len(nodes)  # generator states' references are -1 - node
        self.copy_keys: dict = {}  # _copies_of's earlier copies, by node
        self.clone_keys = [Key("clone", i, None) for i in range(len(nodes))]
        self.state_keys = [Key("state", i, None) for i in range(len(nodes))]
        # Copies' own storages are numbered after the joint graph's, once
        # for the model's life (_fresh_storages).
        self.fresh_refs: dict = {}  # by (key, position)
        self.first_fresh_ref = 1 + max((ref for found in self.storages for ref, _ in found),
                                       default=-1)
        # Backward steps (Decision.copy_steps's): each backward node's index
        # among the backward nodes, in graph order.
        self.steps = {i: k for k, i in enumerate(i for i, n in enumerate(nodes) if n.backward)}
        # Each node's first backward step reading it (_first_needs).
        self.first_read = [min((self.steps[u] for u in users if u in self.steps),
                               default=len(self.steps)) for users in self.users]
        # Whether dead-code elimination keeps a replay nobody reads.
        self.replay_impure, self.pair_impure = rng_calls_impure()

    def _copies_of(self, node: int, count: int) -> list[Key]:
        """The _Keys of ``count`` copies of ``node``: ("copy", node, j)
        for the earlier ones, the clone last."""
        earlier = self.copy_keys.setdefault(node, [])
        while len(earlier) < count - 1:
            earlier.append(Key("copy", node, len(earlier)))
        return [*earlier[:count - 1], self.clone_keys[node]]

    def state_bytes(self, decision: Decision) -> dict[str, int]:
        """Generator-state bytes forward saves, by random recomputed value."""
        return {n: self.nodes[self.index[n]].state_bytes for n in decision.recomputed
                if self.nodes[self.index[n]].state_bytes}

    def peak(self, decision: Decision) -> ModelTimeline | None:
        if decision.offloaded:
            return None
        recomputed = sorted(self.index[n] for n in decision.recomputed)
        saved = {self.index[n] for n in decision.saved}
        states = [self.state_keys[r] for r in recomputed if self.nodes[r].state_bytes]
        tangents = self.tangents
        placeholders = sorted(saved) + states + tangents
        again = {self.index[n]: steps for n, steps in decision.copy_steps}
        order, inputs, copies, changed = self._edited(recomputed, again)
        forward_nodes = self.forward_nodes
        if not self.reads_late.isdisjoint(recomputed):
            # Copies read forward-side values the joint graph placed among
            # backward nodes: the rewrite moves those up (and so forward runs
            # them in another order).
            order = _placed(order, inputs)
            position = {key: p for p, key in enumerate(order)}
            forward_nodes = sorted(forward_nodes, key=position.__getitem__)
            # Forward saves values in the edited graph's order.
            placeholders = sorted(saved, key=position.__getitem__) + states + tangents
        inputs.update((p, ()) for p in placeholders)  # backward's inputs read nothing
        # What each key reads, for backward's walks: the joint graph's reads
        # but where the rewrite changed a key's inputs (_reads, inlined).
        own, fresh = self.storages, self.fresh
        reads = {key: [ref for a in inputs[key]
                       for ref, _ in (own[a] if a.__class__ is int else fresh[a])]
                 for key in (*changed, *placeholders)}
        outputs = [copies[o][-1][1] if o in copies else o for o in self.bwd_outputs]
        pairs = {s.node for s in states}  # forward runs these as run_and_save_rng_state
        # Saved values backward does not read are dropped from both graphs
        # (the same whichever the order).
        used, kept, needed, elements = self._backward(order, inputs, placeholders, outputs,
                                                      pairs)
        saved_used = [p for p in placeholders if p in used and p not in tangents]
        placeholders = saved_used + tangents
        fwd, fwd_kept = self._forward(saved_used, pairs, forward_nodes)
        walk = Walk()
        primals = self.primals
        walk.not_counted.update(ref for i in primals for ref, _ in self.nodes[i].storages)
        fwd_inputs = {i: self.nodes[i].inputs for i in fwd} if self.fused else {}  # _inlined's
        self._run(primals + fwd, {}, self._refs(fwd_kept), walk, "forward",
                  set(primals), pairs, self._inlined(fwd, fwd_inputs, fwd_kept, pairs))
        for p in placeholders:
            self._allocate(p, walk)
        held = walk.total
        best, sink = None, None
        outside = set(placeholders)
        last = None  # the unsunk order's walked sequence and where it peaked
        for order in self.orders:
            grown = self._grown(kept, needed, pairs) if order else set()
            if last is not None and _peaked_before(grown, *last):
                # The sunk order runs the unsunk one's steps up to where the
                # unsunk one began its first grown node (the copies it reads
                # run there too, just in time), each freeing at most what it
                # freed (the same steps follow, in another order): it peaks
                # no lower. (Most plans: all 42 of the 8-layer compile-suite
                # GPT's frontier.)
                break
            begun: dict = {}
            bwd, after = self._scheduled(kept, needed, inputs, placeholders, outputs, pairs,
                                         elements, grown, begun)
            walked = walk.copy()
            sequence = [k for p in placeholders for k in (p, *after.get(p, ()))]
            begun = {key: len(sequence) + step for key, step in begun.items()}
            sequence += bwd
            # Autograd holds the incoming gradients until backward returns.
            peaked = self._run(sequence, reads, self._refs(outputs + tangents), walked,
                               "backward", outside, set(),
                               self._inlined(sequence, inputs, outputs, pairs, outside))
            if best is None or walked.peak < best.peak:
                best, sink = walked, order
            last = begun, peaked
        return ModelTimeline(best.peak, best.peak_at, fused=self.fused, sink_growing=sink,
                             held_at_backward=held)

    # --- the rewrite, replayed ---------------------------------------------

    def _edited(self, recomputed: list[int], again: dict):
        """The edited joint graph's order (copies in front of the first
        backward node: the _Keys ("clone", i) the last copy of value i,
        ("copy", i, j) its earlier ones), every node's inputs after backward
        was pointed at the copies serving its step, each value's copies as
        [(first step served, copy)], and the keys whose inputs differ from
        the joint graph's (the copies and their backward readers). Every
        copy's storages (its own, or views of its inputs' copies) go to
        ``self.fresh``, as do the generator states the copies read."""
        need = self._first_needs(recomputed)
        if not again:
            return self._edited_once(recomputed, need)
        copies: dict[int, list] = {}
        # Values with one copy (most: all, without Decision.copy_steps) read as
        # that copy, without _pick's search.
        clone: dict = {}
        begins: dict = {}  # values with several copies: their first steps
        inputs: dict = {}
        fresh = self.fresh = {}
        for r in recomputed:
            if self.nodes[r].state_bytes:
                state = self.state_keys[r]
                fresh[state] = self._storages(state)
            extra = again.get(r)
            if extra is None:  # one copy, the clone (most values)
                key = self.clone_keys[r]
                fresh[key], inputs[key] = self._copy(
                    key, self._picked(self.nodes[r].inputs, need[r], copies, clone, begins))
                copies[r], clone[r] = [(need[r], key)], key
                continue
            starts = [need[r], *(s for s in extra if s > need[r])]
            if len(starts) > 1:
                begins[r] = starts
            made = list(zip(starts, self._copies_of(r, len(starts))))
            read = self.nodes[r].inputs
            for start, key in made:
                fresh[key], inputs[key] = self._copy(
                    key, self._picked(read, start, copies, clone, begins))
            copies[r] = made
            if len(made) == 1:
                clone[r] = made[0][1]
        changed = list(inputs)
        inputs.update(self.inputs)
        users = {u for r in recomputed for u in self.backward_users[r]}
        for u in users:
            inputs[u] = tuple(dict.fromkeys(self._picked(self.nodes[u].inputs, self.steps[u],
                                                         copies, clone, begins)))
        order = list(range(self.first_backward)) \
            + [key for r in recomputed for _, key in copies[r]] \
            + list(range(self.first_backward, len(self.nodes)))
        return order, inputs, copies, changed + list(users)

    def _edited_once(self, recomputed: list[int], need: dict[int, int]):
        """``_edited`` where every recomputed value has one copy, its clone
        (no Decision.copy_steps): each reader reads it, whatever its step. The
        same answer, by the joint graph's inputs read once (``distinct``),
        as a plan's copies and their readers run into the thousands (a
        64-layer GPT)."""
        clone_keys, state_keys, nodes = self.clone_keys, self.state_keys, self.nodes
        own_fresh, makes_own, distinct = self.own_fresh, self.makes_own, self.distinct_inputs
        clone: dict = {}
        get = clone.get
        copies: dict[int, list] = {}
        inputs: dict = {}
        fresh = self.fresh = {}
        for r in recomputed:
            key = clone_keys[r]
            found = own_fresh.get(key)
            if found is None:
                read = nodes[r].inputs
                found = self._fresh_storages(key, tuple(map(get, read, read)))
                if makes_own[r]:
                    own_fresh[key] = found
            read = distinct[r]
            read = tuple(map(get, read, read))
            if nodes[r].state_bytes:
                state = state_keys[r]
                fresh[state] = self._storages(state)
                read = (state,) + read
            fresh[key], inputs[key] = found, read
            copies[r], clone[r] = [(need[r], key)], key
        changed = list(inputs)
        inputs.update(self.inputs)
        users = {u for r in recomputed for u in self.backward_users[r]}
        for u in users:
            read = distinct[u]
            inputs[u] = tuple(map(get, read, read))
        order = list(range(self.first_backward)) + [clone[r] for r in recomputed] \
            + list(range(self.first_backward, len(self.nodes)))
        return order, inputs, copies, changed + list(users)

    def _copy(self, key, mapped: tuple) -> tuple:
        """A copy's storages (``_fresh_storages``) and inputs, given the
        values and copies it reads (``mapped``). Where the op makes all its
        storages (no views) they depend on ``key`` alone, and are
        remembered: plans recompute mostly the same values."""
        found = self.own_fresh.get(key)
        if found is None:
            found = self._fresh_storages(key, mapped)
            if self.makes_own[key.node]:
                self.own_fresh[key] = found
        if self.nodes[key.node].state_bytes:
            mapped = (self.state_keys[key.node],) + mapped
        return found, tuple(dict.fromkeys(mapped))

    @staticmethod
    def _picked(values: tuple, step: int, copies: dict, clone: dict, begins: dict) -> tuple:
        """``_pick`` of each of ``values``; ``clone``: the values with one
        copy (their pick whatever the step), ``begins`` those of the others
        (and their copies' first steps)."""
        if begins.keys().isdisjoint(values):
            return tuple(map(clone.get, values, values))
        return tuple(a if a not in copies else clone[a] if a in clone
                     else _pick(a, step, copies, begins) for a in values)

    def _first_needs(self, recomputed: list[int]) -> dict[int, int]:
        """The first backward step needing each recomputed value: reading
        it, or a recomputed value backward needs (rewrite.py's rule)."""
        chosen = set(recomputed)
        first_read = self.first_read
        need = {r: first_read[r] for r in recomputed}
        for r in reversed(recomputed):
            for u in self.users[r]:
                if u in chosen:
                    need[r] = min(need[r], need[u])
        return need

    def _fresh_storages(self, key, mapped: tuple) -> tuple:
        """A copy's storages: its own, or where the op is a view, those of
        the (copy of the) input it reads -- never the original's, which a
        saved view of it can keep alive."""
        node = self.nodes[key.node]
        own, fresh = self.storages, self.fresh
        found = []
        for p, ((_, nbytes), alias) in enumerate(zip(node.storages, node.aliases)):
            if alias is None:
                ref = self.fresh_refs.get((key, p))
                if ref is None:
                    ref = self.fresh_refs[key, p] = self.first_fresh_ref + len(self.fresh_refs)
                found.append((ref, nbytes))
            else:
                # A copy reads values and copies, never generator states.
                read = mapped[alias[0]]
                read = own[read] if read.__class__ is int else fresh[read]
                found.append((read[alias[1]][0], nbytes))
        return tuple(found)

    def _backward(self, order, inputs, placeholders: list, outputs: list, pairs: set
                  ) -> tuple[set, list, set, dict]:
        """The values backward reads (the placeholders among them are those
        its extraction keeps), and what each backward order (``_scheduled``)
        is made from: the nodes backward keeps, in order; those it runs;
        and each tuple's elements, taken out right after it."""
        # The order holds copies (never generator states) and the joint
        # graph's nodes: ops, and the others (graph inputs) never kept.
        valid, kept = set(placeholders), []
        skipped = valid | self.not_ops | self.forward_only
        for key in order:
            if key not in skipped and valid.issuperset(inputs[key]):
                valid.add(key)
                kept.append(key)
        # Dead-code elimination keeps what the outputs and impure nodes read
        # (``dce``), the schedule what the outputs and side effects read
        # (``needed``). Side effects are impure, so ``dce`` is ``needed`` and
        # what the impure rest reads besides: one walk of the graph, not two.
        impure, side_effects = (self._impure_among(kept, True, pairs),
                                self._impure_among(kept, False, pairs))
        if set(side_effects).issubset(impure):
            needed = _ancestors(outputs + side_effects, inputs)
            dce = _ancestors(impure, inputs, needed)
        else:
            dce = _ancestors(outputs + impure, inputs)
            needed = _ancestors(outputs + [k for k in side_effects if k in dce], inputs)
        outside = set(placeholders)
        used = {a for k in dce if k not in outside for a in inputs[k]} | set(outputs)
        # A tuple's elements are taken out right after it (rewrite.py).
        elements: dict = {}
        getitem = self.getitem
        for key in kept:
            if key in needed and (key.node if key.__class__ is Key else key) in getitem:
                for a in inputs[key]:
                    elements.setdefault(a, []).append(key)

        return used, kept, needed, elements

    def _scheduled(self, kept: list, needed: set, inputs, placeholders: list, outputs: list,
                   pairs: set, elements: dict, grown: set, begun: dict):
        """One backward order of what ``_backward`` keeps: the sunk one where
        ``grown`` (``_grown``) is not empty. Up to where the unsunk order
        begins the first grown node (the copies it reads first) the two
        orders run the same steps: every choice before it is the unsunk
        order's (inputs sorted grown-last only where one is among them).
        ``begun`` gets the step at which each node of the order (after the
        placeholders' elements) began: its own, or its first input's placed
        on its behalf."""
        emitted: set = set(placeholders)
        sequence: list = []

        def emit(key) -> None:
            if key in emitted:
                return
            if key not in starts:
                starts[key] = len(sequence)
            # A grown input last: it is not held while recomputes run.
            # (Most inputs were emitted already: each call checked first,
            # sorted only where one is grown.)
            read = inputs[key]
            if not emitted.issuperset(read):
                if grown and not grown.isdisjoint(read):
                    read = sorted(read, key=grown.__contains__)
                for a in read:
                    if a not in emitted:
                        emit(a)
            emitted.add(key)
            sequence.append(key)
            if key in elements:
                for element in elements[key]:
                    if element not in emitted:
                        emit(element)

        after = {}  # placeholder -> its elements, taken out right after it
        starts: dict = {}   # where emit records each key's start: ``begun`` after these
        for p in placeholders:
            sequence = []
            for element in elements.get(p, ()):
                emit(element)
            if sequence:
                after[p] = sequence
        sequence = []
        starts = begun
        for key in kept:
            if key in needed and key not in grown \
                    and not (key.__class__ is Key and key.kind != "state"):
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
        side_effect, pair_impure = self.side_effect, self.pair_impure
        for key in kept:
            if key.__class__ is Key or key not in needed:
                continue
            # (_impure(key, False, pairs), inlined)
            if pair_impure if key in pairs else key in side_effect:
                continue
            node = self.nodes[key]
            if node.grows or (not node.allocates and any(a in grown for a in node.inputs)):
                grown.add(key)
        return grown

    def _forward(self, saved_used: list, pairs: set, kept: list):
        """Forward's nodes in order (``kept``: the forward nodes AOTAutograd
        keeps, in the edited graph's order), and its outputs (kept to the
        end). What forward's own outputs read is the same for every plan
        (``forward_live``): only the saved values and impure ops outside it
        are walked."""
        outputs = list(self.fwd_outputs) + saved_used
        roots = [o.node if o.__class__ is Key else o for o in saved_used]
        # _impure(i, True, pairs) of each forward node, by sets: pairs are
        # impure as pair_impure says, the others as the joint graph's nodes.
        impure = [i for i in self.forward_impure if i not in pairs]
        if self.pair_impure:
            impure += [i for i in pairs if i in self.forward_inputs]
        live = _ancestors(roots + impure, self.forward_inputs, self.forward_live)
        return [i for i in kept if i in live], outputs

def _peaked_before(grown: set, begun: dict, peaked: int | None) -> bool:
    """Whether a walk that peaked at its step ``peaked`` (None: before it)
    peaked before it began any of ``grown`` (``begun``: the step each node
    began at, the copies placed for it included)."""
    return peaked is None or all(begun.get(key, peaked + 1) > peaked for key in grown)


def _pick(value, step: int, copies: dict, begins: dict):
    """What a reader needing ``value`` at backward ``step`` reads: the last
    of its copies begun by then (the first if none is), or the value.
    ``begins``: each value's copies' first steps, as in ``copies``."""
    made = copies.get(value)
    if made is None:
        return value
    k = bisect.bisect_right(begins[value], step) - 1
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


def _reads(inputs: tuple, storages) -> tuple:
    """The storages a node with ``inputs`` reads (``storages(key)``: a
    key's storages), by reference, repeats kept: what ``_run`` frees a
    storage after."""
    return tuple(ref for a in inputs for ref, _ in storages(a))


def _ancestors(roots, inputs, closed: set = frozenset()) -> set:
    """``roots`` and what they read, through ``inputs``, with ``closed``: a
    set holding what each of its members reads, taken whole, not walked."""
    seen: set = set(closed)
    stack = [r for r in roots if r not in closed]
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

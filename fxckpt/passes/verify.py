"""Checks a decision and a rewrite before anything runs. A failure is a bug in
fxckpt, reported as PlanError; the plan never runs."""

from __future__ import annotations

from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.errors import PlanError
from fxckpt.types import FORWARD, Decision, Profile, Tag, is_recomputed_name
from fxckpt.passes.rewrite import Rewritten
from fxckpt.ops import is_random


def verify_decision(profile: Profile, tags: dict[str, Tag], decision: Decision) -> None:
    problems = []
    both = decision.saved & decision.recomputed
    stray = decision.recomputed_twice - decision.recomputed
    if stray:
        problems.append(f"values recomputed twice but not recomputed: {sorted(stray)}")
    if both:
        problems.append(f"values both saved and recomputed: {sorted(both)}")
    for name in decision.recomputed:
        node = profile.nodes[name]
        if node.phase != FORWARD:
            problems.append(f"{name} is not a forward value but is marked recomputed")
        elif not node.recomputable:
            problems.append(f"{name} ({node.op}) is recomputed but {node.not_recomputable}")
        elif tags[name].policy in (CheckpointPolicy.MUST_SAVE,
                                   CheckpointPolicy.MUST_CPU_OFFLOAD):
            problems.append(f"{name} is tagged MUST_SAVE ({tags[name].reason}) but is recomputed")
    for name in decision.saved:
        if profile.nodes[name].is_mutated_input:
            problems.append(f"{name} is saved but the step mutates it in place")
        if tags.get(name) and tags[name].policy == CheckpointPolicy.MUST_RECOMPUTE:
            problems.append(f"{name} is tagged MUST_RECOMPUTE but is saved")
    # Everything backward reads must be available: saved, or recomputed from
    # values that are.
    for name in decision.recomputed:
        for parent in profile.nodes[name].inputs:
            if parent not in decision.saved and parent not in decision.recomputed:
                problems.append(f"{name} is recomputed but its input {parent} is neither "
                                "saved nor recomputed")
    for name in profile.needed_by_backward:
        if name not in decision.saved and name not in decision.recomputed:
            problems.append(f"backward needs {name} but it is neither saved nor recomputed")
    _raise(problems, "decision")


def verify_rewrite(profile: Profile, rewritten: Rewritten) -> None:
    problems = []
    fw, bw = rewritten.forward.graph, rewritten.backward.graph
    saved = set(rewritten.saved)
    for node in bw.find_nodes(op="placeholder"):
        if node.name not in saved and not node.name.startswith("tangents"):
            problems.append(f"backward reads {node.name}, which forward does not save")
    for node in bw.nodes:
        if node.op != "call_function":
            continue
        if node.target is run_and_save_rng_state:
            problems.append(f"backward runs {node.name}, a forward random op drawing new "
                            "numbers instead of replaying forward's")
        original = profile.nodes.get(node.name)
        if is_random(node) and original is not None and original.phase == FORWARD:
            problems.append(f"backward draws new random numbers in {node.name}: a forward "
                            "random op is recomputed without replaying its RNG state")
    for node in fw.nodes:
        if is_recomputed_name(node.name) or node.target is run_with_rng_state:
            problems.append(f"forward contains recompute node {node.name}")
    problems += _twice_problems(bw, rewritten)
    _raise(problems, "rewrite")


def _twice_problems(bw, rewritten: Rewritten) -> list[str]:
    """A value recomputed twice: only recomputes read its early copy, and
    both copies of a random op replay the same generator state."""
    problems = []
    by_name = {node.name: node for node in bw.nodes}
    recompute_nodes = set(rewritten.clones.values()) | set(rewritten.early.values())
    for value, early_name in rewritten.early.items():
        early, late = by_name.get(early_name), by_name.get(rewritten.clones[value])
        if early is None:
            continue    # nothing needed it early: dropped
        for user in early.users:
            if user.name not in recompute_nodes:
                problems.append(f"backward node {user.name} reads {early_name}, the early "
                                f"copy of {value}, instead of its late copy")
        if early.target is run_with_rng_state and late is not None \
                and early.args[0] is not late.args[0]:
            problems.append(f"the two copies of random {value} replay different states")
    return problems


def _raise(problems: list[str], what: str) -> None:
    if problems:
        raise PlanError(f"fxckpt produced an invalid {what} (a bug in fxckpt; please "
                        "report it with this message):\n  " + "\n  ".join(problems[:20]))

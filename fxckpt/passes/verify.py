"""Checks a decision and a rewrite before anything runs. A failure is a bug in
fxckpt, reported as PlanError; the plan never runs."""

from __future__ import annotations

from torch.utils.checkpoint import CheckpointPolicy

from fxckpt.compat.ops import run_and_save_rng_state, run_with_rng_state
from fxckpt.errors import PlanError
from fxckpt.types import FORWARD, Decision, Profile, Tag, is_recomputed_name
from fxckpt.passes.rewrite import Rewritten
from fxckpt.ops import is_random


def verify_decision(profile: Profile, tags: dict[str, Tag], decision: Decision) -> None:
    problems = []
    both = decision.saved & decision.recomputed
    for name, steps in decision.copy_steps:
        if name not in decision.recomputed:
            problems.append(f"{name} is to be recomputed again but is not recomputed")
        if list(steps) != sorted(set(steps)) or not steps:
            problems.append(f"{name}: the steps of its copies {steps} are not increasing")
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
    problems += _copy_problems(bw, rewritten)
    _raise(problems, "rewrite")


def _copy_problems(bw, rewritten: Rewritten) -> list[str]:
    """A value recomputed more than once: only recomputes and backward read
    its copies, and all copies of a random op replay the same state."""
    problems = []
    by_name = {node.name: node for node in bw.nodes}
    for value, earlier in rewritten.earlier.items():
        made = [by_name[name] for name in (*earlier, rewritten.clones[value]) if name in by_name]
        states = {node.args[0] for node in made if node.target is run_with_rng_state}
        if len(states) > 1:
            problems.append(f"the copies of random {value} replay different states")
        if len(made) > 1 and any(node.target is not made[0].target for node in made):
            problems.append(f"the copies of {value} run different ops")
    return problems


def _raise(problems: list[str], what: str) -> None:
    if problems:
        raise PlanError(f"fxckpt produced an invalid {what} (a bug in fxckpt; please "
                        "report it with this message):\n  " + "\n  ".join(problems[:20]))

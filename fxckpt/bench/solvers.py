"""``fxckpt bench --suite solvers``: how long budgeted solving takes, and
how far the fast solver's plans are from the exact ILP's.

Each graph's joint graph is captured once; the planner then runs on it
directly, once per solver, so the times are planning alone (profile, tag,
the solver's whole frontier, rewrite and exact simulation of every
candidate), never tracing. A budget selects from a frontier, so one
frontier per solver answers every budget (pipeline.Frontier.select)."""

from __future__ import annotations

import contextlib
import time

import torch

from fxckpt.bench.ways import Step
from fxckpt.bench.zoo import make_bench_model
from fxckpt.models import GPT, GPTConfig, gpt_loss
from fxckpt.options import Options, format_bytes
from fxckpt.planning.capture import capture_once, compile_planned
from fxckpt.passes.profile import tangent_dependent
from fxckpt.planning.pipeline import Frontier, FrontierPlanner, Planner

# Budgets for the ILP / fast comparison: fractions of the way from the
# ILP's floor up to the runtime-optimal peak.
BUDGET_POSITIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
# The compile suite's GPT is compared at every 5% of the way: at 8 layers
# (764 forward values) solver="auto" picks the fast solver, and five budgets
# hid gaps of up to 159% between the two frontiers there.
FINE_POSITIONS = tuple(k / 20 for k in range(21))


class JointRecorder(Planner):
    """A partition function that keeps the joint graph and the arguments
    AOTAutograd passed, and partitions with fxckpt's runtime-optimal plan."""

    def __init__(self, compiler: str = "eager") -> None:
        super().__init__(Options.create(compiler=compiler))
        self.calls: list[tuple] = []

    def __call__(self, joint, joint_inputs, **kwargs):
        self.calls.append((joint, joint_inputs, kwargs))
        return super().__call__(joint, joint_inputs, **kwargs)


def capture_joint(step: torch.nn.Module, inputs, *, compiler: str = "eager") -> tuple:
    """(joint graph, joint inputs, partition kwargs) of ``step``'s one graph,
    as ``compiler`` gives it to the partitioner (under Inductor: after its
    decompositions and joint-graph passes; caches are off while it compiles,
    so that the partitioner is called). Sizes are static: a GPT captured
    after another of other sizes would otherwise get symbolic sizes from
    Dynamo's automatic dynamic shapes (the model's code is shared), and a
    different graph (the zoo GPT after the 58-layer one: 744 nodes, not 740)."""
    recorder = JointRecorder(compiler)
    uncached = torch.compiler.config.patch(force_disable_caches=True) \
        if compiler == "inductor" else contextlib.nullcontext()
    with uncached:
        capture_once(step, inputs,
                     lambda gm, example: compile_planned(gm, example, recorder), dynamic=False)
    if len(recorder.calls) != 1:
        raise RuntimeError(f"expected one graph, captured {len(recorder.calls)}")
    return recorder.calls[0]


def frontier(joint_call: tuple, solver: str) -> tuple[Frontier, float]:
    joint, joint_inputs, kwargs = joint_call
    planner = FrontierPlanner(Options.create(compiler="eager", solver=solver))
    start = time.perf_counter()
    planner(joint, joint_inputs, **kwargs)
    return planner.frontiers[0], time.perf_counter() - start


def deep_gpt(n_layer: int):
    """A narrow GPT with many layers: a large joint graph that traces fast."""
    # Batch and sequence long enough that activations, not gradients, fill
    # memory, so a budget below the runtime-optimal peak has plans to choose.
    config = GPTConfig(vocab_size=64, block_size=64, n_layer=n_layer, n_head=2, n_embd=32)
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(config)
    idx = torch.randint(config.vocab_size, (8, config.block_size), generator=generator)
    targets = torch.randint(config.vocab_size, (8, config.block_size), generator=generator)
    return Step(model, lambda logits: gpt_loss(logits, targets)), (idx,)


def large_graph(n_layer: int, *, budget: float, progress) -> dict:
    """Plan a deep GPT's joint graph once with solver="fast" at ``budget``
    (a fraction of the runtime-optimal peak), the way the backend would."""

    step, inputs = deep_gpt(n_layer)
    with progress.row(f"capture deep GPT, {n_layer} layers"):
        start = time.perf_counter()
        joint_call = capture_joint(step, inputs)
        capture_seconds = time.perf_counter() - start
    joint, joint_inputs, kwargs = joint_call
    nodes = len(joint.graph.nodes)
    with progress.row(f"fast solver on {nodes} nodes") as note:
        planner = Planner(Options.create(compiler="eager", solver="fast", budget=budget))
        start = time.perf_counter()
        planner(joint, joint_inputs, **kwargs)
        seconds = time.perf_counter() - start
        plan = planner.plans[0]
        note(f"solve {plan.solve_seconds:.1f} s, planning {seconds:.1f} s")
    return {"n_layer": n_layer, "joint_nodes": nodes, "forward_values": _forward_values(joint),
            "budget_fraction": budget, "capture_seconds": capture_seconds,
            "solver": "fast", "chosen_by": plan.solver, "solve_seconds": plan.solve_seconds,
            "planning_seconds": seconds, "predicted_peak_bytes": plan.peak_bytes,
            "budget_bytes": plan.budget_bytes, "recompute_cost": plan.recompute_cost}


def _forward_values(joint) -> int:

    backward = tangent_dependent(joint.graph)
    return sum(1 for n in joint.graph.nodes if n.op != "output" and n not in backward)


def zoo_graph(name: str, size: str, progress) -> dict:
    """ILP against fast on a built-in model: frontier time, and at budgets
    from the ILP's floor to the runtime-optimal peak, each solver's chosen
    plan's recompute cost."""
    model, inputs, loss_fn = make_bench_model(name, size=size)
    return compared_graph(name, size, Step(model, loss_fn), inputs, BUDGET_POSITIONS, progress)


def compile_gpt_graph(n_layer: int, progress) -> dict:
    """The same comparison on the compile suite's GPT (bench/compile.py),
    at ``FINE_POSITIONS``."""
    from fxckpt.bench.compile import gpt_step
    step, inputs = gpt_step(n_layer)
    return compared_graph(f"compile-suite gpt, {n_layer} layers", "n_embd 64", step, inputs,
                          FINE_POSITIONS, progress)


def compared_graph(name: str, size: str, step, inputs, positions, progress) -> dict:
    with progress.row(f"capture {name} ({size})"):
        joint_call = capture_joint(step, inputs)
    found = {}
    for solver in ("ilp", "fast"):
        with progress.row(f"{name}: {solver} frontier") as note:
            found[solver] = frontier(joint_call, solver)
            note(f"{len(found[solver][0].plans)} plans")
    ilp, fast = found["ilp"][0], found["fast"][0]
    floor, top = ilp.plans[0].peak_bytes, ilp.runtime_optimal.peak_bytes
    budgets = []
    for position in positions:
        budget = int(floor + position * (top - floor))
        chosen = {solver: f.select(budget) for solver, (f, _) in found.items()}
        costs = {s: (p.recompute_cost if p is not None else None) for s, p in chosen.items()}
        budgets.append({
            "position": position, "budget_bytes": budget,
            "ilp_recompute_cost": costs["ilp"], "fast_recompute_cost": costs["fast"],
            "ilp_solver": chosen["ilp"].solver if chosen["ilp"] else None,
            "fast_solver": chosen["fast"].solver if chosen["fast"] else None,
            "ilp_gap": chosen["ilp"].gap if chosen["ilp"] else None,
            "fast_over_ilp": _gap(costs["fast"], costs["ilp"]),
        })
    joint = joint_call[0]
    return {"model": name, "size": size, "joint_nodes": len(joint.graph.nodes),
            "forward_values": _forward_values(joint),
            "ilp_frontier_seconds": found["ilp"][1], "fast_frontier_seconds": found["fast"][1],
            "ilp_floor_bytes": floor, "fast_floor_bytes": fast.plans[0].peak_bytes,
            "runtime_optimal_peak_bytes": top, "budgets": budgets}


def _gap(fast: float | None, ilp: float | None) -> float | None:
    """fast / ilp - 1: how much more the fast plan recomputes."""
    if fast is None or ilp is None:
        return None
    if ilp <= 0:
        return 0.0 if fast <= 0 else float("inf")
    return fast / ilp - 1.0


def run_solvers(*, n_layer: int, models=("gpt", "cnn", "mlp"), size: str = "small",
                budget: float = 0.8, compile_gpt_layers: int | None = 8,
                hf_models=(), progress) -> dict:
    """``compile_gpt_layers``: the compile suite's GPT at that many layers is
    compared at every 5% of the way too (None: not); so are ``hf_models``
    (zoo names of Hugging Face models), built from tiny configs."""
    progress.start("solvers", 2 + 3 * len(models) + 3 * (compile_gpt_layers is not None)
                   + 3 * len(hf_models))
    return {"large": large_graph(n_layer, budget=budget, progress=progress),
            "zoo": [zoo_graph(name, size, progress) for name in models],
            "compile_gpt": (compile_gpt_graph(compile_gpt_layers, progress)
                            if compile_gpt_layers is not None else None),
            "hf": [hf_graph(name, progress) for name in hf_models]}


def hf_graph(name: str, progress) -> dict:
    """The comparison at ``FINE_POSITIONS`` on a Hugging Face model from a
    tiny config (no weights): a graph the solvers were not tuned on."""
    model, inputs, loss_fn = make_bench_model(name, size="tiny")
    return compared_graph(name, "tiny", Step(model, loss_fn), inputs, FINE_POSITIONS, progress)


def solvers_markdown(result: dict) -> str:
    large = result["large"]
    lines = [f"Deep GPT ({large['n_layer']} layers): {large['joint_nodes']} joint-graph nodes, "
             f"{large['forward_values']} forward values. solver=\"fast\" at budget "
             f"{large['budget_fraction']:g} x runtime-optimal peak: solve "
             f"{large['solve_seconds']:.1f} s, whole planning {large['planning_seconds']:.1f} s "
             f"(capture {large['capture_seconds']:.1f} s, not counted).", "",
             "`@p`: a budget p of the way from the ILP's floor to the runtime-optimal peak.",
             "", "| graph | nodes | ILP frontier s | fast frontier s | budget | ILP cost ms "
             "| fast cost ms | fast vs ILP |", "|---|---|---|---|---|---|---|---|"]
    compared = result["zoo"] + ([result["compile_gpt"]] if result.get("compile_gpt") else []) \
        + result.get("hf", [])
    for z in compared:
        for b in z["budgets"]:
            lines.append("| " + " | ".join((
                f"{z['model']} ({z['size']}) @{b['position']:g}", str(z["joint_nodes"]),
                f"{z['ilp_frontier_seconds']:.1f}", f"{z['fast_frontier_seconds']:.1f}",
                format_bytes(b["budget_bytes"]), _ms(b["ilp_recompute_cost"]),
                _ms(b["fast_recompute_cost"]),
                "-" if b["fast_over_ilp"] is None else f"{b['fast_over_ilp']:+.1%}")) + " |")
    for label, graphs in (("the zoo's", result["zoo"]),
                          ("the compile suite's GPT's", [result.get("compile_gpt")]),
                          *((f"{z['model']} ({z['size']})'s", [z]) for z in result.get("hf", []))):
        gaps = [b["fast_over_ilp"] for z in graphs if z for b in z["budgets"]
                if b["fast_over_ilp"] is not None]
        if gaps:
            lines += ["", f"fast vs ILP over {label} {len(gaps)} budgets both meet: worst "
                          f"{max(gaps):+.1%}, mean {sum(gaps) / len(gaps):+.1%}; within 5% at "
                          f"{sum(g <= 0.05 for g in gaps)} of {len(gaps)}."]
    return "\n".join(lines) + "\n"


def _ms(value) -> str:
    return "no plan fits" if value is None else f"{value * 1e3:.3f}"

"""Device check: the bench table's Inductor rows on one
model -- torch.compile default, per-block checkpoint, activation_memory_budget
0.5/0.25/0, and fxckpt default and at each of those rows' measured peaks --
with the eager and save-all references.

    python .ci/cuda_bench_inductor.py SIZE OUT_DIR [DEVICE]
"""
import json
import os
import sys
from dataclasses import asdict

from fxckpt.bench import report
from fxckpt.bench.run import BenchConfig, Progress, machine, run_model
from fxckpt.bench.ways import torch_key

size, out = sys.argv[1], sys.argv[2]
device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
budgets = (0.5, 0.25, 0.0)
keys = ["compile_inductor", "compile_checkpoint_inductor", "fxckpt_inductor",
        *(torch_key(b, "inductor") for b in budgets),
        *(f"fxckpt_at_{torch_key(b, 'inductor')}" for b in budgets)]
config = BenchConfig(models=("gpt",), size=size, repeat=10, min_seconds=0.5, threads=1,
                     inductor=True, device=device)
result = asdict(run_model("gpt", config, Progress(sys.stderr), keys=tuple(keys), sweep=False))
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "bench_inductor.json"), "w") as f:
    json.dump({"machine": machine(1, device), "config": asdict(config), "model": result},
              f, indent=1, default=str)
print("\n".join(report.model_markdown(result)))

"""Two fresh processes compile the same model with the same options: the
second takes its compiled graphs from torch's caches and its plans from
fxckpt's plan cache, without planning.

    python examples/plan_cache.py [--model gpt] [--size small] [--budget 50%]

Each process runs one training step under torch.compile with
fxckpt.backend(compiler="inductor"), in a cache directory of its own
(TORCHINDUCTOR_CACHE_DIR, shared by the two), and reports the step's
seconds (compile included), how many graphs fxckpt planned, the plans'
fingerprints and the gradients' digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time


def one_process(model_name: str, size: str, budget) -> dict:
    import torch
    from torch._dynamo.utils import counters

    import fxckpt
    from fxckpt.models import make_model

    planned = []

    class Counter(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("fxckpt: planning graph"):
                planned.append(record.getMessage())

    logger = logging.getLogger("fxckpt")
    logger.addHandler(Counter())
    logger.setLevel(logging.INFO)
    model, inputs, loss_fn = make_model(model_name, size=size)
    backend = fxckpt.backend(compiler="inductor", budget=budget)
    torch.manual_seed(0)    # dropout draws alike in both processes
    start = time.perf_counter()
    loss_fn(torch.compile(model, backend=backend)(*inputs)).backward()
    seconds = time.perf_counter() - start
    grads = [p.grad for p in model.parameters()]
    torch.save(grads, os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], f"grads{os.getpid()}.pt"))
    return {"seconds": seconds, "graphs_planned": len(planned),
            "fingerprints": [p.fingerprint for p in backend.plans],
            "peaks": [p.peak_bytes for p in backend.plans],
            "budgets": [p.budget_bytes for p in backend.plans],
            "notes": [list(p.notes) for p in backend.plans],
            "autograd_cache": dict(counters["aot_autograd"]),
            "grads": hashlib.sha256(b"".join(g.numpy().tobytes() for g in grads)).hexdigest(),
            "pid": os.getpid()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--size", default="small")
    parser.add_argument("--budget", default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    budget = int(args.budget) if args.budget and args.budget.isdigit() else args.budget
    if args.one:
        print(json.dumps(one_process(args.model, args.size, budget)))
        return
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--one", "--model", args.model,
                                  "--size", args.size] +
                                 (["--budget", args.budget] if args.budget else []),
                                 env=env, check=True, capture_output=True, text=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        import torch

        first, second = ([torch.load(os.path.join(cache, f"grads{run['pid']}.pt"))
                          for run in runs])
        difference = max((a - b).abs().max().item() for a, b in zip(first, second))
    first, second = runs
    print(json.dumps(runs, indent=1))
    print(f"first process {first['seconds']:.1f} s, planned {first['graphs_planned']} "
          f"graph(s); second {second['seconds']:.1f} s, planned "
          f"{second['graphs_planned']}; ratio {second['seconds'] / first['seconds']:.2f}; "
          f"fingerprints equal: {first['fingerprints'] == second['fingerprints']}; "
          f"gradients bitwise equal: {first['grads'] == second['grads']} (largest "
          f"difference {difference:.3g}; reductions on several threads vary in order)")


if __name__ == "__main__":
    main()

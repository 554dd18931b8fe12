"""Device check: one zoo model built on CUDA, under
compiler="eager" and "inductor": the floor and default plans, five byte
budgets between their predicted peaks; per budget the allocator's measured
step peak against the plan's prediction and the budget, and loss and
gradients against the reference (eager for "eager"; Inductor without
recomputation, solver="save_all", for "inductor"). One JSON line per step.

    python .ci/cuda_memcheck.py MODEL [eager|inductor ...]
"""
import json
import sys
import time

import torch

sys.path.insert(0, ".")
import fxckpt  # noqa: E402
from tests.harness import fresh, run_step  # noqa: E402
from tests.test_cuda import measured_step  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

CUDA = torch.device("cuda")


def built(name):
    with CUDA:
        return fresh(ZOO[name])


def differs(a, b):
    worst = float((a.loss - b.loss).abs())
    n = 0
    for k, g in b.grads.items():
        h = a.grads.get(k)
        if h is None or not torch.equal(h, g):
            n += 1
            if h is not None:
                worst = max(worst, float((h - g).abs().max()))
    return {"loss_equal": bool(torch.equal(a.loss, b.loss)), "grads_differing": n,
            "grads": len(b.grads), "max_abs": worst}


def main(name, compilers):
    for compiler in compilers:
        t0 = time.time()
        model, inputs, loss_fn = built(name)
        if compiler == "eager":
            ref = run_step(model, inputs, loss_fn)
        else:
            be = fxckpt.backend(compiler="inductor", solver="save_all")
            ref = run_step(torch.compile(model, backend=be), inputs, loss_fn)
        torch._dynamo.reset()
        predicted = {}
        for plan_name, budget in (("floor", 0.0), ("default", None)):
            model, inputs, loss_fn = built(name)
            be = fxckpt.backend(compiler=compiler, budget=budget)
            run_step(torch.compile(model, backend=be), inputs, loss_fn)
            predicted[plan_name] = sum(p.peak_bytes for p in be.plans) if len(be.plans) > 1 \
                else be.plans[0].peak_bytes
            graphs = len(be.plans)
            torch._dynamo.reset()
        low, high = predicted["floor"], predicted["default"]
        for k in range(5):
            budget = low + k * (high - low) // 4
            model, inputs, loss_fn = built(name)
            be = fxckpt.backend(compiler=compiler, budget=budget)
            compiled = torch.compile(model, backend=be)
            try:
                got = run_step(compiled, inputs, loss_fn)
                peak = measured_step(compiled, inputs, loss_fn)
            except Exception as error:  # noqa: BLE001 - reported
                print(json.dumps({"model": name, "compiler": compiler, "k": k,
                                  "budget": budget, "error": repr(error)[:300]}), flush=True)
                torch._dynamo.reset()
                continue
            pred = max(p.peak_bytes for p in be.plans)
            print(json.dumps({"model": name, "compiler": compiler, "k": k, "graphs": graphs,
                              "budget": budget, "predicted": pred, "measured": peak,
                              "measured_over_budget": peak / budget,
                              "measured_over_predicted": peak / pred,
                              **differs(got, ref)}), flush=True)
            torch._dynamo.reset()
        print(json.dumps({"model": name, "compiler": compiler, "seconds": time.time() - t0}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["eager", "inductor"])

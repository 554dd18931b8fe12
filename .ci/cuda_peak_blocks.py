"""Device diagnosis: which blocks are live at a measured CUDA step's peak.

One zoo model on CUDA, compiled with fxckpt (compiler, budget), two steps
run, then a third recorded with the allocator's history: the blocks live at
its peak, largest first, each with the innermost frames that allocated it
(the generated code's line where there is one), against the plan's
predicted peak. Writes the snapshot to OUT_DIR/NAME.pickle.

    python .ci/cuda_peak_blocks.py MODEL COMPILER BUDGET [OUT_DIR]
"""
import linecache
import os
import pickle
import sys

import torch

sys.path.insert(0, ".")
import fxckpt  # noqa: E402
from tests.harness import fresh, run_step  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

name, compiler, budget = sys.argv[1], sys.argv[2], sys.argv[3]
budget = None if budget == "none" else (float(budget) if "." in budget else int(budget))
out = sys.argv[4] if len(sys.argv) > 4 else "."
with torch.device("cuda"):
    model, inputs, loss_fn = fresh(ZOO[name])
be = fxckpt.backend(compiler=compiler, budget=budget)
compiled = torch.compile(model, backend=be)
run_step(compiled, inputs, loss_fn)
run_step(compiled, inputs, loss_fn)
model.zero_grad(set_to_none=True)
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
torch.cuda.reset_peak_memory_stats()
out_t = compiled(*inputs)
loss_fn(out_t).backward()
torch.cuda.synchronize()
measured = torch.cuda.max_memory_allocated() - base
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"{name}_{compiler}_{sys.argv[3]}.pickle"), "wb") as f:
    pickle.dump(snap, f)
plan = be.plans[0]
print(f"== {name} {compiler} budget={budget}: predicted {plan.peak_bytes} measured {measured} "
      f"diff {measured - plan.peak_bytes}")
live, total, peak, at_peak = {}, 0, -1, {}
for ev in snap["device_traces"][0]:
    if ev["action"] == "alloc":
        live[ev["addr"]] = ev
        total += ev["size"]
        if total > peak:
            peak, at_peak = total, dict(live)
    elif ev["action"] == "free_completed" and ev["addr"] in live:
        total -= live.pop(ev["addr"])["size"]
print(f"peak of blocks allocated in the step: {peak}")


def where(ev):
    lines = []
    for fr in ev.get("frames", [])[:12]:
        fn = fr["filename"]
        if "torch/" in fn and "_inductor" not in fn and "output_code" not in fn:
            continue
        text = linecache.getline(fn, fr["line"]).strip()
        lines.append(f"{os.path.basename(fn)}:{fr['line']} {fr['name']}: {text[:110]}")
        if len(lines) == 3:
            break
    return " | ".join(lines) or (ev.get("frames") or [{}])[0].get("name", "?")


for ev in sorted(at_peak.values(), key=lambda e: -e["size"]):
    print(f"{ev['size']:>10} {where(ev)}")

"""Prints, as one JSON object, the fingerprints of the plans a checkout
makes for the test zoo: ``fxckpt.explain`` at budgets None, 0, 0.5, 1 and
one byte (its BudgetError's floor), under the compilers named (Inductor on
mlp and gpt only), and the plans of two training steps at that floor. Run it
on two checkouts to see that a change moved no plan:

    python .ci/plan_fingerprints.py /path/to/before eager,inductor > before.json
    python .ci/plan_fingerprints.py . eager,inductor > after.json
"""

from __future__ import annotations

import json
import os
import sys
import warnings

root = os.path.abspath(sys.argv[1])
sys.path[:0] = [root, os.path.join(root, "tests")]
warnings.simplefilter("ignore")

import torch  # noqa: E402

import fxckpt  # noqa: E402
from zoo import ZOO  # noqa: E402

assert fxckpt.__file__.startswith(root), f"fxckpt imported from {fxckpt.__file__}"
torch.set_num_threads(1)


def floor_step(case, compiler: str, floor: int) -> list[str]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, inputs, loss_fn = case.make()
    be = fxckpt.backend(budget=floor, compiler=compiler)
    compiled = torch.compile(model, backend=be)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss_fn(compiled(*inputs)).backward()
    return [plan.fingerprint for plan in be.plans]


def main() -> None:
    found = {}
    for name, case in ZOO.items():
        for compiler in sys.argv[2].split(","):
            if compiler == "inductor" and name not in ("mlp", "gpt"):
                continue
            for budget in (None, 0.0, 0.5, 1.0, 1):
                torch._dynamo.reset()
                torch.manual_seed(0)
                try:
                    model, inputs, _ = case.make()
                except ImportError as missing:
                    found[name] = f"not made: {missing}"
                    break
                key = f"{name}/{compiler}/{budget}"
                try:
                    found[key] = fxckpt.explain(model, *inputs, budget=budget,
                                                compiler=compiler).fingerprint
                except fxckpt.BudgetError as refused:
                    found[key] = f"BudgetError {refused.floor_bytes}"
                    if budget == 1 and refused.floor_bytes:
                        found[f"{name}/{compiler}/floor-step"] = floor_step(
                            case, compiler, refused.floor_bytes)
                print(key, file=sys.stderr, flush=True)
    print(json.dumps(found, sort_keys=True))


if __name__ == "__main__":
    main()

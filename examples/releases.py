"""What fxckpt plans and measures on the torch release it runs with: one
JSON line per zoo model (tests/zoo.py) with the floor ``fxckpt.explain(...,
budget=1)`` names under each compiler, the default plan's predicted peak
and its measured step peak under each compiler, and the measured peak of a
step run at the Inductor floor.

    python examples/releases.py OUT.jsonl [MODEL,...]     # under each release's python
    python examples/releases.py --table OUT_2.13.jsonl OUT_2.15.jsonl ...

The second form prints one markdown table, each release's figures against
the first file's (the reference release). CPU, one thread; measured peaks
are the second step's (CPU allocator events, fxckpt.bench.measure).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from floors_per_compiler import ZOO, compiled_step, floor  # noqa: E402


def row(name: str) -> dict:
    started = time.perf_counter()
    found = {"model": name, "torch": torch.__version__.split("+")[0]}
    for compiler in ("eager", "inductor"):
        found[f"{compiler}_floor"] = floor(name, compiler)
        found[f"{compiler}_default_predicted"], found[f"{compiler}_default_measured"] = \
            compiled_step(name, compiler=compiler)
    _, found["inductor_at_floor_measured"] = compiled_step(
        name, compiler="inductor", budget=found["inductor_floor"])
    found["seconds"] = round(time.perf_counter() - started, 1)
    return found


def table(paths: list[str]) -> str:
    releases = [[json.loads(line) for line in open(path)] for path in paths]
    reference = {r["model"]: r for r in releases[0]}
    lines = ["| torch | model | eager floor (x ref) | eager default predicted / measured | "
             "Inductor floor (x ref) | measured at it / floor | Inductor default "
             "predicted / measured |", "|---|---|---|---|---|---|---|"]
    for rows in releases:
        for r in rows:
            ref = reference[r["model"]]
            lines.append(
                f"| {r['torch']} | {r['model']} | {r['eager_floor']:,} "
                f"({r['eager_floor'] / ref['eager_floor']:.3f}) | "
                f"{r['eager_default_predicted']:,} / {r['eager_default_measured']:,} | "
                f"{r['inductor_floor']:,} ({r['inductor_floor'] / ref['inductor_floor']:.3f}) | "
                f"{r['inductor_at_floor_measured'] / r['inductor_floor']:.3f} | "
                f"{r['inductor_default_predicted'] / r['inductor_default_measured']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        print(table(sys.argv[2:]))
        sys.exit()
    torch.set_num_threads(1)
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(ZOO)
    with open(sys.argv[1], "w") as out:
        for name in names:
            found = row(name)
            print(json.dumps(found), file=out, flush=True)
            print(json.dumps(found), flush=True)

"""Prints, per model, the backward op counts and measured peaks of fxckpt's
per_block beside torch.compile with torch.utils.checkpoint around each block
(what test_per_block asserts):

    PYTHONPATH=. python tests/per_block_report.py [model ...]
"""

from __future__ import annotations

import sys


import fxckpt

try:
    from tests import test_per_block as cases
except ImportError:  # pragma: no cover
    import test_per_block as cases

MODELS = dict(zip(["gpt", "cnn", "resnet_inplace", "hf_gpt2", "hf_llama"],
                  [cases._gpt, cases._cnn, cases.make_resnet_inplace, cases.make_hf_gpt2,
                   cases.make_hf_llama]))


def report(name: str) -> str:
    torch_ops, torch_peak = cases._step(MODELS[name], "aot_eager", per_block_checkpoint=True)
    ours, peak = cases._step(MODELS[name], fxckpt.backend(compiler="eager", solver="per_block"))
    recomputed = ", ".join(f"{op.__name__.split('.')[-1]} {count}"
                           for op, count in sorted(ours.items(), key=lambda kv: str(kv[0])))
    return (f"{name}: backward ops {'equal' if ours == torch_ops else 'DIFFER'} "
            f"(torch-only {dict(torch_ops - ours)}, fxckpt-only {dict(ours - torch_ops)}); "
            f"peak fxckpt {peak} B, torch {torch_peak} B, ratio {peak / torch_peak:.4f}\n"
            f"  backward ops (views aside): {recomputed}")


if __name__ == "__main__":
    for model in sys.argv[1:] or list(MODELS):
        print(report(model), flush=True)

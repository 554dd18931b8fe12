"""For a CUDA machine whose torch is 2.11 (the device image this project is
lent; fxckpt is pinned to 2.13 and a 2.13 CUDA wheel cannot be carried
there): three source edits, each a fallback for an API 2.11 lacks, made in
the working tree it runs in. Never run it in a checkout you commit from:
`.ci/cuda` runs it only when asked (FXCKPT_TORCH211=1).

- ``torch._C._autograd._make_saved_tensor`` (fxckpt.checkpoint saves its
  arguments through the enclosing saved-tensor hooks): arguments kept as
  they are;
- ``torch._inductor.custom_graph_pass.get_custom_graph_passes``: fxckpt's
  post-grad pass alone;
- ``torch.compile(isolate_recompiles=)``: dropped.
"""
import sys
EDITS = [
    ("fxckpt/eager/checkpoint.py",
     "from torch._C._autograd import SavedTensor, _make_saved_tensor\n",
     "from torch._C._autograd import SavedTensor\ntry:\n    from torch._C._autograd import _make_saved_tensor\n"
     "except ImportError:  # torch 2.11\n    def _make_saved_tensor(x, is_output=False):\n        return x\n"),
    ("fxckpt/planning/capture.py",
     "    from torch._inductor.custom_graph_pass import get_custom_graph_passes\n",
     "    try:\n        from torch._inductor.custom_graph_pass import get_custom_graph_passes\n"
     "    except ImportError:  # torch 2.11: one pass\n        return SplitLateAddmm()\n"),
    ("fxckpt/planning/capture.py",
     "                      isolate_recompiles=True)(*example_inputs)",
     "                      )(*example_inputs)"),
]
for path, old, new in EDITS:
    text = open(path).read()
    if old not in text:
        sys.exit(f"compat: {path}: text not found")
    open(path, "w").write(text.replace(old, new, 1))
print("compat edits applied:", len(EDITS))

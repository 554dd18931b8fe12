"""fxckpt's own torch operators, which rewritten graphs call: offload
(a saved value copied to host memory and back) and dropout (the host
dropout's draw and its product, planned apart)."""

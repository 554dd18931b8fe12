"""What fxckpt does for Inductor, the default compiler.

compiled_peak (a step's peak read off Inductor's generated wrapper code:
its allocations, reuses and frees), fusion (no fusion that moves a
recomputation across the backward), addmm (an ``addmm`` whose add comes
late split back, so the saved matmul output is the one planned).
"""

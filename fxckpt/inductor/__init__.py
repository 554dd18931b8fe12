"""What fxckpt does for Inductor, the default compiler.

fusion (no fusion that moves a recomputation across the backward), addmm
(an ``addmm`` whose add comes late split back, so the saved matmul output
is the one planned). A compiled plan's peak is read by
memory/compiled_peak.py.
"""

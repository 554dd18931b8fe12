"""The memory model: how many bytes a planned step holds, and when.

model (graphs in, peak and timeline out: storages live from producer to
last reader, each op's workspace and the CPU kernels' scratch buffers,
Inductor's inlining where it fuses), walk (the same rules on arrays, for
sequences of steps given as numbers), cuda_scratch (what CUDA kernels hold
besides their outputs: attention forward and backward, embedding backward,
measured), cpu_conv (what CPU convolutions hold inside their call,
measured by running each distinct one once). The schedule model
(passes/schedule.py) replays a plan's rewrite without building it and walks
it with ``walk``.
"""

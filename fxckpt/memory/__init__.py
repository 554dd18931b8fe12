"""The memory models: how many bytes a planned step holds, and when.

A ladder, from the cheapest reading to the most faithful; each rung is
checked against the one above it by the tests:

1. the proxy: the solvers' own arithmetic on lifetimes given as numbers
   (solve/problem.py; solvers see numbers, not graphs);
2. schedule: a plan's peak without rewriting the graphs, the joint graph
   read once (model_nodes) and walked on arrays (schedule_walk, walk);
3. model: the simulation of the rewritten forward and backward graphs
   (storages live from producer to last reader; Inductor's inlining where
   it fuses);
4. compiled_peak: a compiled plan's peak read from Inductor's generated
   wrapper code (its allocations, reuses and frees);
5. measured: a training step's peak read from the CUDA allocator.

Beside them: values (sizes, bytes and devices of graph values), scratch
(what an op holds inside its call besides its output, by rule),
cuda_scratch and cuda_reduce (CUDA kernels' buffers), cpu_conv (CPU
kernels' scratch, measured by running each distinct call once). Nothing
here imports the passes or the benchmarks.
"""

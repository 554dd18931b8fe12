"""The stages strung together, and what makes planning cheap to repeat.

pipeline (Planner and FrontierPlanner: profile, tag, solve, rewrite,
verify for one joint graph), phases (planning time by phase, progress on
the ``fxckpt.planner`` logger), capture (hand a graph to AOTAutograd and
the compiler, check the compiled peak against a byte budget, plan again
lower where it is over), graph_compiler (one graph planned and compiled
for given options, as the backend asks), memo (frontiers built in this process, recalled
for another budget), cache (plans kept across processes, keyed by the
partitioner's uuid).
"""

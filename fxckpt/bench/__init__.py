"""``fxckpt bench``: fxckpt side by side with torch's own options.

run (the suite and its rows), ways (how each row trains), measure (peak,
saved bytes, work and time of real steps), report (tables and plots),
solvers, offload and compile (the other suites)."""

"""``fxckpt bench``: fxckpt side by side with torch's own options.

run (the suite and its rows), ways (how each row trains), measure (peak,
saved bytes, work and time of real steps), report (tables and plots),
solvers, offload, compile and scratch (the other suites), suites
(`fxckpt bench --all`, every CPU suite in one run) and page (BENCHMARKS.md
rendered from that run's results)."""

"""The workload benchmarks' parts (issue 13): real servers on localhost (servers.py), an
open-loop load generator (loadgen.py), workloads from real data (workloads.py), latency
statistics (stats.py) and plots (plots.py). Driven by benchmarks/workload_curves.py."""

"""benchmarks/gpu_engine.py's pieces, one module per job: the systems and their settings
(systems.py), the model and its references (model.py), the requests (workloads.py), the
parts a child runs (parts.py), the diagnostics (diagnostics.py), the report (report.py),
the command line (cli.py) and the processes (orchestration.py)."""

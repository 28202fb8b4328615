"""Engine start-up with SGLang's spawned workers against workers forked from a forkserver
(PREFILLONLY_WORKER_START=forkserver, sglang_runtime/worker_forkserver.py): the tiny
Llama, float32, CPU; three Engines started and shut down one after another in one process
per mode (the first start of a process pays the imports either way), each scoring one call.

    PYTHONPATH=. .venv/bin/python benchmarks/worker_start.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

STARTS = 3

CHILD = """
import json, sys, time
from prefillonly_sgl import Engine
from prefillonly_sgl.models.tiny import build_tiny_model
path = build_tiny_model(sys.argv[1], arch="llama")
seconds = []
for _ in range(int(sys.argv[2])):
    began = time.perf_counter()
    with Engine(path, device="cpu", dtype="float32", max_total_tokens=8192) as engine:
        engine.score("Hello there", ["is this"], [5, 7])
        seconds.append(time.perf_counter() - began)
print(json.dumps(seconds))
"""


def main() -> None:
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("spawn", "forkserver"):
            env = {**os.environ, "PREFILLONLY_WORKER_START": mode}
            out = subprocess.run(
                [sys.executable, "-c", CHILD, folder, str(STARTS)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    for mode, seconds in rows.items():
        shown = ", ".join(f"{s:.1f}" for s in seconds)
        print(f"{mode:>10}: start + one call, s: {shown}")


if __name__ == "__main__":
    began = time.perf_counter()
    main()
    print(f"({time.perf_counter() - began:.0f} s)")

"""The systems under test, each a real server started on localhost: stock SGLang
(`python -m sglang.launch_server`) under its own policies, prefillonly-sgl with everything
on, and prefillonly-sgl with one feature off in turn. One server at a time (they share
the machine's cores)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from prefillonly_sgl.machine.ports import free_port
from prefillonly_sgl.replicas.launcher import healthy

STOCK = {  # SGLang as shipped: its scheduling policies
    "stock-fcfs": ["--schedule-policy", "fcfs"],
    "stock-lpm": ["--schedule-policy", "lpm"],
    "stock-spf": ["--schedule-policy", "shortest-prefill-first"],
    # highest response-ratio next: (wait + prefill) / prefill, cache-aware like lpm
    "stock-hrrn": ["--schedule-policy", "hrrn"],
}
OURS = {  # prefillonly serve, with one feature off in turn
    "ours": [],
    "ours-no-jct": ["--schedule-policy", "shortest-prefill-first"],
    "ours-lru": ["--jct-eviction", "lru"],  # SGLang's LRU, not queue-aware eviction
    "ours-no-hybrid": ["--disable-hybrid-prefill"],
    "ours-no-kv": ["--disable-prefill-only-kv"],
    "ours-no-attention": ["--disable-prefill-only-attention"],  # takes prefill-only KV too
    "ours-no-logprob-cache": ["--disable-prompt-logprob-cache"],
}
SYSTEMS = (*STOCK, *OURS)


def server_command(system: str, model: str, port: int, dtype: str, pool, device="cpu"):
    """pool: KV pool tokens, or for ours ("budget", bytes or "1.2GiB", longest prompt): a
    memory budget the server sizes its pool from (harness/memory.py)."""
    common = ["--model-path", model, "--dtype", dtype, "--port", str(port), "--host",
              "127.0.0.1", "--skip-server-warmup"]  # fmt: skip
    if isinstance(pool, tuple):
        if system not in OURS:
            raise ValueError(f"{system}: stock SGLang takes a pool in tokens (harness/memory.py)")
        _, budget, longest = pool
        common += ["--memory-budget", str(budget), "--max-prompt-tokens", str(longest)]
    else:
        common += ["--max-total-tokens", str(pool)]
    if system in STOCK:
        backend = "torch_native" if device == "cpu" else "flashinfer"
        # Stock /v1/score reports no cached tokens in its usage, so its prefix-cache hits are
        # read from the Prometheus counters (--enable-metrics) around a run instead.
        stock = ["--device", device, "--attention-backend", backend, "--enable-cache-report",
                 "--enable-metrics"]  # fmt: skip
        return [sys.executable, "-m", "sglang.launch_server", *common, *stock, *STOCK[system]]
    if system in OURS:
        return [sys.executable, "-m", "prefillonly_sgl", "serve", *common, *OURS[system]]
    raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")


class Server:
    def __init__(self, command: list[str], port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @classmethod
    def start(cls, system: str, model: str, dtype: str, pool, log: Path, **kw) -> Server:
        port = free_port()
        server = cls(server_command(system, model, port, dtype, pool, **kw), port, log)
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log.read_text()[-3000:]}")
            if healthy(self.url):
                return
            time.sleep(1)
        raise RuntimeError(f"server not ready:\n{self.log.read_text()[-3000:]}")

    def flush_cache(self, timeout: float = 600) -> None:
        """Empties the prefix cache, waiting for the server to go idle first (SGLang
        refuses to flush while requests run, e.g. ones a cut-off run left behind)."""
        deadline = time.monotonic() + timeout
        while True:
            req = urllib.request.Request(self.url + "/flush_cache", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=60):
                    return
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def token_counters(self) -> tuple[float, float] | None:
        """(prompt tokens, cached prompt tokens) served so far, from SGLang's Prometheus
        counters; None when the server exports no metrics."""
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return None
        totals = {"sglang:prompt_tokens_total": 0.0, "sglang:cached_tokens_total": 0.0}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
        if not totals["sglang:prompt_tokens_total"]:
            return None
        return totals["sglang:prompt_tokens_total"], totals["sglang:cached_tokens_total"]

    def scheduler(self) -> psutil.Process | None:
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
                    return child
            except psutil.Error:
                continue
        return None

    def reset_peak_memory(self) -> None:
        """Sets the scheduler's resident high-water mark to its current size."""
        scheduler = self.scheduler()
        if scheduler is not None:
            with open(f"/proc/{scheduler.pid}/clear_refs", "w") as f:
                f.write("5")

    def peak_memory(self) -> int:
        """The scheduler's peak resident bytes since the last reset (0 if unknown)."""
        scheduler = self.scheduler()
        if scheduler is None:
            return 0
        with open(f"/proc/{scheduler.pid}/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

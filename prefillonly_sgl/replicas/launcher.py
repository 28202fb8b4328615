"""Start N `prefillonly serve` replicas and SGLang's gateway in front of them; keep them up.

Each replica and the gateway run in a process group of their own (a replica is SGLang's
HTTP server, scheduler and detokenizer), so one can be stopped, or killed, whole. The
replicas start first and the gateway once they answer /health, so it registers them at
once; `wait_ready` returns when the gateway lists every replica as healthy. `supervise`
restarts a replica that died (the gateway takes it back when its health checks pass) and
stops everything when the gateway itself dies.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from prefillonly_sgl.machine.ports import free_port, free_port_run  # noqa: F401 (re-exported)
from prefillonly_sgl.replicas.gateway_args import (
    GatewayKeys,
    gateway_argv,
    gateway_auth,
    replica_ports,
    replica_threads,
    serve_flag_value,
    with_tenant_keys_file,
)
from prefillonly_sgl.server.tenant_keys import TenantKeysError, load_tenant_key_pairs

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600  # a replica loads its model; SGLang's workers import for ~15-40 s
OWNED_OPTIONS = ("--host", "--port")
# The replicas' copy of --tenant-keys with the gateway's own key (ReplicaSet._keys), in
# the log folder while the set runs.
TENANT_KEYS_COPY = "replica-tenant-keys.json"


class ReplicaStartError(RuntimeError):
    """A replica or the gateway did not come up."""


def get_json(url: str, timeout: float = 5.0, api_key: str | None = None):
    """The decoded JSON at ``url`` (sent with ``api_key``), or None when it cannot be read."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return None


def healthy(url: str) -> bool:
    """Whether a server answers GET /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    # HTTPException: anything that is not HTTP on the port (BadStatusLine) is not healthy.
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return False


def _on_cpu(serve_args: list[str]) -> bool:
    """Whether the replicas run on the CPU (``--device cpu``, or no GPU here)."""
    for i, arg in enumerate(serve_args):
        if arg == "--device" and i + 1 < len(serve_args):
            return serve_args[i + 1] == "cpu"
        if arg.startswith("--device="):
            return arg.split("=", 1)[1] == "cpu"
    from prefillonly_sgl.machine.device_defaults import detect_device

    return detect_device() == "cpu"


class _Process:
    """One command in its own process group, output to a log file."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict, stdin_text: str = ""
    ) -> None:
        self.name, self.argv, self.log_path, self.env = name, argv, log_path, env
        self._stdin_text = stdin_text  # what it reads first (the gateway: its keys)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if self._stdin_text else subprocess.DEVNULL,
                start_new_session=True,  # its own process group: pgid == pid
            )
        if self._stdin_text:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(self._stdin_text.encode())
            self.proc.stdin.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.signal_group(signal.SIGKILL)  # what the leader left behind, if anything

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Gateway:
    """`smg launch` routing to ``worker_urls`` at ``host:port`` (ReplicaSet starts one; a
    second one over the same replicas compares policies in one run)."""

    def __init__(
        self,
        host: str,
        port: int,
        worker_urls: list[str],
        policy: str,
        log_path: Path,
        env: dict | None = None,
        extra: list[str] | None = None,
        keys: GatewayKeys | None = None,
    ) -> None:
        self.url, self.worker_urls, self.policy = f"http://{host}:{port}", worker_urls, policy
        self.keys = keys or GatewayKeys()  # gateway_args.gateway_auth; our calls send its key
        self.prometheus_port = free_port(host)
        argv = gateway_argv(host, port, worker_urls, self.prometheus_port, policy, extra)
        self.process = _Process(
            f"gateway ({policy})", argv, log_path, env or dict(os.environ),
            stdin_text=self.keys.to_json() if keys else "",
        )  # fmt: skip

    def start(self) -> None:
        self.process.start()

    def workers(self) -> list[dict]:
        """The gateway's view of its replicas (GET /workers), [] when it cannot answer."""
        answer = get_json(f"{self.url}/workers", api_key=self.keys.api_key)
        return list(answer.get("workers") or []) if isinstance(answer, dict) else []

    def healthy_workers(self) -> set[str]:
        return {w.get("url") for w in self.workers() if w.get("is_healthy")}

    def all_registered(self) -> bool:
        return self.healthy_workers() >= set(self.worker_urls)

    def wait_registered(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.all_registered():
            if not self.process.alive():
                raise ReplicaStartError(
                    f"{self.process.name} exited with {self.process.proc.returncode}; its log "
                    f"ends:\n{self.process.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ReplicaStartError(f"{self.process.name}: replicas not registered in time")
            time.sleep(0.5)

    def metrics(self) -> str:
        """Its Prometheus text (retries, per-worker errors), "" when unreadable."""
        url = f"http://127.0.0.1:{self.prometheus_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return ""

    def stop(self) -> None:
        self.process.stop(timeout=10)


class ReplicaSet:
    """``replicas`` x `prefillonly serve SERVE_ARGS` behind `smg` at ``host:port``.

    serve_args: the `prefillonly serve` options every replica gets (model, device, apps,
        ...), without --host / --port: replica i listens on port + 1 + i.
    policy: the gateway's routing policy (gateway_args.POLICIES).
    log_dir: where replica-<i>.log and gateway.log go (default: a fresh temp folder).
    restart: restart a replica that died (in `supervise`).
    gateway_args: more `smg launch` options; env: the processes' environment.
    """

    def __init__(
        self,
        serve_args: list[str],
        replicas: int = 2,
        host: str = "127.0.0.1",
        port: int = 30000,
        policy: str = "cache_aware",
        log_dir: Path | None = None,
        restart: bool = True,
        gateway_args: list[str] | None = None,
        env: dict | None = None,
    ) -> None:
        owned = [a for a in serve_args if a.split("=")[0] in OWNED_OPTIONS]
        if owned:
            raise ValueError(
                f"{' '.join(owned)}: the replicas' host and port are set by `replicas` "
                f"(--host, --port: the gateway's; replica i gets port + 1 + i)"
            )
        if log_dir is None:
            import tempfile

            log_dir = Path(tempfile.mkdtemp(prefix="prefillonly-replicas-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.host, self.port, self.log_dir, self.restart = host, port, log_dir, restart
        self.replica_urls = [f"http://{host}:{p}" for p in replica_ports(port, replicas)]
        self.url = f"http://{host}:{port}"
        env = dict(os.environ if env is None else env)
        keys, serve_args = self._keys(serve_args, log_dir)
        if _on_cpu(serve_args) and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(replica_threads(os.cpu_count() or 1, replicas))
        self.replicas = [
            _Process(
                f"replica {i}",
                [
                    sys.executable,
                    "-m",
                    "prefillonly_sgl",
                    "serve",
                    *serve_args,
                    "--host",
                    host,
                    "--port",
                    url.rsplit(":", 1)[1],
                ],
                log_dir / f"replica-{i}.log",
                env,
            )  # fmt: skip
            for i, url in enumerate(self.replica_urls)
        ]
        self.gateway = Gateway(
            host, port, self.replica_urls, policy, log_dir / "gateway.log", env,
            gateway_args, keys=keys,
        )  # fmt: skip
        self.restarts = 0

    @staticmethod
    def _keys(serve_args: list[str], log_dir: Path) -> tuple[GatewayKeys, list[str]]:
        """(the gateway's keys, the replicas' serve options): with --tenant-keys the
        replicas read a copy of the file that also holds the gateway's own key, written
        beside the logs, readable by its owner only (gateway_args.gateway_auth)."""
        path = serve_flag_value(serve_args, "--tenant-keys")
        try:
            pairs = load_tenant_key_pairs(path) if path is not None else None
        except TenantKeysError as e:
            raise ValueError(f"--tenant-keys {e}") from None
        keys, replica_pairs = gateway_auth(serve_args, pairs)
        if replica_pairs is None:
            return keys, serve_args
        copy = log_dir / TENANT_KEYS_COPY
        copy.unlink(missing_ok=True)
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        by_tenant: dict[str, list[str]] = {}
        for tenant, key in replica_pairs:
            by_tenant.setdefault(tenant, []).append(key)
        with os.fdopen(fd, "w") as file:
            json.dump(by_tenant, file)
        return keys, with_tenant_keys_file(serve_args, str(copy))

    # -- life cycle ---------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the replicas, then the gateway; return when the gateway routes to all."""
        for replica in self.replicas:
            replica.start()
        deadline = time.monotonic() + timeout
        for replica, url in zip(self.replicas, self.replica_urls, strict=True):
            self._wait(lambda url=url: healthy(url), replica, deadline, f"{url}/health")
        self.gateway.start()
        self._wait(self.gateway.all_registered, self.gateway.process, deadline,
                   "every replica registered")  # fmt: skip
        logger.info("gateway %s routes to %s", self.url, ", ".join(self.replica_urls))

    def _wait(self, ready, process: _Process, deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            if not process.alive():
                self.stop()
                raise ReplicaStartError(
                    f"{process.name} exited with {process.proc.returncode} before {what}; "
                    f"its log ({process.log_path}) ends:\n{process.log_tail()}"
                )
            if ready():
                return
            time.sleep(0.5)
        self.stop()
        raise ReplicaStartError(f"{process.name}: no {what} in time; log: {process.log_path}")

    def supervise(self, stop: threading.Event | None = None, poll_s: float = 1.0) -> None:
        """Until the gateway exits, ``stop`` is set or Ctrl-C: restart replicas that die."""
        stop = stop or threading.Event()
        while self.gateway.process.alive() and not stop.is_set():
            for replica in self.replicas:
                if self.restart and not replica.alive():
                    logger.warning(
                        "%s exited with %s; restarting it (log: %s)",
                        replica.name,
                        replica.proc.returncode,
                        replica.log_path,
                    )
                    replica.stop(timeout=5)
                    replica.start()
                    self.restarts += 1
            stop.wait(poll_s)
        if not stop.is_set():
            tail = self.gateway.process.log_tail()
            raise ReplicaStartError(f"the gateway exited; its log ends:\n{tail}")

    def kill_replica(self, index: int) -> None:
        """SIGKILL replica ``index`` and everything it started (what a crash looks like)."""
        self.replicas[index].signal_group(signal.SIGKILL)

    def stop(self) -> None:
        self.gateway.stop()
        for replica in self.replicas:
            replica.signal_group(signal.SIGTERM)
        for replica in self.replicas:
            replica.stop()
        (self.log_dir / TENANT_KEYS_COPY).unlink(missing_ok=True)

    def __enter__(self) -> ReplicaSet:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

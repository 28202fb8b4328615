"""The gateway's command line for a set of replicas (plain Python; the decisions live here).

Why these settings (smg 1.13.0, measured on localhost, see docs/server.md):
- policy cache_aware (default): the gateway keeps a prefix tree of the text it routes on
  per replica (/v1/rerank: the query; /v1/classify: the input) and sends a request to the
  replica with the longest match above --cache-threshold, so one query's documents, or
  one profile's items, land where that prefix is cached. consistent_hashing routes on the
  `x-smg-routing-key` header instead (clients that know their prefix key), round_robin
  ignores prefixes (the baseline the affinity test measures against).
- worker registration is checked every second instead of every 30 s, so the gateway
  serves as soon as the replicas do.
- health checks every 2 s on SGLang's /ready, unhealthy after 2 failures: a killed
  replica leaves the rotation within ~4 s; requests sent to it meanwhile are retried on
  the others (smg's own retries). Not /health, smg's default: SGLang's /health runs a
  one-token generation and answers only once the scheduler has answered anything (>= 1 s,
  up to 20 s), so under load it overran smg's 5 s probe timeout and smg took the busy
  survivor out too: 131 of 161 requests got 503 no_available_workers ("All workers are
  unavailable") while one of two replicas was down (benchmarks/README.md). /ready answers
  from the HTTP process (200 once the server is up, 503 while it starts), so load cannot
  fail it; a dead replica fails it by refusing the connection.
- no overload veto (`--disable-worker-overload-protection`). smg 1.13 polls each worker's
  /v1/loads and vetoes a worker with >= 8 waiting requests (or KV usage >= 0.8) until the
  next poll; when every worker is vetoed it routes to the least loaded anyway, but a dead
  worker counts as "not vetoed", so one overloaded survivor beside a dead peer leaves no
  candidate and smg answers a non-retryable 503 no_available_workers ("0/2 available (1
  healthy)") for a poll interval (~7 s). That was every error left after the /ready fix:
  642 of 678 requests in one kill's window (8 clients; the survivor had 10-18 waiting);
  0 of 61 with the veto off, same run (benchmarks/README.md). A prefill-only replica
  queues by design (the JCT scheduler orders its queue), so the gateway should not refuse
  what the replica would serve. smg's circuit breaker stays on: it counts consecutive
  failures of the worker tried (a survivor answering 200s cannot open it), and opens on
  a dead replica before its probes do.
- its Prometheus listener on a port of its own, on 127.0.0.1 (smg binds 0.0.0.0:29000 by
  default, which a second gateway on the machine would collide with).
- keys (gateway_auth): replicas started with `--api-key K` answer smg's backend detection
  (/v1/models, /server_info) with 401, so they never registered (measured, smg 1.13.0).
  smg's own `--api-key K` is the key it sends its workers, and it then asks callers for
  it too: the replicas' key is the gateway's. `--tenant-keys` is refused: smg sends every
  replica its one key, so each tenant's requests would reach the replicas as one tenant
  and their prefixes would no longer be kept apart.
"""

from __future__ import annotations

import sys

POLICIES = ("cache_aware", "consistent_hashing", "prefix_hash", "round_robin", "least_load")
HEALTH_CHECK_INTERVAL_S = 2
HEALTH_FAILURE_THRESHOLD = 2
HEALTH_CHECK_ENDPOINT = "/ready"


def gateway_argv(
    host: str,
    port: int,
    worker_urls: list[str],
    prometheus_port: int,
    policy: str = "cache_aware",
    extra: list[str] | None = None,
) -> list[str]:
    """`smg launch ...` for ``worker_urls`` behind ``host:port``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not worker_urls:
        raise ValueError("the gateway needs at least one replica")
    argv = [
        sys.executable, "-m", "smg", "launch",
        "--host", host,
        "--port", str(port),
        "--policy", policy,
        "--worker-urls", *worker_urls,
        "--worker-startup-check-interval", "1",
        "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S),
        "--health-failure-threshold", str(HEALTH_FAILURE_THRESHOLD),
        "--health-success-threshold", "1",
        "--health-check-endpoint", HEALTH_CHECK_ENDPOINT,
        "--disable-worker-overload-protection",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(prometheus_port),
        "--log-level", "warn",
    ]  # fmt: skip
    return argv + list(extra or [])


def replica_ports(port: int, replicas: int) -> list[int]:
    """The replicas listen on the ports after the gateway's."""
    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}")
    if not (0 < port and port + replicas < 65536):
        raise ValueError(f"port {port} + {replicas} replicas is out of range")
    return [port + 1 + i for i in range(replicas)]


def replica_threads(cpu_count: int, replicas: int) -> int:
    """Torch threads per replica on a CPU machine: the cores split between the replicas.
    Each replica would otherwise run a thread per core, and N replicas' OpenMP threads
    spinning on the same cores made each prefill several times slower (measured: two
    replicas on 2 cores, 30-50 tokens/s instead of ~1,000)."""
    return max(1, cpu_count // max(1, replicas))


def serve_flag_value(serve_args: list[str], flag: str) -> str | None:
    """The value of ``flag`` (``--flag V`` or ``--flag=V``) among `serve` options."""
    for i, argument in enumerate(serve_args):
        if argument == flag and i + 1 < len(serve_args):
            return serve_args[i + 1]
        if argument.startswith(flag + "="):
            return argument.split("=", 1)[1]
    return None


def gateway_auth(serve_args: list[str]) -> tuple[list[str], str | None]:
    """(the `smg launch` options for the replicas' key, the key callers of the gateway
    send); ValueError for --tenant-keys (see the module doc)."""
    if serve_flag_value(serve_args, "--tenant-keys") is not None:
        raise ValueError(
            "--tenant-keys: behind SGLang's gateway (smg 1.13) every request reaches the "
            "replicas with the gateway's one key, so tenants would share their cached "
            "prefixes; give the replicas --api-key, or serve each tenant-keyed server on its "
            "own (docs/reliability.md, Keys)"
        )
    key = serve_flag_value(serve_args, "--api-key")
    return (["--api-key", key], key) if key else ([], None)

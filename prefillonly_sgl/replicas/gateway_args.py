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
  smg's own `--api-key K` is the key it sends its workers on its own calls (detection,
  loads, health), and it then asks callers for it too: the replicas' key is the gateway's.
- tenants (gateway_auth with `--tenant-keys`): smg checks a caller's key against its
  `--tenant-api-key TENANT:KEY` list and forwards the caller's own Authorization header to
  the replica on the serving path (measured, smg 1.13.0: a tenant's key reaches the
  replica as sent), so each replica still knows the tenant and keeps its prefixes apart.
  smg's own calls need a key the replicas accept: a fresh one (GATEWAY_TENANT's), added
  to the replicas' tenant file; no caller holds it. The keys reach smg on its standard
  input (gateway_main.py), not its command line.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass, field

from prefillonly_sgl.server.auth import short_key_refusal

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
    """`smg launch ...` for ``worker_urls`` behind ``host:port``, through gateway_main.py
    (which reads the keys from standard input)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not worker_urls:
        raise ValueError("the gateway needs at least one replica")
    argv = [
        sys.executable, "-m", "prefillonly_sgl.replicas.gateway_main",
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


GATEWAY_TENANT = "prefillonly-gateway"  # the tenant of smg's own key on tenant-keyed replicas


@dataclass(frozen=True)
class GatewayKeys:
    """What smg is given (on its standard input, gateway_main.py): ``api_key``, the key it
    sends the replicas on its own calls and accepts from callers; ``tenant_keys``, (tenant,
    key) pairs it also accepts, each forwarded to the replicas as the caller sent it. The
    keys are kept out of repr, so no log line or traceback can show them."""

    api_key: str | None = field(default=None, repr=False)
    tenant_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def smg_options(self) -> list[str]:
        # "--flag=value": a value beginning with "-" (a token_urlsafe key does, 1 in 64)
        # would otherwise read as a flag to smg's argparse ("expected one argument")
        options = [f"--api-key={self.api_key}"] if self.api_key else []
        for tenant, key in self.tenant_keys:
            options.append(f"--tenant-api-key={tenant}:{key}")
        return options

    def to_json(self) -> str:
        return json.dumps({"api_key": self.api_key, "tenant_keys": self.tenant_keys})

    @classmethod
    def from_json(cls, text: str) -> GatewayKeys:
        data = json.loads(text or "{}")
        pairs = tuple((str(t), str(k)) for t, k in data.get("tenant_keys") or ())
        return cls(data.get("api_key"), pairs)


def gateway_auth(
    serve_args: list[str], tenant_keys: list[tuple[str, str]] | None = None
) -> tuple[GatewayKeys, list[tuple[str, str]] | None]:
    """(the gateway's keys, the replicas' tenant keys or None) for replicas run with
    ``serve_args``; ``tenant_keys`` are the pairs of their --tenant-keys file, read by the
    caller. With tenants the replicas get every tenant's key and the gateway's own, and
    the gateway every tenant's (see the module doc). ValueError naming the problem."""
    key = serve_flag_value(serve_args, "--api-key")
    admin_key = serve_flag_value(serve_args, "--admin-api-key")
    refusal = short_key_refusal(**{"--api-key": key, "--admin-api-key": admin_key})
    if refusal is not None:
        raise ValueError(refusal)  # every replica would refuse it (serve's rule)
    if serve_flag_value(serve_args, "--tenant-keys") is None:
        return GatewayKeys(key), None
    if key is not None:
        raise ValueError(
            "--tenant-keys replaces --api-key (as for `prefillonly serve`): give that key a "
            "tenant of its own in the file"
        )
    if tenant_keys is None:
        raise ValueError("--tenant-keys: the file's keys were not read")
    for tenant, _ in tenant_keys:
        if ":" in tenant or tenant == GATEWAY_TENANT:
            raise ValueError(
                f"--tenant-keys: tenant {tenant!r} behind the gateway: a tenant name may not "
                f"contain ':' (smg reads TENANT:KEY) nor be {GATEWAY_TENANT!r} (the gateway's own)"
            )
    own = secrets.token_urlsafe(32)
    return GatewayKeys(own, tuple(tenant_keys)), [*tenant_keys, (GATEWAY_TENANT, own)]


def with_tenant_keys_file(serve_args: list[str], path: str) -> list[str]:
    """``serve_args`` with --tenant-keys pointing at ``path`` (the file with the gateway's key)."""
    out, skip = [], False
    for i, argument in enumerate(serve_args):
        if skip:
            skip = False
            continue
        if argument == "--tenant-keys" and i + 1 < len(serve_args):
            skip = True
            continue
        if argument.startswith("--tenant-keys="):
            continue
        out.append(argument)
    return [*out, "--tenant-keys", path]

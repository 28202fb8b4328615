"""The replica launcher's decisions, without starting anything: the gateway's command line,
the replicas' ports, and options it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefillonly_sgl.replicas.gateway_args import gateway_argv, replica_ports, replica_threads
from prefillonly_sgl.replicas.launcher import ReplicaSet


def test_gateway_command_line_names_the_replicas_policy_and_health_checks():
    argv = gateway_argv("127.0.0.1", 30000, ["http://a:1", "http://b:2"], 40000, "round_robin")
    # smg launch, its keys read from standard input (gateway_main.py)
    assert argv[1:3] == ["-m", "prefillonly_sgl.replicas.gateway_main"]
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == ["http://a:1", "http://b:2"]
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert argv[argv.index("--prometheus-port") + 1] == "40000"
    assert "--health-check-interval-secs" in argv
    # SGLang's /health generates a token: a busy replica overran smg's probe timeout
    assert argv[argv.index("--health-check-endpoint") + 1] == "/ready"
    assert "--disable-worker-overload-protection" in argv  # no 503 while a survivor queues
    with pytest.raises(ValueError, match="policy must be one of"):
        gateway_argv("h", 1, ["u"], 2, "fastest")
    with pytest.raises(ValueError, match="at least one replica"):
        gateway_argv("h", 1, [], 2)


def test_replicas_listen_after_the_gateway_port():
    assert replica_ports(30000, 3) == [30001, 30002, 30003]
    with pytest.raises(ValueError, match="at least 1"):
        replica_ports(30000, 0)
    with pytest.raises(ValueError, match="out of range"):
        replica_ports(65534, 2)


def test_replica_host_and_port_are_the_launchers(tmp_path):
    with pytest.raises(ValueError, match="--port"):
        ReplicaSet(["--model-path", "m", "--port", "5"], log_dir=tmp_path)
    with pytest.raises(ValueError, match="--host"):
        ReplicaSet(["--host=0.0.0.0"], log_dir=tmp_path)


def test_the_replicas_command_refuses_bad_options(capsys):
    from prefillonly_sgl.cli import main

    assert main(["replicas", "--replicas", "0", "--", "--model-path", "m"]) == 2
    assert "at least 1" in capsys.readouterr().out


def test_cpu_replicas_split_the_cores_between_them(tmp_path):
    assert replica_threads(2, 2) == 1 and replica_threads(16, 3) == 5 and replica_threads(1, 4) == 1
    replica_set = ReplicaSet(["--device", "cpu"], replicas=2, log_dir=tmp_path, env={})
    threads = replica_set.replicas[0].env["OMP_NUM_THREADS"]
    assert threads == str(replica_threads(__import__("os").cpu_count(), 2))
    mine = ReplicaSet(["--device", "cpu"], log_dir=tmp_path, env={"OMP_NUM_THREADS": "7"})
    assert mine.replicas[0].env["OMP_NUM_THREADS"] == "7"  # the user's setting wins


def test_the_replicas_key_is_the_gateways():
    from prefillonly_sgl.replicas.gateway_args import GatewayKeys, gateway_auth, serve_flag_value

    assert gateway_auth(["--model-path", "m"]) == (GatewayKeys(), None)
    assert gateway_auth(["--api-key", "key-one-1"]) == (GatewayKeys("key-one-1"), None)
    keys, _ = gateway_auth(["--api-key=key-two-2", "--admin-api-key", "admin-key-3"])
    assert keys.smg_options() == ["--api-key=key-two-2"]
    # smg's own parser takes a key that begins with "-" (secrets.token_urlsafe's do)
    from smg.launch_router import parse_router_args

    dashed = GatewayKeys("-dashed-key-0123", (("alice", "-alice-key-1"),))
    args = parse_router_args(["--worker-urls", "http://w:1", *dashed.smg_options()])
    assert args.api_key == "-dashed-key-0123"
    assert serve_flag_value(["--admin-api-key", "A"], "--api-key") is None
    assert "key-two-2" not in repr(keys)  # a logged or raised GatewayKeys shows no key
    with pytest.raises(ValueError, match="--admin-api-key must be at least 8"):
        gateway_auth(["--api-key", "key-one-1", "--admin-api-key", "A"])
    assert GatewayKeys.from_json(keys.to_json()) == keys


def test_tenant_keyed_replicas_give_the_gateway_every_tenant_and_a_key_of_its_own(tmp_path):
    from prefillonly_sgl.replicas.gateway_args import GATEWAY_TENANT, gateway_auth

    pairs = [("alice", "alice-key-1"), ("bob", "bob-key-22")]
    keys, replica_pairs = gateway_auth(["--tenant-keys", "f"], pairs)
    assert keys.tenant_keys == tuple(pairs) and len(keys.api_key) >= 32
    assert replica_pairs == [*pairs, (GATEWAY_TENANT, keys.api_key)]
    assert keys.smg_options()[1:] == [
        "--tenant-api-key=alice:alice-key-1", "--tenant-api-key=bob:bob-key-22"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="replaces --api-key"):
        gateway_auth(["--tenant-keys", "f", "--api-key", "key-one-1"], pairs)
    with pytest.raises(ValueError, match="may not contain ':'"):
        gateway_auth(["--tenant-keys", "f"], [("a:b", "some-key-1")])
    with pytest.raises(ValueError, match="gateway's own"):
        gateway_auth(["--tenant-keys", "f"], [(GATEWAY_TENANT, "some-key-1")])

    # The launcher: the replicas read a private copy holding the gateway's key too.
    (tmp_path / "keys.txt").write_text("alice alice-key-1\nbob bob-key-22\n")
    logs = tmp_path / "logs"
    replica_set = ReplicaSet(["--tenant-keys", str(tmp_path / "keys.txt")], replicas=1,
                             log_dir=logs, env={})  # fmt: skip
    argv = replica_set.replicas[0].argv
    copy = Path(argv[argv.index("--tenant-keys") + 1])
    assert copy.parent == logs and oct(copy.stat().st_mode & 0o777) == "0o600"
    from prefillonly_sgl.server.tenant_keys import load_tenant_keys

    replicas_keys = load_tenant_keys(copy)
    gateway = replica_set.gateway
    assert replicas_keys.tenant_of(gateway.keys.api_key) == GATEWAY_TENANT
    assert replicas_keys.tenant_of("bob-key-22") == "bob"
    assert "alice-key-1" not in " ".join(gateway.process.argv)  # on its stdin instead
    replica_set.stop()
    assert not copy.exists()
    with pytest.raises(ValueError, match="--tenant-keys .*cannot read"):
        ReplicaSet(["--tenant-keys=missing.txt"], replicas=1, log_dir=logs)

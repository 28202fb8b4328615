"""`prefillonly replicas`: N `prefillonly serve` replicas behind SGLang's gateway."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

from prefillonly_sgl.replicas.gateway_args import POLICIES

EPILOG = """\
example (2 replicas of the default model, the gateway on :30000, replicas on :30001-2):
  prefillonly replicas --replicas 2 --port 30000 -- --app my_app.py --classify sentiment
  curl -s localhost:30000/v1/rerank -H 'content-type: application/json' \\
       -d '{"query": "space films", "documents": ["Alien", "Heat"]}'

Everything after -- goes to each `prefillonly serve` (model, device, --app, ...). Clients
call the gateway: /v1/rerank and /v1/classify (typed endpoints and /v1/score are not
routed by smg 1.13; call a replica for those). A replica that dies is restarted; the
gateway stops routing to it within ~4 s and retries what it had on the others.
"""


def add_parser(commands) -> None:
    replicas = commands.add_parser(
        "replicas",
        help="run N servers behind SGLang's gateway (smg) with prefix-affine routing",
        description="Start N `prefillonly serve` replicas and SGLang's model gateway in "
        "front of them; requests that share a prefix (one query's documents, one user's "
        "items) go to the replica that has it cached.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replicas.add_argument("--replicas", type=int, default=2, help="servers to start (2)")
    replicas.add_argument("--host", default="127.0.0.1", help="gateway and replicas' host")
    replicas.add_argument("--port", type=int, default=30000,
                          help="gateway port; replica i listens on PORT+1+i (30000)")  # fmt: skip
    replicas.add_argument("--policy", choices=POLICIES, default="cache_aware",
                          help="the gateway's routing (default cache_aware)")  # fmt: skip
    replicas.add_argument("--log-dir", type=Path, help="replica-<i>.log, gateway.log")
    replicas.add_argument("--no-restart", action="store_true",
                          help="leave a replica that died down")  # fmt: skip
    replicas.add_argument("serve_args", nargs=argparse.REMAINDER,
                          help="-- then `prefillonly serve` options for every replica")  # fmt: skip
    replicas.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    try:
        import smg  # noqa: F401
    except ImportError:
        print("prefillonly replicas: SGLang's gateway is not installed: "
              "pip install 'prefillonly-sgl[gateway]' (smg==1.13.0)")  # fmt: skip
        return 2
    from prefillonly_sgl.replicas.launcher import ReplicaSet, ReplicaStartError

    logging.basicConfig(level=logging.INFO, format="[replicas] %(message)s")
    serve_args = list(args.serve_args)
    if serve_args[:1] == ["--"]:
        serve_args = serve_args[1:]
    try:
        replica_set = ReplicaSet(
            serve_args,
            replicas=args.replicas,
            host=args.host,
            port=args.port,
            policy=args.policy,
            log_dir=args.log_dir,
            restart=not args.no_restart,
        )
    except ValueError as e:
        print(f"prefillonly replicas: {e}")
        return 2
    print(f"[replicas] starting {args.replicas} replicas (logs: {replica_set.log_dir})")
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: replicas and gateway too
    try:
        replica_set.start()
        urls = ", ".join(replica_set.replica_urls)
        print(f"[replicas] ready: gateway {replica_set.url} -> {urls} ({args.policy}); "
              "Ctrl-C stops all")  # fmt: skip
        replica_set.supervise()
    except ReplicaStartError as e:
        print(f"prefillonly replicas: {e}")
        return 1
    except KeyboardInterrupt:
        print("[replicas] stopping")
    finally:
        # A second Ctrl-C / SIGTERM must not cut the stop short and orphan replicas.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        replica_set.stop()
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt

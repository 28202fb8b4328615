"""`python -m prefillonly_sgl.replicas.gateway_main OPTIONS`: `smg launch OPTIONS` with the
gateway's keys read from standard input (gateway_args.GatewayKeys as JSON), so no key is
on a command line (`ps` shows every process's) or in a log; the launcher writes them.

An empty input means no keys. smg then renames its process (setproctitle "smg::router").
"""

from __future__ import annotations

import sys

from prefillonly_sgl.replicas.gateway_args import GatewayKeys


def main() -> None:
    keys = GatewayKeys.from_json(sys.stdin.read())
    from smg.cli import main as smg_main

    smg_main(["launch", *sys.argv[1:], *keys.smg_options()])


if __name__ == "__main__":
    main()

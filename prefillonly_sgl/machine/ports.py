"""Free TCP ports for the servers this package (and its tests and benchmarks) starts.

Ports are chosen below the kernel's ephemeral range (32768-60999 on Linux), not by
``bind(0)``. A ``bind(0)`` port lies inside that range, and polling such a port before
its server listens can connect the polling socket to itself (TCP simultaneous open:
its source port is drawn from the same range). The poll then reads its own request back
as the status line (``BadStatusLine: GET /health HTTP/1.1``), and while that socket is
open the server cannot bind the port. A port below the range is never a client's source
port, so it cannot happen there.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below this are well-known and registered services' ports
DEFAULT_EPHEMERAL_START = 32768  # Linux's default when the range cannot be read


def ephemeral_start() -> int:
    """The first port the kernel hands out as a client's source port."""
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def _bindable(ports: range, host: str) -> bool:
    try:
        with contextlib.ExitStack() as stack:
            for port in ports:
                stack.enter_context(socket.socket()).bind((host, port))
    except OSError:
        return False
    return True


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """A port p with p .. p+count-1 all free now (a gateway and its replicas)."""
    top = ephemeral_start() - count
    if top > LOWEST_PORT:
        for _ in range(200):
            base = random.randrange(LOWEST_PORT, top)
            if _bindable(range(base, base + count), host):
                return base
    # No room below the ephemeral range (an unusual kernel setting): take bind(0)'s.
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count < 65536 and _bindable(range(base, base + count), host):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port free now, outside the ephemeral range where it can be."""
    return free_port_run(1, host)

"""Ports for started servers lie below the kernel's ephemeral range (no self-connect)."""

import socket
import threading

from prefillonly_sgl.machine import ports
from prefillonly_sgl.replicas.launcher import healthy


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    start = ports.ephemeral_start()
    for _ in range(20):
        base = ports.free_port_run(3)
        assert ports.LOWEST_PORT <= base and base + 3 <= start
        for port in range(base, base + 3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))


def test_a_port_that_does_not_speak_http_is_not_healthy():
    # A listener that answers garbage stands in for a self-connected poll (which reads its
    # own request back as the status line): healthy() says False instead of raising.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer():
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"GET /health HTTP/1.1\r\n\r\n")

        thread = threading.Thread(target=answer)
        thread.start()
        assert healthy(f"http://127.0.0.1:{port}") is False
        thread.join()

"""RemoteBackend sends a request answered 503 again (an overloaded server, or a gateway with
no replica to route to while one restarts), honouring Retry-After, and gives up after
``unavailable_retries``. The server here is a real HTTP server on localhost scripted to
answer 503 a given number of times (the condition cannot be made on demand otherwise)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefillonly_sgl.dsl import RemoteBackend, RemoteBackendError


def scripted_server(unavailable: int):
    state = {"left": unavailable, "calls": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers["Content-Length"]))
            state["calls"] += 1
            if state["left"] > 0:
                state["left"] -= 1
                body, code = {"message": "no_available_workers"}, 503
            else:
                body, code = {"ok": True}, 200
            data = json.dumps(body).encode()
            self.send_response(code)
            if code == 503:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state


def test_a_503_is_retried_until_the_server_answers():
    server, state = scripted_server(unavailable=2)
    try:
        backend = RemoteBackend(f"http://127.0.0.1:{server.server_port}")
        assert backend.post("/v1/rerank", {"query": "q"}) == {"ok": True}
        assert state["calls"] == 3
    finally:
        server.shutdown()


def test_a_server_that_stays_unavailable_is_reported_after_the_retries():
    server, state = scripted_server(unavailable=10)
    try:
        backend = RemoteBackend(f"http://127.0.0.1:{server.server_port}", unavailable_retries=1)
        with pytest.raises(RemoteBackendError, match="503 after 2 tries: no_available_workers"):
            backend.post("/v1/rerank", {"query": "q"})
        assert state["calls"] == 2
    finally:
        server.shutdown()

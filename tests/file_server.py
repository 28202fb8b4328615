"""A folder served over HTTP on localhost (the standard library's server, in a thread),
for tests that fetch files by URL (images in scoring)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from pathlib import Path

from prefillonly_sgl.machine.ports import free_port


@contextlib.contextmanager
def serving(folder: Path):
    """Yields the base URL ("http://127.0.0.1:PORT") of `folder`, served until exit."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()

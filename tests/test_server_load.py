"""`prefillonly serve` under load, overload, a client disconnect and SIGTERM (one server,
tiny model; the SIGTERM test runs last and stops it).

The server bounds admitted work at MAX_PROMPTS prompts, so the load test (32 clients, one
prompt per request) is always admitted, while a request that would push a busy server
past the bound is answered 503 at once."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import max_abs_diff, tiny_server

pytestmark = pytest.mark.slow  # its own server under load

MAX_PROMPTS = 64
CLIENTS = 32
REQUESTS_PER_CLIENT = 32  # 1,024 requests in all
HEAVY_ITEMS, HEAVY_ITEM_TOKENS = 40, 2000  # ~tens of seconds of CPU work: still running
SIGTERM_ITEMS = 24
TOLERANCE = 1e-4


server = tiny_server(
    "--max-pending-prompts", str(MAX_PROMPTS),
    "--max-pending-requests", "48",
    "--shutdown-timeout", "120",
)  # fmt: skip


def metric(server, name: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def loads(server) -> dict:
    return requests.get(f"{server.url}/v1/loads", timeout=30).json()["loads"][0]


def wait_for(condition, timeout: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def heavy_body(labels, seed: int, items: int = HEAVY_ITEMS) -> bytes:
    rng = random.Random(seed)  # random token ids: no prefix-cache hits
    return json.dumps(
        {
            "query": [rng.randrange(10, 390) for _ in range(8)],
            "items": [
                [rng.randrange(10, 390) for _ in range(HEAVY_ITEM_TOKENS)] for _ in range(items)
            ],
            "label_token_ids": labels,
        }
    ).encode()


def open_raw_request(server, path: str, body: bytes) -> socket.socket:
    """Sends a request on a raw socket and leaves it waiting for the answer."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_load_1024_requests_from_32_clients(server, reference, labels):
    prompts = [
        (
            f"User profile {i}: likes science fiction and history books.\n",
            f"Item: book {i}. Yes or No:",
        )
        for i in range(16)
    ]
    expected = [reference.score(q, [item], labels)[0] for q, item in prompts]

    def client(worker: int) -> list[tuple[int, int, object]]:
        results = []
        with requests.Session() as session:
            for n in range(REQUESTS_PER_CLIENT):
                k = (worker * REQUESTS_PER_CLIENT + n) % len(prompts)
                query, item = prompts[k]
                body = {
                    "query": query,
                    "items": [item],
                    "label_token_ids": labels,
                    "apply_softmax": True,
                }
                response = session.post(f"{server.url}/v1/score", json=body, timeout=120)
                scores = (
                    response.json()["scores"][0] if response.status_code == 200 else response.text
                )
                results.append((k, response.status_code, scores))
        return results

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = [r for batch in pool.map(client, range(CLIENTS)) for r in batch]

    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    failures = [(k, status, body) for k, status, body in results if status != 200]
    assert not failures, failures[:5]
    worst = max(max_abs_diff([scores], [expected[k]]) for k, _, scores in results)
    assert worst < TOLERANCE
    assert metric(server, "prefillonly:pending_requests") == 0


def test_overload_is_answered_503_and_a_disconnect_aborts_the_work(server, labels):
    uncached_before = loads(server)["total_prefill_uncached_tokens"]
    disconnects_before = metric(server, "prefillonly:client_disconnects_total")
    heavy = open_raw_request(server, "/v1/score", heavy_body(labels, seed=1))
    try:
        wait_for(
            lambda: metric(server, "prefillonly:pending_prompts") >= HEAVY_ITEMS,
            what="the heavy request to be admitted",
        )
        # 40 prompts in progress + 30 more > 64: refused at once, with a reason and a hint.
        more = {"query": "x", "items": ["a"] * 30, "label_token_ids": labels}
        refused = requests.post(f"{server.url}/v1/score", json=more, timeout=60)
        assert refused.status_code == 503, refused.text
        assert "overloaded" in refused.json()["message"]
        assert refused.headers["retry-after"] == "1"
    finally:
        heavy.close()  # the client goes away before its answer

    def idle():
        load = loads(server)
        return load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0

    wait_for(idle, what="the aborted work to leave the scheduler")
    wait_for(lambda: metric(server, "prefillonly:pending_requests") == 0, what="admission release")
    done = loads(server)["total_prefill_uncached_tokens"] - uncached_before
    assert done < HEAVY_ITEMS * HEAVY_ITEM_TOKENS  # most of it never ran
    assert metric(server, "prefillonly:client_disconnects_total") == disconnects_before + 1
    assert metric(server, 'prefillonly:rejected_requests_total{reason="overloaded"}') >= 1
    ok = requests.post(
        f"{server.url}/v1/score",
        json={"query": "x", "items": ["a"], "label_token_ids": labels},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text


def test_sigterm_finishes_in_flight_work_refuses_new_and_exits_cleanly(server, labels):
    """Runs last: it stops the module's server."""
    result = {}

    def in_flight():
        # Enough work to still be running when the first /metrics poll lands, also with the
        # prefill-only attention backend (4 items finished before it).
        body = heavy_body(labels, seed=2, items=SIGTERM_ITEMS)
        response = requests.post(
            f"{server.url}/v1/score",
            data=body,
            headers={"content-type": "application/json"},
            timeout=300,
        )
        result["status"], result["body"] = response.status_code, response.json()

    thread = threading.Thread(target=in_flight)
    thread.start()
    wait_for(lambda: metric(server, "prefillonly:pending_requests") >= 1, what="in-flight request")
    os.kill(server.proc.pid, signal.SIGTERM)
    wait_for(
        lambda: requests.get(f"{server.url}/health", timeout=30).status_code == 503,
        what="/health to report the shutdown",
    )
    refused = requests.post(
        f"{server.url}/v1/score",
        json={"query": "x", "items": ["a"], "label_token_ids": labels},
        timeout=60,
    )
    assert refused.status_code == 503 and "shutting down" in refused.json()["message"]

    thread.join(timeout=300)
    assert result["status"] == 200, result
    assert len(result["body"]["scores"]) == SIGTERM_ITEMS
    # The whole process group (HTTP server, scheduler, detokenizer, resource tracker) exits.
    assert server.wait_group_gone(timeout=120), server.log_tail()
    assert server.proc.wait(timeout=10) == 0

"""Two real `prefillonly serve` replicas behind SGLang's real gateway (`smg` 1.13.0) on
localhost (`prefillonly replicas`' ReplicaSet; tiny random Llama, float32):

- prefix affinity: queries repeated in shuffled rounds are served where they are cached
  under the gateway's cache-aware policy (cached-token share >= 80% from round 2), against
  round-robin over the same replicas, measured in the same run; the gateway's answers
  equal a single replica's;
- the DSL's remote backend through the gateway (/v1/rerank, /v1/classify) equals a direct
  replica, and refuses calls the gateway cannot carry;
- a replica killed with SIGKILL does not take the service down: the gateway stops routing
  to it, every request after that succeeds, and the restarted replica comes back;
- the replicas run with `--tenant-keys` (two tenants): the gateway asks callers for a
  tenant's key and forwards it, so each tenant's prefixes stay apart on the replicas, and
  no log of the set holds a key.
No timing is asserted."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import requests
from server_process import serve_env

from prefillonly_sgl.apis.rerankers import qwen3_reranker
from prefillonly_sgl.dsl import RemoteBackend
from prefillonly_sgl.dsl.gateway_client import GatewayRouteError
from prefillonly_sgl.replicas.launcher import Gateway, ReplicaSet, ReplicaStartError, free_port_run
from prefillonly_sgl.scoring.errors import InvalidRequestError

pytestmark = pytest.mark.slow  # a gateway and two replicas

pytest.importorskip("smg", reason="SGLang's gateway: pip install 'prefillonly-sgl[gateway]'")

APP = Path(__file__).with_name("ranking_app_example.py")
TOLERANCE = 1e-4
ROUNDS = 3
DOCUMENTS = ["a space opera", "a cooking show"]
# The replicas run with two tenants' keys (`replicas -- --tenant-keys FILE`): the gateway
# is given them and a key of its own (gateway_args.gateway_auth); calls here send alice's.
KEY = "alice-key-0123456789"
BOB_KEY = "bob-key-9876543210"
HEADERS = {"Authorization": f"Bearer {KEY}"}
# Five long, distinct queries (the shared prefix), so a warm call is mostly cached tokens
# and round-robin cannot line up with the rounds by accident (an odd count, shuffled).
TOPICS = ["space travel", "french cooking", "jazz history", "mountain birds", "old trains"]
QUERIES = [
    f"user {i} likes {topic}; " + " ".join(f"{topic} note {k}." for k in range(40))
    for i, topic in enumerate(TOPICS)
]


@pytest.fixture(scope="module")
def replicas(tiny_llama_path, tmp_path_factory):
    logs = tmp_path_factory.mktemp("replicas")
    keys_file = tmp_path_factory.mktemp("keys") / "tenants.txt"
    keys_file.write_text(f"alice {KEY}\nbob {BOB_KEY}\n")
    serve_args = [
        "--model-path", str(tiny_llama_path),
        "--device", "cpu",
        "--dtype", "float32",
        "--max-total-tokens", "4096",
        "--skip-server-warmup",
        "--app", str(APP),
        "--classify", "review_sentiment",
        "--rerank-method", "judge",  # the tiny model would get query likelihood
        "--tenant-keys", str(keys_file),
    ]  # fmt: skip
    for attempt in range(2):
        replica_set = ReplicaSet(
            serve_args, replicas=2, port=free_port_run(3), log_dir=logs, env=serve_env()
        )
        try:
            replica_set.start()
            break
        except ReplicaStartError as error:
            # The ports were free when chosen; another process (seen once in CI, right
            # after the Ray tests) can take one while the replicas start. Once more.
            if attempt or "Address already in use" not in str(error):
                raise
    # A second gateway over the same replicas: the round-robin baseline of the same run.
    rr = Gateway("127.0.0.1", free_port_run(1), replica_set.replica_urls, "round_robin",
                 logs / "gateway-rr.log", serve_env(), keys=replica_set.gateway.keys)  # fmt: skip
    try:
        rr.start()
        rr.wait_registered()
        replica_set.logs = logs
        yield replica_set, rr
    finally:
        rr.stop()
        replica_set.stop()


def rerank(url: str, query: str, key: str = KEY, **extra) -> list[dict]:
    body = {"query": query, "documents": DOCUMENTS, **extra}
    headers = {"Authorization": f"Bearer {key}"}
    response = requests.post(f"{url}/v1/rerank", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    return answer["results"] if isinstance(answer, dict) else answer


def flush(replica_set: ReplicaSet) -> None:
    # SGLang refuses a flush (400) while its scheduler still holds a request; the last
    # answer can reach the client a moment before the scheduler has let its request go.
    for url in replica_set.replica_urls:
        deadline = time.monotonic() + 30
        while (status := _flush_once(url)) == 400:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 200


def _flush_once(url: str) -> int:
    return requests.post(f"{url}/flush_cache", headers=HEADERS, timeout=60).status_code


def cached_share_by_round(url: str, seed: int) -> list[float]:
    """Each round sends every query once, in a shuffled order; per round: cached prompt
    tokens / prompt tokens, as the replicas reported them for each call."""
    rng = random.Random(seed)
    shares = []
    for _ in range(ROUNDS):
        order = rng.sample(range(len(QUERIES)), len(QUERIES))
        cached = prompt = 0
        for i in order:
            meta = rerank(url, QUERIES[i])[0]["meta_info"]
            cached += meta["call_cached_tokens"]
            prompt += meta["call_prompt_tokens"]
        shares.append(cached / prompt)
    return shares


def probs_by_index(results: list[dict]) -> list[list[float]]:
    return [r["meta_info"]["probs"] for r in sorted(results, key=lambda r: r["index"])]


def test_cache_aware_routing_keeps_each_query_on_the_replica_that_cached_it(replicas):
    replica_set, rr = replicas
    flush(replica_set)
    affine = cached_share_by_round(replica_set.url, seed=1)
    flush(replica_set)
    round_robin = cached_share_by_round(rr.url, seed=1)
    print(f"cached share by round: cache_aware {affine}, round_robin {round_robin}")
    assert all(share >= 0.8 for share in affine[1:]), affine
    assert sum(round_robin[1:]) < sum(affine[1:]), (round_robin, affine)
    # The gateway's answers are a single replica's.
    direct = replica_set.replica_urls[0]
    for query in QUERIES[:2]:
        via_gateway = probs_by_index(rerank(replica_set.url, query))
        single = probs_by_index(rerank(direct, query, rid=None))
        assert max(abs(a - b) for g, s in zip(via_gateway, single) for a, b in zip(g, s)) < (
            TOLERANCE
        )


def test_through_the_gateway_rerank_answers_in_sglang_shape_and_4xx_pass_through(replicas):
    replica_set, _ = replicas
    results = rerank(replica_set.url, QUERIES[0])
    assert [r["index"] for r in results] != [] and {"score", "index"} <= set(results[0])
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    empty = requests.post(
        f"{replica_set.url}/v1/rerank", json={"query": "q", "documents": []}, headers=HEADERS,
        timeout=60,
    )  # fmt: skip
    assert 400 <= empty.status_code < 500, empty.text


def test_the_dsl_through_the_gateway_equals_a_direct_replica(replicas, tiny_llama_path):
    import ranking_app_example as app

    replica_set, _ = replicas
    gateway = RemoteBackend(replica_set.url, api_key=KEY)
    direct = RemoteBackend(replica_set.replica_urls[0], tokenizer=str(tiny_llama_path),
                           typed_endpoints=False, api_key=KEY)  # fmt: skip
    assert gateway.is_gateway and not direct.is_gateway

    via = qwen3_reranker(QUERIES[3], items=DOCUMENTS, engine=gateway)
    want = qwen3_reranker(QUERIES[3], items=DOCUMENTS, engine=direct)
    assert [r.index for r in via.items] == [r.index for r in want.items]
    assert max(abs(a.score - b.score) for a, b in zip(via.by_input, want.by_input)) < TOLERANCE
    assert gateway.prompt_tokens > 0

    reviews = ["great film, loved it", "dull and far too long", "fine"]
    via_c = app.review_sentiment.batch(reviews, engine=gateway)
    want_c = app.review_sentiment.batch(reviews, engine=direct)
    for a, b in zip(via_c, want_c, strict=True):
        assert a.label == b.label
        assert max(abs(a.probs[k] - b.probs[k]) for k in a.probs) < TOLERANCE

    with pytest.raises(GatewayRouteError, match="qwen3_reranker"):
        app.relevant("q", items=["x"], engine=gateway)  # the replicas serve another ranker
    with pytest.raises(InvalidRequestError, match="instruction"):
        qwen3_reranker("q", items=["x"], instruction="other", engine=gateway)


@pytest.mark.faults  # a replica SIGKILLed
def test_a_killed_replica_costs_clients_nothing(replicas):
    """SIGKILL one replica under 4 closed-loop clients that never retry: with smg's own
    retries and health checks on /ready (gateway_args.py) every request succeeds, while
    the replica is down and after the supervisor has restarted it."""
    replica_set, _ = replicas
    stop, done = threading.Event(), threading.Event()
    supervisor = threading.Thread(target=replica_set.supervise, args=(stop,), daemon=True)
    supervisor.start()
    dead = replica_set.replica_urls[1]
    outcomes: list[tuple[bool, str]] = []  # (gateway lists the dead replica, outcome)

    def client(k: int) -> None:
        while not done.is_set():
            listed = dead in replica_set.gateway.healthy_workers()
            body = {"query": QUERIES[k % len(QUERIES)], "documents": DOCUMENTS}
            try:
                response = requests.post(
                    f"{replica_set.url}/v1/rerank", json=body, headers=HEADERS, timeout=60
                )
                outcomes.append((listed, "ok" if response.ok else response.text[:200]))
            except requests.RequestException as e:
                outcomes.append((listed, f"{type(e).__name__}: {e}"))

    clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    try:
        for thread in clients:
            thread.start()
        time.sleep(2)
        replica_set.kill_replica(1)
        deadline = time.monotonic() + 120
        while dead in replica_set.gateway.healthy_workers():
            assert time.monotonic() < deadline, "the gateway never stopped routing to it"
            time.sleep(0.5)
        # The supervisor restarted it and the gateway takes it back.
        deadline = time.monotonic() + 240
        while dead not in replica_set.gateway.healthy_workers():
            assert time.monotonic() < deadline, "the restarted replica did not come back"
            time.sleep(1)
        time.sleep(2)
        done.set()
        for thread in clients:
            thread.join(timeout=70)
        failed = [outcome for _, outcome in outcomes if outcome != "ok"]
        unlisted = sum(1 for listed, _ in outcomes if not listed)
        print(f"{len(outcomes)} requests, {unlisted} while the replica was out; failed: {failed}")
        assert unlisted >= 1 and not failed
        assert replica_set.restarts == 1
        direct = probs_by_index(rerank(dead, QUERIES[2], rid=None))
        other = probs_by_index(rerank(replica_set.replica_urls[0], QUERIES[2], rid=None))
        assert max(abs(a - b) for d, o in zip(direct, other) for a, b in zip(d, o)) < TOLERANCE
    finally:
        done.set()
        stop.set()
        supervisor.join(timeout=10)


def cached_tokens(url: str, query: str, key: str) -> int:
    # rid: SGLang's answer shape (with meta_info) from a replica too, as smg always asks
    return rerank(url, query, key=key, rid=None)[0]["meta_info"]["call_cached_tokens"]


def test_two_tenants_stay_apart_through_the_gateway(replicas):
    """alice's query cached on a replica (her second call finds the whole prompt cached:
    the gateway routes the same text to the same replica) is not bob's: his first call of
    the same query, routed there too, finds less (what he cached himself: the template's
    head, the call's second document reusing its first's prefix); his second finds it all."""
    replica_set, _ = replicas
    query = "tenant check; " + QUERIES[4]
    alice_first = cached_tokens(replica_set.url, query, KEY)
    alice_warm = cached_tokens(replica_set.url, query, KEY)
    assert alice_warm > alice_first
    bob_first = cached_tokens(replica_set.url, query, BOB_KEY)
    assert bob_first < alice_warm
    assert cached_tokens(replica_set.url, query, BOB_KEY) == alice_warm
    # Another query alice sent through the gateway, asked of each replica directly: where
    # it is cached for alice (the whole prompt but the last tokens), bob finds at most what
    # he cached himself (the template's head, the call's own sharing).
    other = "second check; " + QUERIES[3]
    rerank(replica_set.url, other, key=KEY)
    bob = [cached_tokens(url, other, BOB_KEY) for url in replica_set.replica_urls]
    alice = [cached_tokens(url, other, KEY) for url in replica_set.replica_urls]
    assert max(bob) < max(alice), (bob, alice)


def test_the_keyed_gateway_refuses_a_caller_without_a_key_and_logs_none(replicas):
    """`replicas -- --tenant-keys FILE` (the module's replicas): the gateway asks its
    callers for a tenant's key; our client without one, or with a key no tenant holds,
    gets a clear error; no log of the set holds any key, the gateway's own included."""
    from prefillonly_sgl.dsl import RemoteAuthenticationError

    replica_set, rr = replicas
    body = {"query": QUERIES[0], "documents": DOCUMENTS}
    assert requests.post(f"{replica_set.url}/v1/rerank", json=body, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer no-tenant-holds-this"}
    assert requests.post(f"{replica_set.url}/v1/rerank", json=body, headers=wrong,
                         timeout=60).status_code == 401  # fmt: skip
    with pytest.raises(RemoteAuthenticationError, match="wants an API key"):
        qwen3_reranker(QUERIES[0], items=DOCUMENTS, engine=RemoteBackend(replica_set.url))
    logs = {p.name: p.read_text(errors="replace") for p in replica_set.logs.glob("*.log")}
    assert {"gateway.log", "gateway-rr.log", "replica-0.log", "replica-1.log"} <= set(logs)
    keys = [KEY, BOB_KEY, replica_set.gateway.keys.api_key]
    assert not [name for name, text in logs.items() if any(key in text for key in keys)]
    for process in [replica_set.gateway.process, rr.process, *replica_set.replicas]:
        assert not any(key in " ".join(process.argv) for key in keys)

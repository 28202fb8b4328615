"""Tenant isolation of the prefix cache (issue 54, item 3): a request reuses, and reports
as cached, only prefixes cached under its own salt (scoring/cache_salts.py); on a server with
--tenant-keys every key's tenant is a namespace of its own (server/tenant_keys.py,
sglang_runtime/http_server/tenant_requests.py).

The plain rules first (no SGLang), then the session's tiny Engine with two salts, then
one server with two tenant keys (started once for the module)."""

from __future__ import annotations

import json
import time

import pytest
import requests
from conftest import TESTS, tiny_server

from prefillonly_sgl.features.jct_scheduler.prefix_marks import prefix_marks
from prefillonly_sgl.scoring.cache_salts import effective_salt
from prefillonly_sgl.scoring.call_context import cache_salt
from prefillonly_sgl.server.tenant_keys import TenantKeysError, parse_tenant_keys

KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-9876543210"

# A profile well past the JCT scheduler's 64-token group threshold, so its items share it.
PROFILE = (
    "User profile: enjoys slow science fiction, long documentaries about the sea, quiet "
    "jazz records from the fifties, and novels about families over several generations; "
    "dislikes horror, loud action films and reality television of every kind. "
) * 3


# -- the plain rules ------------------------------------------------------------------


def test_tenant_keys_file_formats():
    lines = parse_tenant_keys(f"# tenants\nacme {KEY_A}\n\nglobex {KEY_B}\n")
    as_json = parse_tenant_keys(f'{{"acme": ["{KEY_A}"], "globex": "{KEY_B}"}}')
    for keys in (lines, as_json):
        assert keys.tenant_of(KEY_A) == "acme"
        assert keys.tenant_of(KEY_B) == "globex"
        assert keys.tenant_of("someone-else-key") is None
        assert keys.tenant_of(None) is None
        assert keys.tenants == ["acme", "globex"]


@pytest.mark.parametrize(
    "text, problem",
    [
        (f"acme {KEY_A}\nglobex {KEY_A}\n", "two tenants"),
        ("acme short\n", "at least"),
        (f"acme {KEY_A} extra\n", "two words"),
        ("# nothing\n", "no tenant keys"),
        ('{"acme": 5}', "at least"),
        ("{not json", "not valid JSON"),
    ],
)
def test_tenant_keys_file_problems_are_named(text, problem):
    with pytest.raises(TenantKeysError, match=problem):
        parse_tenant_keys(text)


def test_a_tenant_cannot_name_another_tenants_namespace():
    a = effective_salt("acme", None)
    assert a == effective_salt("acme", "")  # no salt and "" are one namespace
    assert a != effective_salt("globex", None)
    # Whatever salt another tenant (or a caller without one) sends, it lands elsewhere.
    for salt in (None, "acme", a, '["acme", ""]'):
        assert effective_salt("globex", salt) != a
        assert effective_salt(None, salt) != a or salt == a  # no tenant: SGLang's meaning
    assert effective_salt("acme", "x") != effective_salt("acme", "y") != a
    assert effective_salt(None, None) is None and effective_salt(None, "x") == "x"


def test_prefix_groups_never_span_namespaces():
    ids = list(range(1000, 1200))
    plain = prefix_marks(ids, 150)
    a = prefix_marks(ids, 150, (None, "a"))
    b = prefix_marks(ids, 150, (None, "b"))
    assert plain.group != a.group != b.group
    assert not {h for _, h in a.levels} & {h for _, h in b.levels}  # no shared level either
    assert prefix_marks(ids, 150, (None, "a")) == a


# -- the Engine: two salts -----------------------------------------------------------


def test_engine_salts_keep_cached_prefixes_apart(tiny_engine, yes_no_labels):
    """The same profile under salt A, then B, then A again (one item each, so a call's
    own items cannot hit each other): only A's second call reports the profile cached;
    the scores are the unsalted ones."""
    engine = tiny_engine
    r = len(engine.tokenizer.encode(PROFILE))
    first_a = engine.score(PROFILE, ["Item: a sea documentary"], yes_no_labels, cache_salt="a1")
    first_b = engine.score(PROFILE, ["Item: a jazz record"], yes_no_labels, cache_salt="b1")
    second_a = engine.score(PROFILE, ["Item: a jazz record"], yes_no_labels, cache_salt="a1")
    assert first_a.cached_tokens == 0
    assert first_b.cached_tokens == 0  # A's profile is cached, but not for B
    assert second_a.cached_tokens >= r - 1  # A's own profile (the last token recomputed)
    # A salt set around the call (the DSL's and the batch runner's way) is the same salt.
    with cache_salt("b1"):
        second_b = engine.score(PROFILE, ["Item: a sea documentary"], yes_no_labels)
    assert second_b.cached_tokens >= r - 1
    unsalted = engine.score(PROFILE, ["Item: a jazz record"], yes_no_labels)
    assert unsalted.scores[0] == pytest.approx(first_b.scores[0], abs=1e-4)
    assert second_a.scores[0] == pytest.approx(first_b.scores[0], abs=1e-4)


def test_engine_continuations_are_salted_too(tiny_engine):
    query = PROFILE + "A film:"
    first = tiny_engine.continuation_logprobs(query, [" the sea"], " yes", cache_salt="c1")
    other = tiny_engine.continuation_logprobs(query, [" the sea"], " yes", cache_salt="c2")
    again = tiny_engine.continuation_logprobs(query, [" a film"], " yes", cache_salt="c1")
    assert first.cached_tokens == 0 and other.cached_tokens == 0
    assert again.cached_tokens > 0
    assert other.token_logprobs[0] == pytest.approx(first.token_logprobs[0], abs=1e-4)


def test_a_batch_job_runs_in_its_salt(tiny_engine, tmp_path):
    """run_batch(cache_salt=...): the DSL's calls of the job in that namespace (the local
    backend through the call's context). The same job again under its salt finds the
    shared few-shot prefix cached; under another salt it computes it as the first did."""
    from batch_app_example import liked

    from prefillonly_sgl.batch import run_batch

    records = [{"review": r, "drug": "d"} for r in ("better now", "not again", "ok", "fine")]

    def job(name, salt):
        out = tmp_path / f"{name}.jsonl"
        report = run_batch(liked, records, out, engine=tiny_engine, cache_salt=salt, progress=False)
        return report, [json.loads(line) for line in out.read_text().splitlines()]

    first, rows = job("first", "job-a")
    again, rows_again = job("again", "job-a")
    other, rows_other = job("other", "job-b")
    assert again.cached_tokens > first.cached_tokens
    # Under another salt the prefix is computed again, at least once: only requests that
    # shared a forward with the one computing it may read it (followers packed behind it,
    # features/prefill_kv/packing.py; how many did depends on arrival timing), never the
    # job-a cache, which every request of `again` hit.
    shared = again.cached_tokens // len(records)
    assert again.cached_tokens == shared * len(records) > 0
    assert other.cached_tokens <= shared * (len(records) - 1)
    assert first.cached_tokens <= shared * (len(records) - 1)
    for row in (*rows_again, *rows_other):  # a cache hit's scores: the same to 1e-4
        same = rows[row["row"]]
        assert row["label"] == same["label"]
        assert row["probs"]["Yes"] == pytest.approx(same["probs"]["Yes"], abs=1e-4)


# -- one server, two tenants -------------------------------------------------------------

tenants_server = tiny_server(
    "--tenant-keys", str(TESTS / "tenant_keys_example.txt"),
    "--app", str(TESTS / "dsl_app_example.py"),
    "--app", str(TESTS / "ranking_app_example.py"),
    "--classify", "review_sentiment",
    name="tenants_server",
)  # fmt: skip


def _post(server, path, body, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{server.url}{path}", json=body, headers=headers, timeout=120)


def _score(server, key, item, labels, **extra):
    body = {"query": PROFILE, "items": [item], "label_token_ids": labels, **extra}
    answer = _post(server, "/v1/score", body, key)
    assert answer.status_code == 200, answer.text
    content = answer.json()
    return content["scores"], content["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_tenant_keys_open_the_server_and_nothing_else(tenants_server):
    body = {"query": "q", "items": ["i"], "label_token_ids": [1]}
    assert _post(tenants_server, "/v1/score", body, None).status_code == 401
    assert _post(tenants_server, "/v1/score", body, "not-a-tenant-key").status_code == 401
    assert _post(tenants_server, "/v1/score", body, KEY_A).status_code == 200
    assert requests.get(f"{tenants_server.url}/health", timeout=10).status_code == 200


def test_tenant_b_never_sees_tenant_a_cached_profile(tenants_server, yes_no_labels):
    first_a, cached = _score(tenants_server, KEY_A, "Item: a sea documentary", yes_no_labels)
    assert cached == 0
    first_b, cached = _score(tenants_server, KEY_B, "Item: a jazz record", yes_no_labels)
    assert cached == 0  # A's profile is in the cache; B's first request does not see it
    # Nor by sending a salt: its salt only splits B's own namespace.
    _, cached = _score(
        tenants_server, KEY_B, "Item: a quiet novel", yes_no_labels, cache_salt="acme"
    )
    assert cached == 0
    second_a, cached = _score(tenants_server, KEY_A, "Item: a jazz record", yes_no_labels)
    assert cached > 0  # A's own profile
    assert second_a[0] == pytest.approx(first_b[0], abs=1e-4)


def test_sglang_own_routes_run_in_the_tenants_namespace(tenants_server):
    """/generate is SGLang's handler, untouched: the tenant's salt still reaches it."""

    def generate(key, tail):
        # Another profile than the tests above cached in A's namespace.
        body = {"text": "Second user. " + PROFILE + tail, "sampling_params": {"max_new_tokens": 1}}
        answer = _post(tenants_server, "/generate", body, key)
        assert answer.status_code == 200, answer.text
        return answer.json()["meta_info"]["cached_tokens"]

    assert generate(KEY_A, " Film one:") == 0
    assert generate(KEY_B, " Film two:") == 0
    assert generate(KEY_A, " Film three:") > 0


def test_every_scoring_route_takes_a_cache_salt(tenants_server):
    """Each route with `cache_salt` in its body: answered (200), and run in the salted
    namespace: the same request again reports its own prefix cached."""
    review = "Review sentiment of a long stay. " * 12
    docs = ["the sea at night", "a loud action film"]
    calls = {
        "/v1/score_labels": {"query": PROFILE, "items": ["Item: x"], "labels": [" Yes", " No"]},
        "/v1/rerank": {"query": PROFILE, "documents": docs},
        "/v2/rerank": {"query": PROFILE, "documents": docs},
        "/rerank": {"query": PROFILE, "texts": docs},
        "/v1/classify": {"input": [review]},
        "/v1/decisions": {
            "model": "m",
            "input": PROFILE,
            "questions": [{"type": "predicate", "instructions": "Likes the sea?"}],
        },
        "/v1/systemone": {
            "model": "m",
            "state": PROFILE,
            "questions": {"sea": {"type": "noul", "instructions": "Likes the sea?"}},
        },
        "/apps/sentiment": {"review": review},
        "/apps/sentiment/batch": {"inputs": [{"review": review}]},
        "/apps/recommend": {"profile": PROFILE, "items": ["a sea film"]},
        "/v1/completions": {"prompt": PROFILE, "max_tokens": 1},
        "/v1/chat/completions": {
            "messages": [{"role": "user", "content": PROFILE}],
            "max_tokens": 1,
        },
    }
    for path, body in calls.items():
        for salt in ("s1", "s2"):
            answer = _post(tenants_server, path, {**body, "cache_salt": salt}, KEY_A)
            assert answer.status_code == 200, (path, answer.text)
    # The salt reaches the cache: under a new salt the profile is not cached, then it is.
    fresh = {**calls["/v1/score_labels"], "cache_salt": "s3"}
    cached = [_post(tenants_server, "/v1/score_labels", fresh, KEY_A).json() for _ in range(2)]
    assert [c["usage"]["cached_tokens"] == 0 for c in cached] == [True, False]
    # A salt that is not a string is refused where the body is read.
    bad_body = {**calls["/v1/score_labels"], "cache_salt": 5}
    bad = _post(tenants_server, "/v1/score_labels", bad_body, KEY_A)
    assert bad.status_code == 400


# -- embeddings: SGLang gives them no salt field (cache_salts.py, embedding_salts.py) ------

embedding_tenants_server = tiny_server(
    "--tenant-keys", str(TESTS / "tenant_keys_example.txt"),
    "--is-embedding",
    name="embedding_tenants_server",
)  # fmt: skip


def _encode_cached_tokens(server, path: str, body: dict, key: str) -> int:
    """The request's cached prompt tokens, from the scheduler's "Prefill batch" log line
    (SGLang's embedding answers carry no cached_tokens)."""
    before = server.log_path.read_text(errors="replace").count("Prefill batch")
    answer = _post(server, path, body, key)
    assert answer.status_code == 200, answer.text
    for _ in range(50):  # the scheduler's line is written before the answer; allow a flush
        lines = [line for line in server.log_path.read_text(errors="replace").splitlines()
                 if "Prefill batch" in line]  # fmt: skip
        if len(lines) > before:
            return int(lines[before].split("#cached-token:")[1].split(",")[0])
        time.sleep(0.1)
    raise AssertionError("no Prefill batch line for the request")


def test_embeddings_run_in_the_tenants_namespace(embedding_tenants_server):
    """Before: a second tenant's /encode found the first's 511 of 512 tokens cached. Now
    each tenant's embeddings match only its own cached prefixes, and a body's own
    `cache_salt` (/v1/embeddings, /encode) splits the tenant's cache further."""
    server = embedding_tenants_server
    text = {"text": "Embedding check. " + PROFILE}
    assert _encode_cached_tokens(server, "/encode", text, KEY_A) == 0
    assert _encode_cached_tokens(server, "/encode", text, KEY_A) > 0
    assert _encode_cached_tokens(server, "/encode", text, KEY_B) == 0  # A's, not B's
    assert _encode_cached_tokens(server, "/encode", text, KEY_B) > 0
    openai = {"input": "Embedding check. " + PROFILE, "model": "m", "cache_salt": "s1"}
    assert _encode_cached_tokens(server, "/v1/embeddings", openai, KEY_A) == 0
    assert _encode_cached_tokens(server, "/v1/embeddings", openai, KEY_A) > 0
    salted = {**text, "cache_salt": "s2"}
    assert _encode_cached_tokens(server, "/encode", salted, KEY_A) == 0
    bad = _post(server, "/v1/embeddings", {**openai, "cache_salt": 5}, KEY_A)
    assert bad.status_code == 400 and "cache_salt must be a string" in bad.text


# -- our own clients with keys (dsl/backends/remote.py) ----------------------------------


def test_the_dsl_runs_through_remote_backend_with_a_key_and_names_what_is_wrong(
    tenants_server, monkeypatch
):
    """A @classifier against the keyed server: RemoteBackend(api_key=...) (and the
    PREFILLONLY_API_KEY variable) sends the key on every call (/openapi.json, the typed
    endpoint); without one, or with a refused one, a clear error naming the server and
    what is wrong, the key never shown."""
    from dsl_app_example import sentiment

    from prefillonly_sgl.dsl import RemoteAuthenticationError, RemoteBackend

    monkeypatch.delenv("PREFILLONLY_API_KEY", raising=False)
    review = "It cured my headache within an hour."
    answer = sentiment(review, engine=RemoteBackend(tenants_server.url, api_key=KEY_A))
    assert answer.label in ("positive", "negative")
    with pytest.raises(RemoteAuthenticationError, match="wants an API key") as missing:
        sentiment(review, engine=RemoteBackend(tenants_server.url))
    assert tenants_server.url in str(missing.value) and "PREFILLONLY_API_KEY" in str(missing.value)
    wrong = "wrong-key-0123456789"
    with pytest.raises(RemoteAuthenticationError, match="refused this client's API key") as e:
        sentiment(review, engine=RemoteBackend(tenants_server.url, api_key=wrong))
    assert wrong not in str(e.value) and wrong not in repr(RemoteBackend("http://x", api_key=wrong))
    monkeypatch.setenv("PREFILLONLY_API_KEY", KEY_B)
    again = sentiment(review, engine=RemoteBackend(tenants_server.url))
    assert again.probs == pytest.approx(answer.probs, abs=1e-4)

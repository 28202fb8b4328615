"""`prefillonly serve` on a tiny model, called with a stock HTTP client (requests): SGLang's
endpoints, usage, metrics, the --app endpoints and their OpenAPI schema, and every kind
of malformed request answered with a 4xx naming the problem, the server still up after.
One server for the whole module (start-up ~15-40 s on CPU)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import requests
from conftest import max_abs_diff, tiny_server
from server_process import run_command, serve_command

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt
from prefillonly_sgl.dsl import RemoteBackend

pytestmark = pytest.mark.slow  # its own server

APP = Path(__file__).with_name("server_app_example.py")
MAX_REQUEST_BYTES = 200_000
POOL = 1024  # KV pool tokens: score prompts may be longer (prefill-only KV), generate not
TOLERANCE = 1e-4  # float32 server vs float32 transformers

QUERY = "User profile: likes science fiction, history books and long walks.\n"
ITEMS = [
    "Item: a documentary about the history of the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
]


server = tiny_server(
    "--app", str(APP),
    "--max-request-bytes", str(MAX_REQUEST_BYTES),
    "--max-total-tokens", str(POOL),  # overrides the 4096 default of running_server
)  # fmt: skip


def post(server, path, body, **kwargs):
    return requests.post(f"{server.url}{path}", json=body, timeout=60, **kwargs)


# -- SGLang's endpoints, unchanged -----------------------------------------------------------


def test_health_and_model_info(server, tiny_llama_path):
    assert requests.get(f"{server.url}/health", timeout=30).status_code == 200
    info = requests.get(f"{server.url}/get_model_info", timeout=30).json()
    assert info["model_path"] == str(tiny_llama_path) and info["is_generation"] is True
    # Ours joins SGLang's /server_info: the model family and what it switched off (none).
    ours = requests.get(f"{server.url}/server_info", timeout=30).json()["prefillonly"]
    assert ours["model_family"] == "llama" and ours["features_off"] == {}
    assert "prefill_attention" in ours["features"]


def test_score_matches_transformers_and_reports_usage(server, reference, labels):
    response = post(
        server,
        "/v1/score",
        {"query": QUERY, "items": ITEMS, "label_token_ids": labels, "apply_softmax": True},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    want = reference.score(QUERY, ITEMS, labels)
    assert max_abs_diff(body["scores"], want) < TOLERANCE
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"]
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    assert usage["queue_time"] >= 0 and usage["running_time"] >= 0
    assert int(response.headers["x-prefillonly-prompt-tokens"]) == usage["prompt_tokens"]
    assert "x-prefillonly-queue-time" in response.headers


def test_repeated_prefix_is_reported_as_cached(server, labels):
    body = {"query": QUERY, "items": ITEMS[:1], "label_token_ids": labels}
    first = post(server, "/v1/score", body).json()
    again = post(server, "/v1/score", body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert max_abs_diff(first["scores"], again["scores"]) < TOLERANCE


def test_score_prompt_longer_than_the_kv_pool(server, reference, labels):
    """With prefill-only KV a score prompt keeps pool KV only for its query, so the server
    accepts it up to the context length (4096), not the pool (1024); a generate prompt
    keeps KV for every token and is still refused past the pool."""
    item = " ".join(f"item{i}" for i in range(700)) + ". Relevant?"
    n_tokens = len(reference.prompt_ids(QUERY, item))
    assert 2 * POOL < n_tokens < 4000
    body = {"query": QUERY, "items": [item], "label_token_ids": labels, "apply_softmax": True}
    response = post(server, "/v1/score", body)
    assert response.status_code == 200, response.text
    assert max_abs_diff(response.json()["scores"], reference.score(QUERY, [item], labels)) < 1e-4
    response = post(server, "/generate", {"input_ids": [5] * (2 * POOL)})
    assert response.status_code == 400 and "longer than the" in response.text, response.text
    assert post(server, "/v1/score", {"query": QUERY, "items": ITEMS, "label_token_ids": labels}).ok


def test_score_with_token_ids_and_per_item_labels(server, reference, labels):
    query_ids = reference.tokenizer.encode(QUERY)
    item_ids = [reference.tokenizer.encode(i, add_special_tokens=False) for i in ITEMS]
    body = {"query": query_ids, "items": item_ids, "label_token_ids": [labels, labels[::-1]]}
    response = post(server, "/v1/score", body)
    assert response.status_code == 200, response.text
    want = reference.score(query_ids, item_ids, labels, apply_softmax=False)
    got = response.json()["scores"]
    assert max_abs_diff([got[0], got[1][::-1]], want) < TOLERANCE


def test_score_with_the_setwise_readout_and_the_prefix_cache(server, reference, labels):
    """/v1/score with score_extraction_token (SGLang's setwise readout, its text resolved to
    a dedicated token as stock resolves it): one [anchors x labels] matrix per item, each
    anchor within 1e-4 of transformers; the same body again reports the query's tokens
    as cached (stock serves the readout only with the radix cache off)."""
    token = reference.tokenizer.eos_token
    anchor = reference.tokenizer.convert_tokens_to_ids(token)
    query_ids = reference.tokenizer.encode(QUERY)
    item_ids = [
        reference.tokenizer.encode(f" {item} A", add_special_tokens=False)
        + [anchor]
        + reference.tokenizer.encode(" B", add_special_tokens=False)
        + [anchor]
        for item in ITEMS
    ]
    body = {
        "query": query_ids,
        "items": item_ids,
        "label_token_ids": labels,
        "apply_softmax": False,
        "score_extraction_token": token,
    }
    for _ in range(2):  # the second: the query from the prefix cache
        response = post(server, "/v1/score", body)
        assert response.status_code == 200, response.text
        answer = response.json()
        for item, matrix in zip(item_ids, answer["scores"], strict=True):
            want = reference.anchor_logprobs(query_ids + item, anchor, labels)
            got = [[math.log(p) for p in row] for row in matrix]
            assert len(matrix) == 2 and max_abs_diff(got, want) < TOLERANCE
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] >= 2 * len(query_ids) - 2
    refused = post(server, "/v1/score", {**body, "items": [query_ids]})  # no anchor
    assert refused.status_code == 400 and "score-extraction token" in refused.text


def test_a_setwise_ranker_through_remote_backend(server, reference):
    """@ranker(setwise=TOKEN) on a RemoteBackend: one /v1/score with every candidate in one
    prompt, each candidate's probabilities within 1e-4 of transformers."""
    token = reference.tokenizer.eos_token

    @prefillonly.ranker(labels=["Yes", "No"], score="Yes", setwise=token)
    def shortlist(profile: str, item: str) -> Prompt:
        return Prompt(prefix=profile, item=f"- {item}, relevant?")

    candidates = ["socks", "a space opera", "history of walks"]
    ranking = shortlist(QUERY, items=candidates, engine=RemoteBackend(server.url))
    (request,) = shortlist.compile(reference.tokenizer, QUERY, items=candidates).requests
    rows = reference.anchor_logprobs(
        reference.tokenizer.encode(request.query + request.items[0]),
        reference.tokenizer.convert_tokens_to_ids(token),
        request.label_token_ids,
    )
    want = [[math.exp(x) / sum(math.exp(y) for y in row) for x in row] for row in rows]
    got = [[r.probs["Yes"], r.probs["No"]] for r in ranking.by_input]
    assert len(got) == 3 and max_abs_diff(got, want) < TOLERANCE


def test_a_classifier_with_a_temperature_through_remote_backend(server, reference):
    """@classifier(temperature=T) on a RemoteBackend: labels of one token go to /v1/score
    with SGLang's temperature field, labels of several tokens to /v1/score_labels with the
    same field; both the softmax of the labels' log-probabilities over T, within 1e-4 of
    transformers."""
    review = "Review: it worked, no side effects\nSentiment:"

    @prefillonly.classifier(labels=["positive", "negative"], temperature=2.5)
    def warm(text: str) -> str:
        return text

    @prefillonly.classifier(labels=["very positive", "negative"], temperature=0.5)
    def sharp(text: str) -> str:
        return text

    backend = RemoteBackend(server.url)
    for function in (warm, sharp):
        (request,) = function.compile(reference.tokenizer, review).requests
        result = function(review, engine=backend)
        (probs,) = reference.score_sequences(
            request.query, request.items, request.label_token_ids, apply_softmax=False
        )
        scaled = [math.log(p) / function.temperature for p in probs]
        want = [math.exp(x) / sum(math.exp(y) for y in scaled) for x in scaled]
        got = [result.probs[label] for label in function.labels.texts]
        assert max_abs_diff([got], [want]) < TOLERANCE, function
        # the temperature counts: the log-odds are the plain ones over it
        log_odds = math.log(got[0] / got[1])
        assert abs(log_odds * function.temperature - math.log(probs[0] / probs[1])) < 1e-3
        assert abs(log_odds - math.log(probs[0] / probs[1])) > 0.1


def test_generate(server):
    response = post(
        server,
        "/generate",
        # ignore_eos: the random tiny model samples its end-of-text token now and then
        # (seen once: one completion token)
        {"text": "Review: good", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
    )
    assert response.status_code == 200, response.text
    meta = response.json()["meta_info"]
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == 2
    assert "queue_time" in meta  # --enable-metrics is on by default
    assert response.headers["x-prefillonly-prompt-tokens"] == str(meta["prompt_tokens"])


def test_metrics_show_queue_latency_and_cache_hit_rate(server, labels):
    post(server, "/v1/score", {"query": QUERY, "items": ITEMS, "label_token_ids": labels})
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for name in (
        "sglang:num_queue_reqs",  # SGLang's scheduler queue length
        "sglang:e2e_request_latency_seconds_bucket",
        "sglang:cache_hit_rate",
        "prefillonly:pending_requests",
        'prefillonly:request_latency_seconds_bucket{endpoint="/v1/score"',
        "prefillonly:prefix_cache_hit_rate",
        "prefillonly:cached_prompt_tokens_total",
    ):
        assert name in text, name


# -- typed endpoints (--app and built-in) ----------------------------------------------------


def test_app_classifier_endpoint(server, reference):
    text = "this medicine worked well"
    response = post(server, "/classify/sentiment", {"text": text})
    assert response.status_code == 200, response.text
    body = response.json()
    ids = [
        reference.tokenizer.encode(w, add_special_tokens=False)[0]
        for w in (" positive", " negative")
    ]
    want = reference.score(f"Review: {text}\nSentiment:", [""], ids)[0]
    assert max_abs_diff([list(body["probabilities"].values())], [want]) < TOLERANCE
    assert body["label"] == ("positive" if want[0] >= want[1] else "negative")
    assert "x-prefillonly-prompt-tokens" in response.headers


def test_app_ranker_endpoint(server):
    response = post(
        server, "/rank/relevance", {"profile": "likes history", "items": ["a", "b", "c"]}
    )
    assert response.status_code == 200, response.text
    scores = response.json()["scores"]
    assert len(scores) == 3 and all(0 <= s <= 1 for s in scores)


def test_app_handlers_see_the_cached_tokens_of_their_score_call(server):
    """context.score returns the same ScoreResult as Engine.score, cached tokens included."""
    body = {"profile": "likes long walks and history books " * 8, "items": ["a", "b"]}
    first = post(server, "/rank/relevance", body)
    again = post(server, "/rank/relevance", body)
    assert first.status_code == again.status_code == 200, again.text
    cached = again.json()["cached_tokens"]
    assert cached > 0  # the profile (the query) is in the prefix cache now
    assert cached == int(again.headers["x-prefillonly-cached-tokens"])  # the one call


def test_openapi_lists_typed_endpoints_with_schemas(server):
    doc = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]
    for path, request_model, response_model in (
        ("/classify/sentiment", "Review", "Sentiment"),
        ("/rank/relevance", "RelevanceRequest", "RelevanceResponse"),
        ("/v1/score_labels", "ScoreLabelsRequest", "ScoreLabelsResponse"),
    ):
        operation = doc["paths"][path]["post"]
        request_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        response_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert request_ref.endswith(f"/{request_model}")
        assert response_ref["$ref"].endswith(f"/{response_model}")
    assert schemas["Review"]["required"] == ["text"]
    assert schemas["Sentiment"]["properties"]["label"]["enum"] == ["positive", "negative"]
    assert "/v1/score" in doc["paths"] and "/generate" in doc["paths"]  # SGLang's stay


def test_score_labels_builtin(server, reference):
    body = {"query": QUERY, "items": ITEMS, "labels": [" Yes", " No"]}
    response = post(server, "/v1/score_labels", body)
    assert response.status_code == 200, response.text
    got = response.json()
    ids = [reference.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    want = reference.score(QUERY, ITEMS, ids)
    assert max_abs_diff([list(row.values()) for row in got["scores"]], want) < TOLERANCE
    assert got["rows"] == [list(row.values()) for row in got["scores"]]
    assert got["usage"]["prompt_tokens"] > 0


def test_score_labels_of_several_tokens(server, reference):
    words = [" Yes", " history books", " No thanks"]
    body = {"query": QUERY, "items": ITEMS, "labels": words}
    response = post(server, "/v1/score_labels", body)
    assert response.status_code == 200, response.text
    ids = [reference.tokenizer.encode(w, add_special_tokens=False) for w in words]
    assert [len(x) for x in ids] == [1, 4, 5]  # the tiny tokenizer's pieces
    want = reference.score_sequences(QUERY, ITEMS, ids)
    assert max_abs_diff(response.json()["rows"], want) < TOLERANCE
    # the same labels as token ids, raw and per token
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": ids, "apply_softmax": False}
    response = post(server, "/v1/score_labels", {**body, "length_normalize": True})
    assert response.status_code == 200, response.text
    want = reference.score_sequences(QUERY, ITEMS, ids, apply_softmax=False, length_normalize=True)
    assert max_abs_diff(response.json()["rows"], want) < TOLERANCE


# -- malformed requests: 4xx naming the problem, never a 500 or a crash -----------------------

GOOD = {"query": QUERY, "items": ITEMS[:1], "label_token_ids": [5, 6]}
BAD_REQUESTS = [
    # (id, path, raw body or JSON, status, message fragment)
    ("invalid-json", "/v1/score", b'{"query": "x", ', 400, "not valid JSON"),
    ("non-utf8", "/v1/score", b'{"query": "\xff\xfe", "items": ["a"]}', 400, "not valid UTF-8"),
    ("empty-body", "/v1/score", b"", 400, "body is empty"),
    ("not-an-object", "/v1/score", [1, 2], 400, "must be a JSON object"),
    ("missing-items", "/v1/score", {"query": "x", "label_token_ids": [5]}, 400, "items is missing"),
    ("missing-labels", "/v1/score", {"query": "x", "items": ["a"]}, 400, "label_token_ids is missing"),  # noqa: E501
    ("items-wrong-type", "/v1/score", {**GOOD, "items": 5}, 400, "items must be a list"),
    ("item-wrong-type", "/v1/score", {**GOOD, "items": [1.5]}, 400, "items[0] must be a string"),
    ("labels-wrong-type", "/v1/score", {**GOOD, "label_token_ids": "Yes"}, 400, "must be a list"),
    ("empty-prompt", "/v1/score", {**GOOD, "query": "", "items": [""]}, 400, "prompt (query + item) is empty"),  # noqa: E501
    ("unknown-label", "/v1/score", {**GOOD, "label_token_ids": [10**6]}, 400, "Token ID 1000000 is out of vocabulary"),  # noqa: E501
    ("negative-label", "/v1/score", {**GOOD, "label_token_ids": [-1]}, 400, "Token ID -1 is out of vocabulary"),  # noqa: E501
    ("duplicate-labels", "/v1/score", {**GOOD, "label_token_ids": [5, 6, 5]}, 400, "duplicates: [5]"),  # noqa: E501
    ("label-lists-count", "/v1/score", {**GOOD, "label_token_ids": [[5], [6]]}, 400, "2 lists for 1 items"),  # noqa: E501
    ("item-id-out-of-vocab", "/v1/score", {**GOOD, "query": [1], "items": [[2, 10**6]]}, 400, "outside the vocabulary"),  # noqa: E501
    ("text-and-ids-mixed", "/v1/score", {**GOOD, "items": [[1, 2]]}, 400, "both be text or both be token ids"),  # noqa: E501
    ("prompt-too-long", "/v1/score", {**GOOD, "query": "word " * 5000}, 400, "longer than the"),
    ("too-many-items", "/v1/score", {**GOOD, "items": ["a"] * 5000}, 413, "at most"),
    ("body-too-large", "/v1/score", {**GOOD, "query": "x" * (MAX_REQUEST_BYTES + 1)}, 413, "--max-request-bytes"),  # noqa: E501
    ("huge-number", "/v1/score", b'{"query": "x", "items": ["a"], "label_token_ids": [1e999]}', 400, "not valid JSON"),  # noqa: E501
    ("deep-nesting", "/v1/score", b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),
    ("bad-temperature", "/v1/score", {**GOOD, "apply_softmax": True, "temperature": 0}, 400, "temperature"),  # noqa: E501
    ("generate-empty-text", "/generate", {"text": "", "sampling_params": {"max_new_tokens": 1}}, 400, "text is empty"),  # noqa: E501
    ("generate-empty-ids", "/generate", {"input_ids": []}, 400, "input_ids is empty"),
    ("generate-id-out-of-vocab", "/generate", {"input_ids": [1, 10**6]}, 400, "outside the vocabulary"),  # noqa: E501
    ("generate-negative-tokens", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),  # noqa: E501
    ("generate-wrong-type", "/generate", {"text": 5}, 400, "text must be"),
    ("completions-empty-prompt", "/v1/completions", {"model": "default", "prompt": ""}, 400, "prompt is empty"),  # noqa: E501
    ("chat-absurd-n", "/v1/chat/completions", {"model": "default", "messages": [], "n": 10**6}, 413, "at most"),  # noqa: E501
    ("generate-absurd-n", "/generate", {"text": "hi", "sampling_params": {"n": 10**6}}, 413, "at most"),  # noqa: E501
    ("chat-wrong-type", "/v1/chat/completions", {"model": "default", "messages": "hi"}, 400, "messages"),  # noqa: E501
    ("label-words-and-ids", "/v1/score_labels", {"items": ["a"], "labels": [" Yes"], "label_token_ids": [5]}, 400, "exactly one of labels"),  # noqa: E501
    ("label-no-labels", "/v1/score_labels", {"items": ["a"]}, 400, "exactly one of labels"),
    ("label-ids-empty-label", "/v1/score_labels", {"items": ["a"], "label_token_ids": [[5], []]}, 400, "non-empty list"),  # noqa: E501
    ("label-words-duplicate", "/v1/score_labels", {"items": ["a"], "labels": [" Yes", " Yes"]}, 400, "must be distinct"),  # noqa: E501
    # after a trailing space the tokenizer writes " s" as one token: the prompt's space changes
    ("label-merges-with-prompt", "/v1/score_labels", {"query": "They like to walk ", "items": [""], "labels": ["s", " No"]}, 400, "label 's' merges with the prompt's last characters"),  # noqa: E501
    ("app-missing-field", "/classify/sentiment", {}, 400, "text: Field required"),
    ("app-empty-field", "/classify/sentiment", {"text": ""}, 400, "text"),
    ("app-wrong-type", "/rank/relevance", {"profile": "x", "items": "abc"}, 400, "items"),
    ("app-empty-items", "/rank/relevance", {"profile": "x", "items": []}, 400, "items"),
]  # fmt: skip


@pytest.mark.parametrize(
    "path, body, status, message",
    [case[1:] for case in BAD_REQUESTS],
    ids=[c[0] for c in BAD_REQUESTS],
)
def test_bad_request_gets_4xx_naming_the_problem(server, path, body, status, message):
    if isinstance(body, bytes):
        response = requests.post(
            f"{server.url}{path}",
            data=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
    else:
        response = post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()
    # SGLang's error shape, or the one its /generate uses: {"error": {"message": ...}}
    text = error["message"] if "message" in error else error["error"]["message"]
    assert message in text, error


def test_server_still_answers_after_bad_requests(server, reference, labels):
    assert server.proc.poll() is None
    assert requests.get(f"{server.url}/health", timeout=30).status_code == 200
    response = post(
        server, "/v1/score", {"query": QUERY, "items": ITEMS, "label_token_ids": labels}
    )
    assert (
        max_abs_diff(response.json()["scores"], reference.score(QUERY, ITEMS, labels, False)) < 1e-4
    )
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    assert 'prefillonly:rejected_requests_total{reason="invalid"}' in text


# -- the command line (no server) ------------------------------------------------------------


def test_serve_help_lists_our_options_and_sglangs():
    out = run_command(serve_command("--help"))
    assert out.returncode == 0, out.stderr
    for flag in (
        "--app",
        "--max-pending-requests",
        "--shutdown-timeout",
        "--model-path",
        "--attention-backend",
    ):
        assert flag in out.stdout, flag


def test_serve_rejects_a_bad_app_before_starting(tmp_path):
    empty = tmp_path / "no_endpoints.py"
    empty.write_text("X = 1\n")
    out = run_command(serve_command("--app", str(empty)))
    assert out.returncode == 2 and "declares no endpoints" in out.stderr


def test_serve_refuses_a_key_too_short_to_keep_out_of_the_logs():
    """A key under 8 characters (the tenant keys' rule) is refused before anything starts:
    the logs' redaction searches every line only for values of 6 characters or more."""
    from prefillonly_sgl.server.auth import short_key_refusal

    assert short_key_refusal(**{"--api-key": "long-enough-key", "--admin-api-key": None}) is None
    assert "--admin-api-key must be at least 8" in short_key_refusal(
        **{"--api-key": "long-enough-key", "--admin-api-key": "adm"}
    )
    out = run_command(serve_command("--api-key", "q7z"))
    assert out.returncode != 0
    assert "--api-key must be at least 8 characters (got 3)" in out.stderr
    assert "q7z" not in out.stderr

"""Hostile input against a real `prefillonly serve` (tiny Llama, float32): property-based
bodies (hypothesis) for every work endpoint — a valid body with one field replaced by
a wrong type, an empty / huge / deeply nested / unicode (lone surrogates included) value,
out-of-vocabulary or negative token ids, a prompt far longer than the context; a field
dropped or an unknown one added; any JSON at all; bytes that are not JSON. Each answer is
200 or a 4xx whose JSON body names the problem, never a 5xx or a dropped connection, and
afterwards the server still answers a valid request exactly as before.

In the suite: FUZZ_EXAMPLES bodies per endpoint (default 40, derandomized). The
reliability figure (docs/reliability.md) is the same module with thousands:

    FUZZ_EXAMPLES=600 FUZZ_RANDOM=1 .venv/bin/python -m pytest tests/test_fuzz_endpoints.py -s
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import psutil
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_process import running_server

pytestmark = pytest.mark.slow  # its own server, fuzzed

TESTS = Path(__file__).parent
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
MAX_REQUEST_BYTES = 300_000
POOL = 1024
QUERY = "User profile: likes science fiction and history books.\n"
ITEM = "Item: a documentary about the moon landing. Relevant? Answer Yes or No:"

# A valid body per endpoint; the bodies drawn below start from these.
VALID = {
    "/v1/score": {"query": QUERY, "items": [ITEM], "label_token_ids": [287, 286],
                  "apply_softmax": True},
    "/v1/score_labels": {"query": QUERY, "items": [ITEM], "labels": [" Yes", " No thanks"]},
    "/v1/rerank": {"query": "history books", "documents": ["a moon documentary", "socks"]},
    "/v2/rerank": {"model": "m", "query": "history books", "documents": ["a moon", "socks"],
                   "max_tokens_per_doc": 8},
    "/rerank": {"query": "history books", "texts": ["a moon documentary", "socks"],
                "raw_scores": True, "truncate": True, "truncation_direction": "Left"},
    "/v1/classify": {"input": ["great pills", "awful taste"]},
    # vLLM's shapes on shared paths (docs/server.md, "Peer conventions on one path").
    "/v1/score#vllm": {"model": "m", "queries": "history books",
                       "documents": ["a moon documentary", "socks"], "use_activation": False},
    "/rerank#vllm": {"model": "m", "query": "history books", "documents": ["a moon", "socks"],
                     "top_n": 1, "truncate_prompt_tokens": 100},
    "/v1/classify#vllm": {"model": "m", "messages": [{"role": "user", "content": "great pills"}],
                          "truncate_prompt_tokens": 4, "use_activation": False},
    "/classify/sentiment": {"text": "great pills"},
    "/rank/relevance": {"profile": "likes trains", "items": ["a train set", "socks"]},
    "/apps/relevant": {"query": "history books", "items": ["a moon documentary", "socks"]},
    # Single-token OpenAI requests (prefill-only), with every extension they may carry.
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "system", "content": QUERY},
                                                        {"role": "user", "content": ITEM}],
                             "max_tokens": 1, "temperature": 0, "logprobs": True,
                             "top_logprobs": 2, "logit_bias": {"287": 1.5},
                             "logprob_token_ids": [287, 286]},
    "/v1/completions": {"model": "m", "prompt": [QUERY + ITEM, QUERY + "Item: socks."],
                        "max_tokens": 1, "temperature": 0, "logprobs": 2,
                        "shared_prefix": QUERY, "logprob_token_ids": [287, 286]},
    # Typed decisions: OpenAI's shape, SGLang's own body on the same path, System One's.
    "/v1/decisions": {"model": "m", "input": QUERY, "debias": "reverse", "questions": [
        {"type": "predicate", "instructions": "Does the user like books?", "name": "books"},
        {"type": "choice", "instructions": "Genre?", "choices": [
            {"value": "science fiction"}, {"value": "history", "description": "the past"},
            {"value": True}]},
        {"type": "score", "instructions": "How much?", "levels": [{"label": "low"},
                                                                   {"label": "high"}]}]},
    "/v1/decisions#sglang": {"input": QUERY, "return_prompt_token_ids": True, "questions": [
        {"id": "books", "type": "yes_no", "question": "Does the user like books?"},
        {"id": "genre", "type": "choice", "question": "Genre?",
         "options": [{"name": "fiction"}, {"name": "history"}]}]},
    "/v1/systemone": {"model": "m", "state": QUERY, "questions": {
        "books": {"type": "noul", "instructions": "Does the user like books?"},
        "genre": {"type": "choice", "criteria": {"fiction": None, "history": "the past"}},
        "level": {"type": "score", "criteria": ["low", "high"]}}},
    # A loglikelihood request as lm-eval sends it (the URL fragment only names the case).
    "/v1/completions#echo": {"model": "m", "prompt": [[1, 40, 41, 42, 43, 44]], "echo": True,
                             "logprobs": 1, "max_tokens": 0, "temperature": 0, "seed": 1234},
}  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # NaN and infinities too: not JSON, sent as Python's json writes them
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
hostile = st.one_of(
    json_values,
    st.just(""),
    st.just([]),
    st.just({}),
    st.text(alphabet=st.characters(codec=None, categories=None), min_size=1, max_size=64),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e" * 8, "😀" * 500]),
    st.just("history " * 20_000),  # ~20k tokens: past the context
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), min_size=1, max_size=8),
    st.integers(min_value=0, max_value=399).map(lambda token: [token] * 20_000),
    st.just(["x"] * 5_000),  # many prompts
)


@st.composite
def bodies(draw, path: str):
    """Bytes to POST to `path`: a mutated valid body, any JSON, or not JSON at all."""
    valid = VALID[path]
    kind = draw(st.sampled_from(["replace", "replace", "replace", "drop", "extra", "any",
                                 "bytes", "deep"]))  # fmt: skip
    if kind == "deep":  # nesting deeper than any JSON parser's recursion (written as text)
        depth = draw(st.integers(min_value=100, max_value=100_000))
        field = json.dumps(draw(st.sampled_from(sorted(valid))))
        return f"{{{field}: {'[' * depth}{']' * depth}}}".encode()
    if kind == "bytes":
        return draw(st.one_of(st.binary(max_size=64), st.just(json.dumps(valid)[:-3].encode())))
    if kind == "any":
        body = draw(json_values)
    else:
        body = dict(valid)
        field = draw(st.sampled_from(sorted(valid)))
        if kind == "replace":
            body[field] = draw(hostile)
        elif kind == "drop":
            del body[field]
        else:
            body[draw(st.text(min_size=1, max_size=12))] = draw(hostile)
    return json.dumps(body).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def server(tiny_llama_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "serve.log"
    with running_server(
        tiny_llama_path,
        log,
        "--app", str(TESTS / "server_app_example.py"),
        "--app", str(TESTS / "ranking_app_example.py"),
        "--classify", "review_sentiment",
        "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--max-total-tokens", str(POOL),
    ) as srv:  # fmt: skip
        srv.baseline = {path: _post(srv, path, json.dumps(body).encode()) for path, body in
                        VALID.items()}  # fmt: skip
        srv.outcomes = collections.Counter()
        srv.rss = [_rss(srv)]
        yield srv
        srv.rss.append(_rss(srv))
        print(f"\n[fuzz] {sum(srv.outcomes.values())} bodies: {dict(srv.outcomes)}; server "
              f"memory {srv.rss[0] / 2**20:.0f} -> {srv.rss[-1] / 2**20:.0f} MiB")  # fmt: skip


def _post(server, path: str, data: bytes) -> requests.Response:
    return requests.post(f"{server.url}{path}", data=data, timeout=120,
                         headers={"content-type": "application/json"})  # fmt: skip


def _rss(server) -> int:
    """Resident memory of the server and its SGLang processes."""
    root = psutil.Process(server.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def _check(server, path: str, data: bytes) -> None:
    try:
        response = _post(server, path, data)
    except requests.RequestException as e:
        pytest.fail(f"{path}: no answer ({type(e).__name__}) to {data[:200]!r}")
    status = response.status_code
    server.outcomes[f"{path} {status}"] += 1
    assert status == 200 or 400 <= status < 500, f"{path} {status}: {response.text[:300]}"
    if status != 200:
        error = response.json()  # JSON, whatever the request was
        message = error.get("message") or error.get("detail") or error.get("error")
        assert message, f"{path} {status} without a message: {response.text[:300]}"


@pytest.mark.parametrize("path", sorted(VALID))
def test_every_body_gets_200_or_a_4xx_naming_the_problem(server, path):
    assert server.baseline[path].status_code == 200, server.baseline[path].text

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              derandomize=not os.environ.get("FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(bodies(path))
    def body_is_answered(data):
        _check(server, path, data)

    body_is_answered()


def test_the_server_answers_as_before_after_the_fuzzing(server):
    """Runs after the fuzzing (pytest keeps file order): same answers to the valid bodies."""
    for path, body in VALID.items():
        again = _post(server, path, json.dumps(body).encode())
        assert again.status_code == 200, again.text
        before = server.baseline[path].json()
        if path == "/v1/score":  # usage differs (cache hits); the scores may not
            before, again_json = before["scores"], again.json()["scores"]
        elif path.startswith(("/v1/chat/completions", "/v1/completions")):
            before, again_json = _openai_view(before), _openai_view(again.json())
        else:
            again_json = again.json()
        assert _without_usage(again_json) == _without_usage(before)


def _openai_view(answer: dict) -> list:
    """What a single-token answer says: each choice's token and its logprobs (4 places:
    the batch a request lands in may move float32 sums in the 6th)."""
    view = []
    for choice in answer["choices"]:
        text = choice.get("text", (choice.get("message") or {}).get("content"))
        view.append((text, _rounded(choice["logprobs"], 4)))
    return view


def _rounded(value, places: int):
    if isinstance(value, dict):
        return {k: _rounded(v, places) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, places) for v in value]
    return round(value, places) if isinstance(value, float) else value


def _without_usage(value):
    """The answer without its per-call usage, timings and ids (they differ per call)."""
    volatile = {"usage", "meta_info", "id", "created", "cached_tokens", "rid"}
    if isinstance(value, dict):
        return {k: _without_usage(v) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [_without_usage(v) for v in value]
    return round(value, 5) if isinstance(value, float) else value

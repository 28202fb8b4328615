"""Hostile input against a real `prefillonly serve` (tiny Llama, float32): property-based
bodies (hypothesis) for every work endpoint — a valid body with one field replaced by
a wrong type, an empty / huge / deeply nested / unicode (lone surrogates included) value,
out-of-vocabulary or negative token ids, a prompt far longer than the context; a field
dropped or an unknown one added; any JSON at all; bytes that are not JSON. Each answer is
200 or a 4xx whose JSON body names the problem, never a 5xx or a dropped connection, and
afterwards the server still answers a valid request exactly as before.

The server runs with keys (--api-key, --admin-api-key, the fuzzing sends the API key) and
the auth walk runs on it too: every route (the OpenAPI list plus SGLang's undocumented
ones, read from its app) without a key, with the API key and with the admin key; bodies
too large and zstd bombs without a key (refused before they are read); custom logit
processors (the admin key only, loaded in a throwaway process); and every answer, and the
server's log, grepped for both keys (docs/reliability.md, "Keys").

In the suite: FUZZ_EXAMPLES bodies per endpoint (default 40, derandomized). The
reliability figure (docs/reliability.md) is the same module with thousands:

    FUZZ_EXAMPLES=600 FUZZ_RANDOM=1 .venv/bin/python -m pytest tests/test_fuzz_endpoints.py -s
"""

from __future__ import annotations

import collections
import json
import os
import re
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
# Distinct enough to grep every answer for (server/redaction.py redacts short ones by
# field; a one-letter key cannot be searched for in text).
API_KEY = "fuzz-api-key-K7q2"
ADMIN_KEY = "fuzz-admin-key-A9z4"
AS_CLIENT = {"authorization": f"Bearer {API_KEY}"}
AS_ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
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
    "/v1/score#vllm-labels": {"model": "m", "queries": "history books", "documents": ["a moon"],
                              "label_token_ids": [287, 286], "apply_softmax": False},
    "/generative_scoring": {"model": "m", "query": QUERY, "items": [ITEM],
                            "label_token_ids": [287, 286], "item_first": True},
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
    # Choice requests answered by scoring (docs/openai.md, "Choice requests").
    "/v1/chat/completions#choice": {"model": "m", "messages": [{"role": "user", "content": ITEM}],
                                    "temperature": 0, "logprobs": True, "top_logprobs": 2,
                                    "structured_outputs": {"choice": ["Yes", "No", "Maybe not"]}},
    "/v1/completions#choice": {"model": "m", "prompt": [QUERY + ITEM, QUERY + "Item: socks."],
                               "temperature": 0, "logprobs": 1, "shared_prefix": QUERY,
                               "guided_choice": [" Yes", " No"], "n": 2},
    "/v1/chat/completions#schema": {"model": "m", "temperature": 0, "messages": [
        {"role": "user", "content": ITEM}], "response_format": {"type": "json_schema",
        "json_schema": {"name": "r", "schema": {"type": "object", "required": ["like", "genre"],
            "properties": {"like": {"type": "boolean"}, "genre": {"enum": ["history", 3]}}}}}},
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
    # Moderation (docs/moderation.md): the tiny Llama as a policy classifier.
    "/v1/moderations": {"input": [QUERY, ITEM], "policies": ["No spam.", "No insults."],
                        "threshold": 0.4, "cache_salt": "s"},
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
        "--api-key", API_KEY,
        "--admin-api-key", ADMIN_KEY,
        "--enable-custom-logit-processor",
        "--enable-metrics",
    ) as srv:  # fmt: skip
        srv.baseline = {path: _post(srv, path, json.dumps(body).encode()) for path, body in
                        VALID.items()}  # fmt: skip
        srv.outcomes = collections.Counter()
        srv.auth = collections.defaultdict(collections.Counter)
        srv.rss = [_rss(srv)]
        yield srv
        srv.rss.append(_rss(srv))
        print(f"\n[fuzz] {sum(srv.outcomes.values())} bodies: {dict(srv.outcomes)}; server "
              f"memory {srv.rss[0] / 2**20:.0f} -> {srv.rss[-1] / 2**20:.0f} MiB")  # fmt: skip
        answers = sum(sum(statuses.values()) for statuses in srv.auth.values())
        print(f"[auth] {getattr(srv, 'route_count', 0)} routes, {answers} answers checked")
        for (method, kind, who), statuses in sorted(srv.auth.items()):
            print(f"[auth] {method} | {kind} | {who} | "
                  f"{', '.join(f'{n}x {s}' for s, n in sorted(statuses.items()))}")  # fmt: skip


def _post(server, path: str, data: bytes, auth=AS_CLIENT) -> requests.Response:
    return requests.post(f"{server.url}{path}", data=data, timeout=120,
                         headers={"content-type": "application/json", **auth})  # fmt: skip


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
        # Equal within 2e-5: a cached prefix or another batch moves float32 sums in the 6th
        # place, which rounding both to 5 places turned into a flip at a boundary
        # (0.881415 -> 0.88141 vs 0.88142).
        _assert_close(_without_usage(again_json), _without_usage(before), path)


# -- Keys: every route without and with each key; no answer carries one (issue 54) --

# GET routes that act (profile, memory, logging, sessions): walked without a key and with
# the API key (refused or harmless there), not with the admin key, which would run them.
ACTS = {
    "/start_profile", "/stop_profile", "/set_trace_level", "/freeze_gc", "/slow_down",
    "/start_expert_distribution_record", "/stop_expert_distribution_record",
    "/dump_expert_distribution_record", "/release_memory_occupation",
    "/resume_memory_occupation", "/weights_checker", "/configure_logging", "/flush_cache",
    "/open_session", "/close_session",
}  # fmt: skip
ALWAYS_OPEN = ("/health", "/ready", "/metrics")  # SGLang's: probes and Prometheus
KEYS = {"no key": {}, "wrong key": {"authorization": "Bearer wrong"}, "API key": AS_CLIENT,
        "admin key": AS_ADMIN}  # fmt: skip


def _routes(server) -> dict[str, tuple[set[str], str]]:
    """{path: (methods, auth level)}: the server's OpenAPI list plus SGLang's routes that
    it leaves out (read from SGLang's app); the routes serve adds are `normal`."""
    from sglang.srt.entrypoints.http_server import app

    documented = requests.get(f"{server.url}/openapi.json", headers=AS_CLIENT, timeout=60)
    assert documented.status_code == 200, documented.text[:300]
    routes = {path: ({m.upper() for m in ops}, "normal")
              for path, ops in documented.json()["paths"].items()}  # fmt: skip

    def walk(routers, prefix=""):
        for route in routers:
            inner = getattr(route, "original_router", None)  # an included router
            if inner is not None:
                context = getattr(route, "include_context", None)
                yield from walk(inner.routes, prefix + (getattr(context, "prefix", "") or ""))
            elif getattr(route, "path", None):
                yield prefix + route.path, route

    for path, route in walk(app.router.routes):
        level = getattr(getattr(route, "endpoint", None), "_auth_level", None)
        methods, _ = routes.get(path, (set(), "normal"))
        methods |= set(getattr(route, "methods", None) or ())
        routes[path] = (methods, getattr(level, "value", "normal"))
    return routes


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x", path)


def _expected(path: str, level: str, who: str) -> str:
    if path.startswith(ALWAYS_OPEN):
        return "open"
    if who.startswith(("no key", "wrong key")):
        return "refused"
    if who.startswith("API key"):
        return "refused" if level != "normal" else "open"
    return "open"  # the admin key opens every route


def _record(server, method: str, path: str, level: str, who: str, response) -> None:
    """Checks one answer (no key in it; refused or not as the level says) and counts it
    for the reliability table."""
    text = response.text + " ".join(f"{k}: {v}" for k, v in response.headers.items())
    assert API_KEY not in text and ADMIN_KEY not in text, f"{method} {path} ({who}): {text[:300]}"
    status = response.status_code
    expected = _expected(path, level, who)
    if expected == "refused":
        assert status == 401, f"{method} {path} {who}: {status} {response.text[:200]}"
    else:
        assert status not in (401, 403), f"{method} {path} {who}: {status} {response.text[:200]}"
    kind = "open (health, ready, metrics)" if path.startswith(ALWAYS_OPEN) else level
    server.auth[(method, kind, who)][status] += 1


def test_every_get_route_with_each_key_answers_no_key(server):
    """Every GET route, with no key, a wrong one, the API key and the admin key: refused
    or opened as its level says, and no answer (body or header) holds either key: not
    /server_info nor /get_server_info (SGLang 0.5.23 answers both keys there), nor
    /v1/models, /metrics, the OpenAPI pages."""
    routes = _routes(server)
    server.route_count = len(routes)
    for path, (methods, level) in sorted(routes.items()):
        if "GET" not in methods:
            continue
        for who, auth in KEYS.items():
            if who == "admin key" and path in ACTS:
                continue
            response = requests.get(f"{server.url}{_concrete(path)}", headers=auth, timeout=120)
            _record(server, "GET", path, level, who, response)
    info = requests.get(f"{server.url}/server_info", headers=AS_CLIENT, timeout=60).json()
    assert info["api_key"] == info["admin_api_key"] == "<redacted>"
    assert info["max_total_tokens"] == POOL  # token counts are not secrets
    assert "--api-key <redacted>" in info["launch_command"]


def test_every_other_route_refuses_a_missing_key_before_reading_the_body(server):
    """Every route with another method, without a key (and with a wrong one): 401 for an
    empty body, a body 3x --max-request-bytes and a zstd bomb (a few KB that would
    decode to 64 MB): SGLang's key check runs before any body is read. With the API key
    the admin routes are refused the same way; the others open (the work routes'
    answers: the fuzzing above and the admin-key test below)."""
    import zstandard

    big = b'{"text": "' + b"x" * (3 * MAX_REQUEST_BYTES) + b'"}'
    bomb = zstandard.ZstdCompressor().compress(b'{"text": "' + b"x" * 64 * 2**20 + b'"}')
    assert len(bomb) < 100_000
    zstd = {"content-encoding": "zstd"}
    for path, (methods, level) in sorted(_routes(server).items()):
        for method in sorted(methods - {"GET", "HEAD", "OPTIONS"}):
            url = f"{server.url}{_concrete(path)}"
            for who in ("no key", "wrong key"):
                for name, data, extra in (("{}", b"{}", {}), ("too large", big, {}),
                                          ("zstd bomb", bomb, zstd)):  # fmt: skip
                    headers = {"content-type": "application/json", **KEYS[who], **extra}
                    response = requests.request(method, url, data=data, headers=headers,
                                                timeout=120)  # fmt: skip
                    _record(server, method, path, level, f"{who}, {name}", response)
            if level != "normal":  # the API key on an admin route: refused, not run
                response = requests.request(method, url, data=b"{}", timeout=120,
                                            headers={"content-type": "application/json",
                                                     **AS_CLIENT})  # fmt: skip
                _record(server, method, path, level, "API key", response)


def test_the_admin_key_opens_the_work_routes(server):
    """SGLang accepts only the API key on its normal routes; ours take the admin key too
    (an administrator may do what a client may, and must, to send a processor)."""
    for path, answer in server.baseline.items():  # sent with the API key
        _record(server, "POST", path.split("#")[0], "normal", "API key", answer)
    for path, body in VALID.items():
        response = _post(server, path, json.dumps(body).encode(), auth=AS_ADMIN)
        assert response.status_code == 200, f"{path}: {response.text[:300]}"
        _record(server, "POST", path.split("#")[0], "normal", "admin key", response)


def test_a_custom_logit_processor_needs_the_admin_key_and_never_loads_in_the_server(
    server, tmp_path
):
    """A processor is code from the request (dill): the API key is refused (403); with the
    admin key one that cannot load is a 400, found out in a throwaway process (the one
    below records the pid that unpickled it: not the server's); one that loads runs."""
    import pickle

    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    mark = tmp_path / "unpickled-by"

    class Marks:
        def __reduce__(self):
            return (exec, (f"import os; open({str(mark)!r}, 'a').write(str(os.getpid()))",))

    def generate(processor: str, auth: dict) -> requests.Response:
        body = {"text": QUERY, "custom_logit_processor": processor,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0,
                                    "custom_params": {"token_ids": [287]}}}  # fmt: skip
        return _post(server, "/generate", json.dumps(body).encode(), auth=auth)

    good = DisallowedTokensLogitsProcessor.to_str()
    refused = generate(good, AS_CLIENT)
    assert refused.status_code == 403 and "admin" in refused.json()["message"]
    corrupt = generate(json.dumps({"callable": "not hex"}), AS_ADMIN)
    assert corrupt.status_code == 400 and "cannot be loaded" in corrupt.json()["message"]
    marking = generate(json.dumps({"callable": pickle.dumps(Marks()).hex()}), AS_ADMIN)
    assert marking.status_code == 400, marking.text
    loader_pid = int(mark.read_text())
    server_pids = {server.proc.pid} | {
        p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)
    }
    assert loader_pid not in server_pids  # a throwaway child, gone since
    ran = generate(good, AS_ADMIN)
    assert ran.status_code == 200, ran.text
    assert ran.json()["meta_info"]["completion_tokens"] == 1
    assert requests.get(f"{server.url}/health", timeout=30).status_code == 200


def test_the_server_log_holds_no_key(server):
    log = server.log_path.read_text(errors="replace")
    assert "server_args=" in log or "Uvicorn running" in log or "startup" in log.lower()
    assert API_KEY not in log and ADMIN_KEY not in log


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
    return value


def _assert_close(got, expected, where: str, tolerance: float = 2e-5) -> None:
    if isinstance(expected, dict) and isinstance(got, dict):
        assert got.keys() == expected.keys(), f"{where}: {sorted(got)} != {sorted(expected)}"
        for key in expected:
            _assert_close(got[key], expected[key], f"{where}.{key}", tolerance)
    elif isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        assert len(got) == len(expected), f"{where}: {len(got)} != {len(expected)} items"
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            _assert_close(a, b, f"{where}[{i}]", tolerance)
    elif isinstance(expected, float) and isinstance(got, int | float):
        assert abs(got - expected) <= tolerance, f"{where}: {got} != {expected}"
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"

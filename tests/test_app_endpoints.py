"""DSL functions over HTTP: `prefillonly serve --app tests/dsl_app_example.py` on the tiny
Llama (CPU, float32) exposes the classifier and the ranker declared there as typed
endpoints listed in /openapi.json; their answers equal the DSL's own compilation scored
via /v1/score on the same server; bad bodies get a 400 naming the field; the remote
backend calls the typed endpoints (no tokenizer needed) and falls back to /v1/score for
functions the server does not serve; a label that cannot be scored after the function's
prompt (it merges with a trailing space) stops the start-up.
One server for the module, plus one that fails to start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Literal

import dsl_app_example as app
import pytest
import requests
from conftest import max_abs_diff
from server_process import START_TIMEOUT_S, free_port, run_command, serve_command, serve_env

import prefillonly_sgl as prefillonly
from prefillonly_sgl.dsl import LabelError, RemoteBackend
from prefillonly_sgl.dsl.app_models import MARKER, app_models
from prefillonly_sgl.dsl.endpoint import sample_prompt, sample_value
from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.models.tiny import build_tokenizer

APP = Path(__file__).with_name("dsl_app_example.py")
TOLERANCE = 1e-6  # the same server computes both sides
PROFILE = "likes science fiction, history books and long walks"
FILMS = ["a documentary about the moon landing", "socks", "history of walks", "a space opera"]
REVIEWS = [
    {"review": "it worked well and I feel better"},
    {"review": "terrible side effects", "drug": "aspirin"},
    {"review": "no change at all"},
]


@pytest.fixture(scope="module")
def server(apps_server):
    return apps_server  # conftest: this app and ranking_app_example.py, one per session


@pytest.fixture(scope="module")
def via_score(server):
    """The DSL compiling here (tokenizer from /model_info) and posting /v1/score."""
    return RemoteBackend(server.url, typed_endpoints=False)


class RecordingBackend(RemoteBackend):
    """A RemoteBackend that remembers the paths it called."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.paths: list[str] = []

    def _request(self, method, path, body=None, headers=None):
        self.paths.append(path)
        return super()._request(method, path, body, headers)


def post(server, path, body):
    return requests.post(f"{server.url}{path}", json=body, timeout=60)


def rows(results) -> list[list[float]]:
    return [list(r.probs.values()) for r in results]


# -- the endpoints, called with a plain HTTP client ------------------------------------------


def test_openapi_lists_the_dsl_functions(server):
    doc = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    schemas = doc["components"]["schemas"]

    def models(path):
        operation = doc["paths"][path]["post"]
        request = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        response = operation["responses"]["200"]["content"]["application/json"]["schema"]
        return schemas[request.rsplit("/", 1)[1]], schemas[response["$ref"].rsplit("/", 1)[1]]

    request, response = models("/apps/sentiment")
    # cache_salt: every scoring body's prefix-cache namespace (wire.cache_salt_field)
    assert request["required"] == ["review"]
    assert set(request["properties"]) == {"review", "drug", "cache_salt"}
    assert request["properties"]["drug"]["default"] == "the medicine"
    assert request[MARKER] == {
        "kind": "classifier",
        "function": "sentiment",
        "labels": ["positive", "negative"],
    }
    assert response["properties"]["label"]["enum"] == ["positive", "negative"]
    assert set(response["properties"]) == {"label", "probs", "logprobs"}

    batch_request, batch_response = models("/apps/sentiment/batch")
    assert batch_request["required"] == ["inputs"]
    assert batch_response["properties"]["results"]["items"]["$ref"].endswith("/sentimentResult")

    request, response = models("/apps/recommend")
    assert request["required"] == ["profile", "items"]
    assert set(request["properties"]) == {"profile", "items", "top_k", "score", "cache_salt"}
    assert request[MARKER]["kind"] == "ranker" and request[MARKER]["labels"] == ["Yes", "No"]
    assert set(response["properties"]) == {"items", "by_input"}
    assert doc["paths"]["/apps/recommend"]["post"]["description"].startswith("Films the user")


def test_classifier_endpoint_equals_the_local_compilation(server, via_score):
    want = app.sentiment.batch(REVIEWS, engine=via_score, progress=False)
    one = post(server, "/apps/sentiment", REVIEWS[1])
    assert one.status_code == 200, one.text
    assert one.json()["label"] == want[1].label
    assert max_abs_diff([list(one.json()["probs"].values())], rows(want[1:2])) < TOLERANCE
    assert int(one.headers["x-prefillonly-prompt-tokens"]) > 0

    many = post(server, "/apps/sentiment/batch", {"inputs": REVIEWS})
    assert many.status_code == 200, many.text
    results = many.json()["results"]
    assert [r["label"] for r in results] == [r.label for r in want]
    assert max_abs_diff([list(r["probs"].values()) for r in results], rows(want)) < TOLERANCE


def test_ranker_endpoint_equals_the_local_compilation(server, via_score):
    want = app.recommend(PROFILE, items=FILMS, top_k=2, engine=via_score)
    got = post(server, "/apps/recommend", {"profile": PROFILE, "items": FILMS, "top_k": 2})
    assert got.status_code == 200, got.text
    body = got.json()
    assert [r["index"] for r in body["items"]] == [r.index for r in want.items]
    assert [r["item"] for r in body["by_input"]] == FILMS
    scores = [[r["score"]] for r in body["by_input"]]
    assert max_abs_diff(scores, [[r.score] for r in want.by_input]) < TOLERANCE
    # score= per request: sort by P(No) instead
    by_no = post(server, "/apps/recommend", {"profile": PROFILE, "items": FILMS, "score": "No"})
    order = sorted(range(len(FILMS)), key=lambda i: -want.by_input[i].probs["No"])
    assert [r["index"] for r in by_no.json()["items"]] == order


BAD_BODIES = [
    ("missing-field", "/apps/sentiment", {"drug": "x"}, "review: Field required"),
    ("wrong-type", "/apps/sentiment", {"review": 5}, "review: Input should be a valid string"),
    ("unknown-field", "/apps/sentiment", {"review": "x", "reveiw": "y"}, "reveiw: Extra inputs"),
    ("batch-empty", "/apps/sentiment/batch", {"inputs": []}, "inputs: List should have at least"),
    ("batch-item", "/apps/sentiment/batch", {"inputs": [{"drug": "x"}]}, "inputs.0.review"),
    ("items-missing", "/apps/recommend", {"profile": "x"}, "items: Field required"),
    ("items-empty", "/apps/recommend", {"profile": "x", "items": []}, "items: List should"),
    ("top-k", "/apps/recommend", {"profile": "x", "items": ["a"], "top_k": 0}, "top_k"),
    ("score-label", "/apps/recommend", {"profile": "x", "items": ["a"], "score": "Maybe"}, "score"),
]


@pytest.mark.parametrize(
    "path, body, message", [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
def test_bad_body_gets_a_400_naming_the_field(server, path, body, message):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]


# -- the remote backend ----------------------------------------------------------------------


def test_remote_backend_calls_the_typed_endpoints(server, via_score):
    # A tokenizer that cannot be loaded: the typed endpoints need none on the client.
    backend = RecordingBackend(server.url, tokenizer="/no/such/tokenizer")
    one = app.sentiment(**REVIEWS[1], engine=backend)
    many = app.sentiment.batch(REVIEWS, engine=backend, progress=False, batch_size=2)
    ranking = app.recommend(PROFILE, items=FILMS, top_k=3, engine=backend)
    assert backend.paths == [
        "/openapi.json",  # read once
        "/apps/sentiment",
        "/apps/sentiment/batch",
        "/apps/sentiment/batch",  # batch_size=2: 3 inputs in 2 requests
        "/apps/recommend",
    ]
    assert "tokenizer" not in backend.__dict__  # never loaded

    want = app.sentiment.batch(REVIEWS, engine=via_score, progress=False)
    assert type(one) is type(want[1]) and one.label == want[1].label
    assert max_abs_diff(rows([one]), rows(want[1:2])) < TOLERANCE
    assert max_abs_diff(rows(many), rows(want)) < TOLERANCE
    want_ranking = app.recommend(PROFILE, items=FILMS, top_k=3, engine=via_score)
    assert [r.index for r in ranking.items] == [r.index for r in want_ranking.items]
    assert max_abs_diff(rows(ranking.by_input), rows(want_ranking.by_input)) < TOLERANCE


def test_remote_backend_async_calls(server, via_score):
    backend = RecordingBackend(server.url, tokenizer="/no/such/tokenizer")

    async def main():
        one = await app.sentiment.acall("fine", engine=backend)
        many = await app.sentiment.abatch(REVIEWS, engine=backend, batch_size=1, progress=False)
        ranking = await app.recommend.acall(PROFILE, items=FILMS, engine=backend)
        return one, many, ranking

    one, many, ranking = asyncio.run(main())
    assert backend.paths.count("/apps/sentiment/batch") == 3 and "/v1/score" not in backend.paths
    want = app.sentiment.batch(REVIEWS, engine=via_score, progress=False)
    assert max_abs_diff(rows(many), rows(want)) < TOLERANCE
    assert one.label in ("positive", "negative") and len(ranking.by_input) == len(FILMS)


def test_a_calibrated_endpoint_measures_its_prior_once_per_server(server, via_score):
    def prompt_tokens(response) -> int:
        assert response.status_code == 200, response.text
        return int(response.headers["x-prefillonly-prompt-tokens"])

    first = post(server, "/apps/calibrated_sentiment", {"review": "no change at all"})
    second = post(server, "/apps/calibrated_sentiment", REVIEWS[0])
    uncalibrated = post(server, "/apps/sentiment", REVIEWS[0])
    # The first request measured the prior (its prompt and the content-free ones); the
    # second sends its own prompt only, the same prompt as the uncalibrated function's.
    assert prompt_tokens(second) == prompt_tokens(uncalibrated)
    assert prompt_tokens(first) > 2 * prompt_tokens(second)
    # Calibrated as the client calibrates over /v1/score (its own prior, same server).
    want = app.calibrated_sentiment(**REVIEWS[0], engine=via_score)
    assert max_abs_diff([list(second.json()["probs"].values())], rows([want])) < TOLERANCE
    assert max_abs_diff(rows([want]), rows([app.sentiment(**REVIEWS[0], engine=via_score)])) > 1e-4


def test_remote_backend_falls_back_to_v1_score(server, via_score):
    """Functions the server does not serve as declared here go through /v1/score."""

    @prefillonly.classifier  # same name and fields as the served one, other labels
    def sentiment(review: str, drug: str = "") -> Literal["good", "bad"]:
        return f"Review of {drug}: {review}\nSentiment:"

    @prefillonly.classifier(labels=["Yes", "No"])
    def spam(text: str) -> str:  # not on the server at all
        return f"Message: {text}\nSpam? Answer Yes or No:"

    backend = RecordingBackend(server.url, tokenizer=via_score.tokenizer)
    assert sentiment("ok", engine=backend).label in ("good", "bad")
    assert spam("win money", engine=backend).label in ("Yes", "No")
    # /readiness once: the backend checks whether it talks to a gateway (gateway_client.py);
    # /server_info once: whether the model has a classification head (head_route.py)
    assert backend.paths == [
        "/openapi.json",
        "/readiness",
        "/server_info",
        "/v1/score",
        "/v1/score",
    ]
    assert not via_score.serves(app.sentiment)  # typed_endpoints=False


# -- start-up ------------------------------------------------------------------------------


def test_a_label_that_cannot_be_scored_stops_the_start_up(tiny_llama_path, tmp_path):
    bad_app = tmp_path / "bad_app.py"
    bad_app.write_text(
        "import prefillonly_sgl as prefillonly\n\n\n"
        '@prefillonly.classifier(labels=["Yes", "Maybe"])\n'
        "def unsure(question: str) -> str:\n"
        '    return f"Question: {question}\\nAnswer: "\n'  # a trailing space
    )
    args = [
        "--model-path", str(tiny_llama_path), "--device", "cpu", "--dtype", "float32",
        "--max-total-tokens", "4096", "--skip-server-warmup", "--host", "127.0.0.1",
        "--port", str(free_port()), "--app", str(bad_app),
    ]  # fmt: skip
    out = run_command(serve_command(*args), timeout=START_TIMEOUT_S)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    assert "/apps/unsure (unsure) cannot be served by this model: label 'Yes'" in log, log[-3000:]
    # refused before SGLang starts: no scheduler loaded the weights (a start logs "Load
    # weight begin"), and the message is the last word, not a traceback's
    assert "Load weight" not in log and "Traceback" not in log, log[-3000:]


# -- no server: models, sample arguments, declaration errors --------------------------------


def test_endpoint_specs_and_prompt_counts():
    classify, batch = app.sentiment.__prefillonly_endpoint__()
    assert (classify.path, batch.path) == ("/apps/sentiment", "/apps/sentiment/batch")
    assert classify.check_tokenizer is not None and classify.count_prompts is None
    assert batch.count_prompts({"inputs": [{}, {}, {}]}) == 3
    rank = app.recommend.__prefillonly_endpoint__()
    assert rank.path == "/apps/recommend" and rank.count_prompts({"items": ["a", "b"]}) == 2

    @prefillonly.ranker(labels=["Yes", "No"], path="/rank/films")
    def films(item: str) -> str:
        return f"{item}?"

    assert films.__prefillonly_endpoint__().path == "/rank/films"
    with pytest.raises(DeclarationError, match="path="):
        prefillonly.classifier(labels=["A", "B"], path="no-slash")(films.fn)


class Opaque:  # no JSON schema
    pass


def test_sample_values_and_unservable_types():
    assert sample_value(str) == sample_value(object) == "example"
    assert sample_value(int | None) == 0
    assert sample_value(Literal["x", "y"]) == "x" and sample_value(list[int]) == []

    @prefillonly.classifier(labels=["A", "B"])
    def opaque(x: Opaque) -> str:
        return "x"

    with pytest.raises(DeclarationError, match="cannot be served over HTTP"):
        opaque.__prefillonly_endpoint__()
    assert set(app_models(app.sentiment).request.model_fields) == {"review", "drug", "cache_salt"}
    assert set(app_models(app.sentiment).batch_input.model_fields) == {"review", "drug"}


def test_start_up_label_check_on_a_sample_prompt():
    tokenizer = build_tokenizer()
    prompt = sample_prompt(app.sentiment, tokenizer)
    assert prompt.item == "Review of the medicine: example\nSentiment:"
    app.sentiment.__prefillonly_endpoint__()[0].check_tokenizer(tokenizer)  # one token each

    @prefillonly.ranker(labels=["Yes", "Maybe"])
    def unsure(profile, item):  # unannotated: sample strings
        return f"{profile} {item}? "  # a trailing space: "Yes" would merge with it

    with pytest.raises(LabelError, match=r"/apps/unsure \(.*unsure\) cannot be served.*'Yes'"):
        unsure.__prefillonly_endpoint__().check_tokenizer(tokenizer)

    @prefillonly.classifier(labels=["Yes", "Maybe"])
    def picky(x: str) -> str:
        raise ValueError("refuses sample arguments")

    assert sample_prompt(picky, tokenizer) is None  # no check: a 400 per request
    picky.__prefillonly_endpoint__()[0].check_tokenizer(tokenizer)


def test_the_dsl_endpoints_import_without_sglang():
    code = (
        "import sys; import prefillonly_sgl.dsl.endpoint, prefillonly_sgl.dsl.app_client; "
        "assert not [m for m in sys.modules if m.startswith('sglang')]"
    )
    subprocess.run([sys.executable, "-c", code], env=serve_env(), check=True)

"""The scoring DSL against a stock SGLang server (``python -m sglang.launch_server``, its
workers forked: stock_sglang_forked.py; the tiny Llama, CPU, float32) over /v1/score:
results equal a plain transformers forward of the compiled prompts, the tokenizer comes
from the server's /model_info, async works from any event loop, and server-side rejections
surface as InvalidRequestError."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from conftest import max_abs_diff
from server_process import running_server, stock_sglang_command

import prefillonly_sgl as prefillonly
from prefillonly_sgl import InvalidRequestError, LabelError, Prompt
from prefillonly_sgl.dsl import RemoteBackend, RemoteBackendError, ScoreRequest
from prefillonly_sgl.machine.ports import free_port
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4  # server (float32) vs transformers (float32); observed ~1e-7

PROFILE = "User profile: likes science fiction, history books and long walks.\n"
FILMS = ["a documentary about the moon landing", "socks", "history of walks", "a space opera"]


@prefillonly.classifier(labels=["Yes", "No"])
def relevant(profile: str, item: str) -> Prompt:
    return Prompt(prefix=profile, item=f"Item: {item}\nRelevant? Answer Yes or No:")


@prefillonly.ranker(labels=["Yes", "No"])
def recommend(profile: str, item: str) -> Prompt:
    return Prompt(prefix=profile, item=f"Item: {item}\nRelevant? Answer Yes or No:")


@pytest.fixture(scope="module")
def server(tiny_llama_path, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    # python -m sglang.launch_server (its workers forked), torch_native attention
    with running_server(
        tiny_llama_path, log_path, "--enable-metrics", command=stock_sglang_command
    ) as server:
        yield server.url


@pytest.fixture(scope="module")
def reference(tiny_llama_path):
    return TransformersReference(tiny_llama_path)


def reference_rows(reference, compiled) -> list[list[float]]:
    """Per-input rows of a plain transformers forward over every compiled request."""
    answers = [
        reference.score(r.query, list(r.items), list(r.label_token_ids)) for r in compiled.requests
    ]
    return compiled.gather(answers)


def test_tokenizer_comes_from_the_server(server, tiny_llama_path):
    backend = RemoteBackend(server)
    assert backend.tokenizer.encode(" Yes", add_special_tokens=False) == (
        TransformersReference(tiny_llama_path).tokenizer.encode(" Yes", add_special_tokens=False)
    )


def test_classifier_batch_on_the_server_equals_a_transformers_forward(server, reference):
    inputs = [(PROFILE, film) for film in FILMS]
    results = relevant.batch(inputs, engine=server, progress=False)
    compiled = relevant.compile_batch(reference.tokenizer, inputs)
    assert [(r.query, len(r.items)) for r in compiled.requests] == [(PROFILE, 4)]
    got = [[r.probs["Yes"], r.probs["No"]] for r in results]
    assert max_abs_diff(got, reference_rows(reference, compiled)) < TOLERANCE
    one = relevant(PROFILE, FILMS[1], engine=server)
    assert max_abs_diff([[one.probs["Yes"], one.probs["No"]]], [got[1]]) < TOLERANCE


def test_ranker_on_the_server_and_default_backend(server, reference):
    with prefillonly.use(server):
        ranking = recommend(PROFILE, items=FILMS, top_k=2)
    want = reference_rows(reference, recommend.compile(reference.tokenizer, PROFILE, items=FILMS))
    got = [[r.probs["Yes"], r.probs["No"]] for r in ranking.by_input]
    assert max_abs_diff(got, want) < TOLERANCE
    assert [r.index for r in ranking.items] == sorted(range(4), key=lambda i: -want[i][0])[:2]


def cached_tokens(url: str) -> float:
    """SGLang's counter of prompt tokens served from its prefix cache (/metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return sum(
        float(line.split()[-1]) for line in lines if line.startswith("sglang:cached_tokens_total{")
    )


def test_async_variants_from_any_loop(server):
    async def main():
        one = await relevant.acall(PROFILE, FILMS[0], engine=server)
        many = await relevant.abatch(
            [(PROFILE, f) for f in FILMS], engine=server, batch_size=1, progress=False
        )
        ranking = await recommend.acall(PROFILE, items=FILMS, engine=server)
        return one, many, ranking

    one, many, ranking = asyncio.run(main())
    assert max_abs_diff([list(one.probs.values())], [list(many[0].probs.values())]) < TOLERANCE
    assert [r.index for r in ranking.by_input] == [0, 1, 2, 3]


def test_errors(server):
    @prefillonly.classifier(labels=["Yes", "Maybe"])
    def unsure(x: str) -> str:
        return f"{x}\nAnswer: "  # the trailing space merges with the label

    with pytest.raises(LabelError, match="'Yes' merges with the prompt's last characters"):
        unsure("x", engine=server)
    backend = RemoteBackend(server)
    with pytest.raises(InvalidRequestError, match="/v1/score"):  # the server rejects it
        asyncio.run(backend.score(ScoreRequest("x", ("y",), label_token_ids=(10**7,))))
    gone = RemoteBackend(f"http://127.0.0.1:{free_port()}", tokenizer=backend.tokenizer)
    with pytest.raises(RemoteBackendError, match="cannot reach"):
        asyncio.run(gone.score(ScoreRequest("x", ("y",), label_token_ids=(1,))))
    assert relevant(PROFILE, "tea", engine=server).label in ("Yes", "No")  # server still up


@prefillonly.classifier(labels=["Yes", "history books"])
def relevant_in_words(profile: str, item: str) -> Prompt:
    return Prompt(prefix=profile, item=f"Item: {item}\nRelevant? Answer Yes or history books:")


def test_labels_of_several_tokens_need_prefillonly_serve(server):
    """SGLang's /v1/score carries one token per label; a stock server has no
    /v1/score_labels: a clear error, not a wrong answer."""
    with pytest.raises(RemoteBackendError, match="need a `prefillonly serve` server"):
        relevant_in_words(PROFILE, FILMS[0], engine=server)


def test_a_setwise_ranker_reaches_stock_sglang_which_wants_its_cache_off(server, reference):
    """RemoteBackend sends a setwise ranker's score_extraction_token on /v1/score: stock
    SGLang with its radix cache on refuses it with its own message, as InvalidRequestError
    (`prefillonly serve` answers it: test_server_endpoints.py)."""
    anchor = reference.tokenizer.eos_token

    @prefillonly.ranker(labels=["Yes", "No"], setwise=anchor)
    def shortlist(profile: str, item: str) -> Prompt:
        return Prompt(prefix=profile, item=f"- {item}, fits?")

    with pytest.raises(InvalidRequestError, match="disable-radix-cache"):
        shortlist(PROFILE, items=FILMS, engine=server)

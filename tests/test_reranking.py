"""Reranking on a general model (the embedded default model, SmolLM2-135M-Instruct, not
a trained reranker): the default /v1/rerank (query likelihood, chosen by the model's
name) puts the relevant document first on a dozen easy cases (the yes/no judge prompt
put it first in none of them: docs/reranking.md); its scores equal a transformers
forward (1e-4, float32); the real clients: `cohere`'s v1 Client and v2 ClientV2, and
LlamaIndex's TEI reranker; TEI's fields and Cohere's per-document truncation."""

from __future__ import annotations

import math

import cohere
import pytest
import requests

from prefillonly_sgl.apis.rerankers import query_likelihood

pytestmark = pytest.mark.slow  # the 135M default model's server

TOLERANCE = 1e-4  # float32 both sides

# (query, the relevant document, three unrelated ones)
CASES = [
    (
        "What is the capital of France?",
        "Paris is the capital and largest city of France.",
        [
            "The stock market fell sharply on Tuesday.",
            "Bananas are rich in potassium.",
            "The violin has four strings.",
        ],
    ),
    (
        "How many legs does a spider have?",
        "Spiders are arachnids and have eight legs.",
        [
            "The Eiffel Tower was completed in 1889.",
            "Python is a popular programming language.",
            "Rice is a staple food in Asia.",
        ],
    ),
    (
        "Who wrote Romeo and Juliet?",
        "Romeo and Juliet is a tragedy written by William Shakespeare.",
        [
            "Mount Everest is the highest mountain on Earth.",
            "Coffee beans are roasted before brewing.",
            "The bus leaves at noon.",
        ],
    ),
    (
        "What is the boiling point of water?",
        "At sea level, water boils at 100 degrees Celsius.",
        [
            "The cat slept on the warm windowsill.",
            "Jupiter is the largest planet in the solar system.",
            "She bought a new pair of shoes.",
        ],
    ),
    (
        "How do plants make their food?",
        "Plants make their food through photosynthesis, using sunlight, water and carbon dioxide.",
        [
            "The train to Berlin was delayed.",
            "Chess is played on a board of 64 squares.",
            "He painted the fence white.",
        ],
    ),
    (
        "What is the largest ocean on Earth?",
        "The Pacific Ocean is the largest and deepest ocean on Earth.",
        [
            "Honey never spoils if stored properly.",
            "The guitar solo lasted three minutes.",
            "Tax forms are due in April.",
        ],
    ),
    (
        "When did humans first land on the Moon?",
        "Apollo 11 landed the first humans on the Moon in July 1969.",
        [
            "Tomatoes are technically a fruit.",
            "The library closes at eight.",
            "Penguins live mostly in the Southern Hemisphere.",
        ],
    ),
    (
        "What do bees produce?",
        "Honey bees collect nectar from flowers and produce honey and beeswax.",
        [
            "The bridge was painted red.",
            "Interest rates rose last quarter.",
            "The marathon is 42 kilometres long.",
        ],
    ),
    (
        "How fast does light travel?",
        "Light travels through a vacuum at about 300,000 kilometres per second.",
        [
            "My grandmother knits scarves.",
            "The soup needs more salt.",
            "Football is popular in Brazil.",
        ],
    ),
    (
        "What is the main ingredient of guacamole?",
        "Guacamole is a dip made mainly from mashed avocados.",
        [
            "The museum opens on Sundays.",
            "Saturn has prominent rings.",
            "The printer is out of paper.",
        ],
    ),
    (
        "Which organ pumps blood through the body?",
        "The heart is a muscular organ that pumps blood through the body.",
        [
            "The parking lot is full.",
            "Snow fell in the mountains overnight.",
            "The novel has twelve chapters.",
        ],
    ),
    (
        "What language is spoken in Brazil?",
        "Portuguese is the official and most widely spoken language of Brazil.",
        [
            "The dog chased the ball.",
            "Copper conducts electricity well.",
            "The meeting was moved to Friday.",
        ],
    ),
]


def documents(case: int) -> tuple[list[str], int]:
    """The case's documents with the relevant one at position case % 4."""
    _, relevant, others = CASES[case]
    at = case % 4
    return others[:at] + [relevant] + others[at:], at


@pytest.fixture(scope="module")
def server(default_server):
    return default_server  # the session's default-model server (conftest.py)


@pytest.fixture(scope="module")
def reference(default_reference):
    return default_reference


def test_the_default_rerank_puts_the_relevant_document_first(server):
    missed = []
    for case, (query, _, _) in enumerate(CASES):
        docs, relevant = documents(case)
        body = {"query": query, "documents": docs}
        answer = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()
        assert answer["meta"]["ranker"] == "query_likelihood", answer
        assert answer["meta"]["method"] == "likelihood"
        if answer["results"][0]["index"] != relevant:
            missed.append((query, answer["results"]))
    assert not missed


def test_query_likelihood_scores_equal_transformers(server, reference):
    query, _, _ = CASES[0]
    docs, _ = documents(0)
    body = {"query": query, "documents": docs}
    tei = requests.post(
        f"{server.url}/rerank", json={"query": query, "texts": docs, "raw_scores": True}
    ).json()
    compiled = query_likelihood.compile(reference.tokenizer, query, items=docs)
    (request,) = compiled.requests
    want = reference.continuation_logprobs(request.query, list(request.items),
                                           list(request.continuations))  # fmt: skip
    means = [sum(row) / len(row) for row in want]
    got = {r["index"]: r["score"] for r in tei}
    assert max(abs(got[i] - m) for i, m in enumerate(means)) < TOLERANCE
    cohere_answer = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()
    for result in cohere_answer["results"]:  # relevance: the query's per-token probability
        assert math.isclose(result["relevance_score"], math.exp(means[result["index"]]),
                            abs_tol=TOLERANCE)  # fmt: skip


def test_the_cohere_clients_v1_and_v2(server):
    query, relevant, _ = CASES[2]
    docs, at = documents(2)
    v1 = cohere.Client(base_url=server.url, api_key="unused")
    answer = v1.rerank(model="default", query=query, documents=docs, top_n=2, return_documents=True)
    assert [r.index for r in answer.results][0] == at and len(answer.results) == 2
    assert answer.results[0].document.text == relevant
    assert answer.meta.api_version.version == "1" and answer.meta.tokens.input_tokens > 0
    v2 = cohere.ClientV2(base_url=server.url, api_key="unused")
    answer2 = v2.rerank(model="default", query=query, documents=docs)  # POST /v2/rerank
    assert [r.index for r in answer2.results] == [r.index for r in v1.rerank(
        model="default", query=query, documents=docs).results]  # fmt: skip
    assert answer2.results[0].index == at and answer2.meta.api_version.version == "2"
    scores = [r.relevance_score for r in answer2.results]
    assert scores == sorted(scores, reverse=True) and all(0 < s <= 1 for s in scores)


def test_max_tokens_per_doc_cuts_each_document_to_its_first_tokens(server, reference):
    query, relevant, others = CASES[3]
    long_doc = relevant + " " + "More facts about water follow here. " * 20
    tok = reference.tokenizer
    cut = tok.decode(tok.encode(long_doc, add_special_tokens=False)[:12])
    v2 = cohere.ClientV2(base_url=server.url, api_key="unused")
    answer = v2.rerank(
        model="m", query=query, documents=[long_doc, others[0]], max_tokens_per_doc=12
    )
    direct = v2.rerank(model="m", query=query, documents=[cut, others[0]])
    by_index = lambda a: {r.index: r.relevance_score for r in a.results}  # noqa: E731
    assert by_index(answer) == pytest.approx(by_index(direct), abs=1e-6)
    whole = v2.rerank(model="m", query=query, documents=[long_doc, others[0]])
    assert by_index(whole)[0] != pytest.approx(by_index(answer)[0], abs=1e-6)


def test_the_tei_schema_and_llamaindex_tei_reranker(server):
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    query, relevant, _ = CASES[1]
    docs, at = documents(1)
    reranker = TextEmbeddingInference(base_url=server.url, top_n=2)  # POST /rerank
    nodes = [NodeWithScore(node=TextNode(text=d), score=0.0) for d in docs]
    best = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(query))
    assert [n.node.text for n in best][0] == relevant and len(best) == 2
    tei = requests.post(f"{server.url}/rerank", json={"query": query, "texts": docs,
                                                       "return_text": True}).json()  # fmt: skip
    assert [r["index"] for r in tei][0] == at and len(tei) == 4
    assert all(r["text"] == docs[r["index"]] and 0 < r["score"] <= 1 for r in tei)
    long_text = "Spiders spin webs. " * 3000
    body = {"query": query, "texts": [long_text]}
    refused = requests.post(f"{server.url}/rerank", json=body)
    assert refused.status_code == 400 and "texts[0]" in refused.text


def test_tei_truncate_cuts_a_text_longer_than_the_context(peer_conventions_server):
    """TEI's truncate over HTTP, on the session's tiny server: a cut text is a context-long
    prefill (4,096 tokens there; ~25 s at the default model's 8,192). One direction here;
    both directions' cuts: test_continuation_units.py."""
    url = peer_conventions_server.url
    body = {"query": CASES[1][0], "texts": ["Spiders spin webs. " * 3000]}
    assert requests.post(f"{url}/rerank", json=body).status_code == 400
    cut = requests.post(f"{url}/rerank", json={**body, "truncate": True,
                        "truncation_direction": "Left"})  # fmt: skip
    assert cut.status_code == 200 and len(cut.json()) == 1

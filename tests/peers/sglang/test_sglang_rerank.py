"""SGLang's own /v1/rerank tests, ported: sgl-project/sglang
test/srt/openai_server/basic/test_openai_server.py (class TestOpenAIV1Rerank;
Apache-2.0), with their assertions kept, against `prefillonly serve --rerank-answer sglang`.

Adaptations:
- the server: SGLang launches a cross-encoder (DEFAULT_SMALL_CROSS_ENCODER_MODEL_NAME_FOR_TEST,
  `--is-embedding`) with an API key; prefillonly serves /v1/rerank with a generative model,
  here the suite's tiny Llama (its built-in reranker: query likelihood) started with
  `--rerank-answer sglang` (the session's `peer_conventions_server`): on /v1/rerank the
  same body is Cohere's (its object) or SGLang's (its list), so the answer is the server's
  documented switch (docs/server.md, "Peer conventions on one path"). The key SGLang's
  client sends is ignored by a keyless server;
- the queries and documents are SGLang's own (sglang.test.runners.TEST_RERANK_QUERY_DOCS).
"""

from __future__ import annotations

import pytest
import requests
from sglang.test.runners import TEST_RERANK_QUERY_DOCS


@pytest.fixture(scope="module")
def server(peer_conventions_server):
    return peer_conventions_server


def run_rerank(server, query, docs):
    """TestOpenAIV1Rerank.run_rerank."""
    response = requests.post(
        f"{server.url}/v1/rerank",
        headers={"Authorization": "Bearer sk-123456", "Content-Type": "application/json"},
        json={"query": query, "documents": docs},
        timeout=120,
    )
    return response.json()


@pytest.mark.parametrize("case", [0, 1], ids=["single", "batch"])
def test_rerank(server, case):
    """TestOpenAIV1Rerank.test_rerank_single and test_rerank_batch: one {score, document,
    index} per document, in SGLang's list."""
    query_docs = TEST_RERANK_QUERY_DOCS[case]
    response = run_rerank(server, query_docs["query"], query_docs["documents"])
    assert len(response) == len(query_docs["documents"])
    for row in response:
        assert isinstance(row["score"], float)
        assert isinstance(row["document"], str)
        assert isinstance(row["index"], int)


def test_cohere_fields_still_get_their_answer_shape_rules(server):
    """Not in SGLang's file: with the switch on, a request asking no documents gets none
    (the rule of docs/server.md), and `top_n` still cuts the list."""
    docs = TEST_RERANK_QUERY_DOCS[1]["documents"]
    response = requests.post(
        f"{server.url}/v1/rerank",
        json={"query": "q", "documents": docs, "top_n": 1, "return_documents": False},
        timeout=120,
    ).json()
    assert len(response) == 1 and response[0].get("document") is None

"""The HTTP APIs every `prefillonly serve` has, beside SGLang's own and the `--app`
endpoints: typed endpoints declared with the same EndpointSpec extension point
(server/endpoints.py) and served through the DSL (plain Python; SGLang stays in
sglang_runtime/http_server/, which gets these specs from its caller, cli.py).

- score_labels.py: POST /v1/score_labels, label words (or token ids of labels of several
  tokens) instead of /v1/score's one token id per label.
- ranking.py: which DSL functions back the rerank APIs and POST /v1/classify (SGLang's
  / vLLM's schema): `--rerank NAME` / `--classify NAME` of `--app`, or the built-ins.
- decisions.py: POST /v1/decisions (OpenAI's shape, SGLang's body too) and /v1/systemone
  (System One's): typed questions about a state, answered behind it computed once.
- moderations.py: POST /v1/moderations (OpenAI's shape): each input checked by the served
  guard model (or the caller's policies), every category's probability (moderation/).
- rerank.py: POST /v1/rerank (Cohere v1 / Jina, or SGLang's native answer for the
  gateway), /v2/rerank (Cohere v2) and /rerank (TEI), one scorer; truncation.py: how
  documents are cut; rerankers.py: the built-in rankers (the yes/no judge, query
  likelihood) and which one a model gets; rerank_images.py: a call's images on a
  vision-language model.
- classify.py: POST /v1/classify itself; classify_images.py: a chat's images there.

Their request and response models are the wire contracts in prefillonly_sgl/wire/, which
the DSL's clients (dsl/backends/remote.py, dsl/gateway_client.py) import too.
"""

from __future__ import annotations

from prefillonly_sgl.apis.decisions import decision_endpoints
from prefillonly_sgl.apis.moderations import moderation_endpoint
from prefillonly_sgl.apis.ranking import ranking_api_endpoints
from prefillonly_sgl.apis.score_labels import score_labels_endpoint
from prefillonly_sgl.server.endpoints import EndpointSpec


def builtin_endpoints(
    apps: list[str],
    rerank: str | None,
    classify: str | None,
    rerank_method: str = "auto",
    model: str | None = None,
    rerank_answer: str = "cohere",
    systemone_conventions: str = "systemone",
    guard: str | None = None,
) -> list[EndpointSpec]:
    """Every built-in endpoint of `serve`: /v1/score_labels, the decision routes,
    /v1/moderations, then the
    rerank APIs and /v1/classify backed by the DSL functions named ``rerank`` /
    ``classify`` in the ``apps`` modules (None: the built-in reranker of ``rerank_method``
    for ``model``; a 400 for /v1/classify). ``rerank_answer``: what /v1/rerank answers a
    body without SGLang's `rid` (`serve --rerank-answer`); ``systemone_conventions``:
    System One's or vLLM's answer on /v1/systemone; ``guard``: /v1/moderations' guard
    family (`serve --guard`; None: the chat template's)."""
    return [
        score_labels_endpoint(),
        *decision_endpoints(apps, systemone_conventions),
        moderation_endpoint(guard),
        *ranking_api_endpoints(apps, rerank, classify, rerank_method, model, rerank_answer),
    ]

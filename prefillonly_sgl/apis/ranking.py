"""The standard ranking APIs every client already speaks, for generative scorers, and
which DSL functions back them:

POST /v1/rerank, /v2/rerank, /rerank   Cohere v1, Cohere v2 and TEI (apis/rerank.py),
                   backed by a DSL ranker: `serve --app FILE --rerank NAME`, or a built-in
                   chosen by `--rerank-method` (apis/rerankers.py: the yes/no judge for
                   generative rerankers, query likelihood for any other model).
POST /v1/score     vLLM's shapes only (apis/vllm_score.py; SGLang's own stays SGLang's),
                   each pair scored by the same ranker as the rerank APIs; with
                   `label_token_ids`, vLLM's generative scoring (apis/
                   vllm_generative_scoring.py, which serves /generative_scoring too).
POST /v1/classify  SGLang's / vLLM's schema (apis/classify.py): input (texts or token
                   ids) or messages -> data [{index, label, probs, num_classes}], usage.
                   Backed by a DSL classifier with one input parameter (`serve --app FILE
                   --classify NAME`).

They replace SGLang's own routes of those paths, which serve cross-encoder and
sequence-classification models only. Bad input gets a 400 naming the problem. The
request and response models are the wire contracts (prefillonly_sgl/wire/: cohere.py,
tei.py, sglang.py, prefillonly.py), shared with the DSL's gateway client.
"""

from __future__ import annotations

from prefillonly_sgl.apis.classify import classify_endpoint, no_classifier_endpoint
from prefillonly_sgl.apis.rerank import rerank_endpoints
from prefillonly_sgl.apis.rerankers import BUILTIN_RERANKERS, rerank_method
from prefillonly_sgl.apis.vllm_generative_scoring import vllm_generative_scoring_endpoints
from prefillonly_sgl.apis.vllm_score import vllm_score_endpoint
from prefillonly_sgl.server.endpoints import EndpointSpec, load_app_module

__all__ = ["classify_endpoint", "no_classifier_endpoint", "ranking_api_endpoints"]


def ranking_api_endpoints(
    apps,
    rerank: str | None,
    classify: str | None,
    method: str = "auto",
    model: str | None = None,
    rerank_answer: str = "cohere",
) -> list[EndpointSpec]:
    """The rerank APIs and /v1/classify for `serve`: the named DSL functions of the --app
    modules, or the defaults (the built-in reranker of ``method`` for ``model``; a 400 for
    /v1/classify)."""
    if rerank and method != "auto":
        raise ValueError(
            f"--rerank {rerank} and --rerank-method {method}: a named ranker has its own "
            "method; give one of them"
        )

    def find(name: str, kind: str):
        if not apps:
            raise ValueError(f"--{'rerank' if kind == 'ranker' else 'classify'} {name}: "
                             "needs --app FILE declaring it")  # fmt: skip
        for target in apps:
            obj = getattr(load_app_module(target), name, None)
            if obj is not None:
                if getattr(obj, "kind", None) != kind:
                    raise ValueError(f"{name} in {target} is not a @prefillonly.{kind}")
                return obj
        raise ValueError(f"no {kind} named {name!r} in --app {', '.join(apps)}")

    ranker = find(rerank, "ranker") if rerank else BUILTIN_RERANKERS[rerank_method(method, model)]
    return [
        *rerank_endpoints(ranker, sglang_answer=rerank_answer == "sglang"),
        vllm_score_endpoint(ranker),
        *vllm_generative_scoring_endpoints(),
        classify_endpoint(find(classify, "classifier")) if classify else no_classifier_endpoint(),
    ]

"""The standard ranking APIs every client already speaks, for generative scorers, and
which DSL functions back them:

POST /v1/rerank, /v2/rerank, /rerank   Cohere v1, Cohere v2 and TEI (apis/rerank.py),
                   backed by a DSL ranker: `serve --app FILE --rerank NAME`, or a built-in
                   chosen by `--rerank-method` (apis/rerankers.py: the yes/no judge for
                   generative rerankers, query likelihood for any other model).
POST /v1/classify  SGLang's / vLLM's schema: input (a text or a list) -> data [{index,
                   label, probs, num_classes}], usage. Backed by a DSL classifier with one
                   input parameter (`serve --app FILE --classify NAME`).

They replace SGLang's own routes of those paths, which serve cross-encoder and
sequence-classification models only. Bad input gets a 400 naming the problem. The
request and response models are the wire contract (prefillonly_sgl/wire.py,
rerank_wire.py), shared with the DSL's gateway client.
"""

from __future__ import annotations

import time
import uuid

from prefillonly_sgl.apis.rerank import call_usage, model_name, rerank_endpoints
from prefillonly_sgl.apis.rerankers import BUILTIN_RERANKERS, rerank_method
from prefillonly_sgl.dsl.backends.server import server_backend
from prefillonly_sgl.dsl.job import ClassifyJob
from prefillonly_sgl.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec, load_app_module
from prefillonly_sgl.wire import (
    ClassifyData,
    ClassifyRequest,
    ClassifyResponse,
    classify_parameter,
)


def classify_endpoint(function) -> EndpointSpec:
    """POST /v1/classify backed by ``function``, a DSL classifier with one required
    parameter (the input)."""
    try:
        param = classify_parameter(function)
    except ValueError as e:
        raise ValueError(f"--classify {function.fn.__name__}: {e}") from None
    labels = [str(t) for t in function.labels.texts]

    async def classify(request: ClassifyRequest, context) -> ClassifyResponse:
        texts = [request.input] if isinstance(request.input, str) else list(request.input)
        if not texts:
            raise InvalidRequestError("input is empty: give a text or a non-empty list")
        inputs = []
        for i, text in enumerate(texts):
            try:
                inputs.append(function.inputs.validate((), {param: text}))
            except InvalidRequestError as e:
                raise InvalidRequestError(f"input[{i}]: {e}") from None
        rows = await server_backend(context).run(ClassifyJob(function, tuple(inputs)))
        results = function.results(rows)
        return ClassifyResponse(
            id=f"classify-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=model_name(context, request.model),
            data=[
                ClassifyData(
                    index=i,
                    label=r.label_text,
                    probs=[r.probs[label] for label in labels],
                    num_classes=len(labels),
                )
                for i, r in enumerate(results)
            ],
            usage=call_usage(context),
            function=function.fn.__name__,
            labels=labels,
        )

    return EndpointSpec(
        "/v1/classify",
        ClassifyRequest,
        ClassifyResponse,
        classify,
        summary=f"Classify texts ({function.fn.__name__}: {', '.join(labels)})",
        tags=("prefillonly",),
        count_prompts=lambda body: len(body["input"]) if isinstance(body.get("input"), list) else 1,
    )


def no_classifier_endpoint() -> EndpointSpec:
    """/v1/classify on a server started without --classify: a 400 saying how to set one."""

    async def classify(request: ClassifyRequest, context) -> ClassifyResponse:
        raise InvalidRequestError(
            "this server has no classifier for /v1/classify: start it with --app FILE "
            "--classify NAME (a @prefillonly.classifier with one input parameter)"
        )

    return EndpointSpec("/v1/classify", ClassifyRequest, ClassifyResponse, classify,
                        summary="Classify texts (no classifier configured)",
                        tags=("prefillonly",))  # fmt: skip


def ranking_api_endpoints(
    apps,
    rerank: str | None,
    classify: str | None,
    method: str = "auto",
    model: str | None = None,
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
        *rerank_endpoints(ranker),
        classify_endpoint(find(classify, "classifier")) if classify else no_classifier_endpoint(),
    ]

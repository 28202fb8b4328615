"""The standard ranking APIs every client already speaks, for generative scorers:

POST /v1/rerank    Cohere / Jina schema (what TEI, vLLM, SGLang and the LangChain /
                   LlamaIndex rerank clients send): query, documents, top_n,
                   return_documents -> results [{index, relevance_score, document?}], usage.
                   A request carrying SGLang's own field `rid` (SGLang's gateway `smg`
                   always sends it, and reads the answer as SGLang's) gets SGLang's native
                   answer instead: a list of {score, document, index, meta_info}, best
                   first; meta_info names the ranker, its labels, the document's label
                   probabilities and the call's token usage.
                   Backed by a DSL ranker called with query= and the documents as items
                   (one score request: the query's prefix computed once); by default the
                   built-in Qwen3-Reranker prompt (qwen3_reranker below), or `serve --app
                   FILE --rerank NAME`.
POST /v1/classify  SGLang's / vLLM's schema: input (a text or a list) -> data [{index,
                   label, probs, num_classes}], usage. Backed by a DSL classifier with one
                   input parameter (`serve --app FILE --classify NAME`).

They replace SGLang's own routes of those paths, which serve cross-encoder and
sequence-classification models only. Bad input gets a 400 naming the problem. The
request and response models are the wire contract (prefillonly_sgl/wire.py), shared with
the DSL's gateway client.
"""

from __future__ import annotations

import time
import uuid

from prefillonly_sgl.dsl import Prompt, ranker
from prefillonly_sgl.dsl.endpoint import server_backend
from prefillonly_sgl.dsl.job import ClassifyJob, RankJob
from prefillonly_sgl.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec, load_app_module
from prefillonly_sgl.wire import (
    ClassifyData,
    ClassifyRequest,
    ClassifyResponse,
    RerankAnswer,
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    SGLangRerankResult,
    Usage,
    classify_parameter,
)

# Qwen3-Reranker's own prompt (its model card): ChatML, a judging system turn, the query
# in the user turn and the document last, then an empty thinking block; labels yes / no.
QWEN3_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@ranker(labels=["yes", "no"], score="yes", item="document", path="/v1/rerank/default")
def qwen3_reranker(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> Prompt:
    """Relevance of a document to a query: P(yes) over yes/no, Qwen3-Reranker's format."""
    return Prompt(
        prefix=f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {instruction}\n<Query>: {query}\n",
        item=f"<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    )


def _usage(context) -> Usage:
    usage = context.usage
    if usage is None:
        return Usage()
    return Usage(prompt_tokens=usage.prompt_tokens, total_tokens=usage.prompt_tokens,
                 cached_tokens=usage.cached_tokens)  # fmt: skip


def _model_name(context, asked: str | None) -> str:
    served = getattr(getattr(context, "tokenizer_manager", None), "served_model_name", None)
    return asked or served or "default"


def rerank_endpoint(function=qwen3_reranker) -> EndpointSpec:
    """POST /v1/rerank backed by ``function``, a DSL ranker taking ``query`` (and, when it
    has one, ``instruction``) and the document as its item."""
    params = set(function.inputs.params)
    if "query" not in params:
        raise ValueError(f"--rerank {function.fn.__name__}: the ranker needs a 'query' parameter")
    required = {
        p.name
        for p in function.inputs.signature.parameters.values()
        if p.default is p.empty and p.name not in ("query", function.item_param)
    }
    if required:
        raise ValueError(
            f"--rerank {function.fn.__name__}: /v1/rerank gives only query and documents, but "
            f"the ranker also requires {sorted(required)} (give them defaults)"
        )

    async def rerank(request: RerankRequest, context) -> RerankAnswer:
        documents = [d if isinstance(d, str) else d.text for d in request.documents]
        if request.top_n is not None and request.top_k is not None:
            raise InvalidRequestError("give top_n or top_k (the same thing), not both")
        top_n = request.top_n if request.top_n is not None else request.top_k
        top_n = len(documents) if top_n is None else top_n
        if not 1 <= top_n <= len(documents):
            raise InvalidRequestError(
                f"top_n must be between 1 and the number of documents ({len(documents)}), "
                f"got {top_n}"
            )
        shared = {"query": request.query}
        instruction = request.instruction or request.instruct
        if instruction is not None:
            if "instruction" not in params:
                raise InvalidRequestError(
                    f"instruction: the reranker {function.fn.__name__} takes none"
                )
            shared["instruction"] = instruction
        job = RankJob(function, function.inputs.validate((), shared), tuple(documents))
        rows = await server_backend(context).run(job)
        ranking = function.ranking(documents, rows, top_k=top_n)
        usage = _usage(context)
        if request.wants_sglang_answer:
            # meta_info passes through smg untouched: the DSL's gateway client rebuilds
            # its rows from it (gateway_client.py), whatever the ranker's score.
            labels = [str(t) for t in function.labels.texts]
            return RerankAnswer(
                [
                    SGLangRerankResult(
                        score=r.score,
                        document=r.item if request.return_documents else None,
                        index=r.index,
                        meta_info=RerankMeta(
                            function=function.fn.__name__,
                            labels=labels,
                            call_prompt_tokens=usage.prompt_tokens,
                            call_cached_tokens=usage.cached_tokens,
                            probs=[r.probs[t] for t in function.labels.texts],
                        ),
                    )
                    for r in ranking.items
                ]
            )
        return RerankResponse(
            id=f"rerank-{uuid.uuid4().hex}",
            model=_model_name(context, request.model),
            results=[
                RerankResult(
                    index=r.index,
                    relevance_score=r.score,
                    document=RerankDocument(text=r.item) if request.return_documents else None,
                )
                for r in ranking.items
            ],
            usage=usage,
        )

    return EndpointSpec(
        "/v1/rerank",
        RerankRequest,
        RerankAnswer,
        rerank,
        summary=f"Rerank documents for a query (Cohere schema; {function.fn.__name__})",
        tags=("prefillonly",),
        count_prompts=lambda body: len(body.get("documents") or []) or 1,
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
            model=_model_name(context, request.model),
            data=[
                ClassifyData(
                    index=i,
                    label=r.label_text,
                    probs=[r.probs[label] for label in labels],
                    num_classes=len(labels),
                )
                for i, r in enumerate(results)
            ],
            usage=_usage(context),
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


def ranking_api_endpoints(apps, rerank: str | None, classify: str | None) -> list[EndpointSpec]:
    """/v1/rerank and /v1/classify for `serve`: the named DSL functions of the --app
    modules, or the defaults (the built-in reranker; a 400 for /v1/classify)."""

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

    return [
        rerank_endpoint(find(rerank, "ranker") if rerank else qwen3_reranker),
        classify_endpoint(find(classify, "classifier")) if classify else no_classifier_endpoint(),
    ]

"""The rerank APIs, one scorer behind three schemas:

POST /v1/rerank   Cohere v1 / Jina / vLLM (what vLLM, SGLang and `cohere.Client().rerank`
                  send): query, documents (texts or {"text": ...}), top_n,
                  return_documents, max_tokens_per_doc, vLLM's use_activation and
                  truncate_prompt_tokens -> {id, model, results [{index,
                  relevance_score, document?}], usage, meta}; `document` as
                  wire.vllm.echoes_documents says (vLLM's clients require it).
                  A request carrying SGLang's field `rid` (SGLang's gateway `smg` always
                  sends it) gets SGLang's native answer instead: a list
                  of {score, document, index, meta_info}, best first, meta_info naming the
                  ranker, its method and labels, the document's row and the call's tokens.
POST /v2/rerank   Cohere v2 (`cohere.ClientV2().rerank`): query, documents (texts), top_n,
                  max_tokens_per_doc (default 4096) -> {id, results [{index,
                  relevance_score}], meta}, with vLLM's model, usage and documents beside.
POST /rerank      Hugging Face TEI (LlamaIndex's / LangChain's TEI rerankers): query, texts,
                  raw_scores, return_text, truncate, truncation_direction -> [{index,
                  score, text?}], best first. A body with `documents` instead of `texts`
                  is vLLM's /rerank: answered as /v1/rerank.

The scorer is a DSL ranker taking ``query`` (and, when it has one, ``instruction``) with
the document as its item: by default a built-in (apis/rerankers.py: the yes/no judge for
generative rerankers, query likelihood for any other model), or `serve --app FILE
--rerank NAME`. A call is one job (``Backend.run``): the query's prefix is computed once.
``relevance_score`` / TEI's ``score`` lie in [0, 1]: a judge's score (P(yes)), or for a
likelihood ranker exp(its score), the query's per-token probability (the same order);
TEI's ``raw_scores`` gives the ranker's own score (the mean log-probability). Documents
are cut as apis/truncation.py says. Bad input gets a 400 naming the problem.

On a vision-language model a query or document may carry images (wire/rerank_content.py:
SGLang's content parts, vLLM's {"content": ...}, Jina's {"text", "image"}; ours,
`image_data` for the query and TEI's `item_image_data`): the query's go in the reusable
prefix, shared by every document, a document's in its item (apis/rerank_images.py).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass

from prefillonly_sgl.apis.rerank_images import load_rerank_images
from prefillonly_sgl.apis.truncation import JOIN_SLACK, fit_documents
from prefillonly_sgl.dsl.backends.server import server_backend
from prefillonly_sgl.dsl.job import RankJob
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.error_bodies import parse_body
from prefillonly_sgl.wire.cohere import (
    RerankApiVersion,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResponseMeta,
    RerankResult,
    RerankTokens,
    RerankV2Request,
    RerankV2Response,
)
from prefillonly_sgl.wire.prefillonly import Usage, api_usage
from prefillonly_sgl.wire.rerank_content import content_text, image_list, split_content
from prefillonly_sgl.wire.sglang import RerankAnswer, RerankMeta, SGLangRerankResult
from prefillonly_sgl.wire.tei import TeiRank, TeiRerankRequest, TeiRerankResponse
from prefillonly_sgl.wire.vllm import echoes_documents, relevance_logit, truncation_limit


@dataclass(frozen=True)
class Reranked:
    """One call's answer: ``items`` every document best first (the ranker's RankedItems)."""

    items: list
    usage: Usage

    def relevance(self, item, use_activation: bool | None = None) -> float:
        """The item's relevance in [0, 1]; vLLM's ``use_activation=False``: before the
        sigmoid (wire/vllm.py: relevance_logit)."""
        r = math.exp(item.score) if item.token_logprobs is not None else item.score
        return relevance_logit(r) if use_activation is False else r


class Reranker:
    """A DSL ranker as the scorer of the rerank APIs (checked once, at start-up)."""

    def __init__(self, function) -> None:
        params = set(function.inputs.params)
        name = function.fn.__name__
        if "query" not in params:
            raise ValueError(f"--rerank {name}: the ranker needs a 'query' parameter")
        required = {
            p.name
            for p in function.inputs.signature.parameters.values()
            if p.default is p.empty and p.name not in ("query", function.item_param)
        }
        if required:
            raise ValueError(
                f"--rerank {name}: the rerank APIs give only query and documents, but the "
                f"ranker also requires {sorted(required)} (give them defaults)"
            )
        self.function = function
        self.name = name
        self.method = "likelihood" if function.scores_continuation else "judge"
        self.takes_instruction = "instruction" in params

    async def rerank(
        self,
        context,
        query: str,
        documents: list[str],
        instruction: str | None = None,
        max_tokens_per_doc: int | None = None,
        truncate: bool = False,
        keep_end: bool = False,
        field: str = "documents",
        how_to_cut: str = "max_tokens_per_doc",
        truncate_prompt_tokens: int | None = None,
        query_images: list = (),
        document_images: list[list] | None = None,
    ) -> Reranked:
        """query_images: the query's images as (where, URL) pairs; document_images: per
        document its own (apis/rerank_images.py places them)."""
        own = document_images if document_images is not None else [[] for _ in documents]
        images = await load_rerank_images(context, self, list(query_images), own)
        if images is not None:
            query = images.query_text(query)
        shared = {"query": query}
        if instruction is not None:
            if not self.takes_instruction:
                raise InvalidRequestError(f"instruction: the reranker {self.name} takes none")
            shared["instruction"] = instruction
        shared = self.function.inputs.validate((), shared)
        longest = context.limits.scoring_prompt_tokens
        around = self._prompt_tokens(context, shared)
        room = longest - around
        limit = truncation_limit(truncate_prompt_tokens, longest)
        if limit is not None:
            # vLLM's truncate_prompt_tokens bounds the whole prompt: here the document is
            # cut (the ranker's prompt and the query stay whole).
            if limit - around < 1:
                raise InvalidRequestError(
                    f"truncate_prompt_tokens is {limit}, but the query and the ranker's "
                    f"prompt already take {around} tokens: request a larger truncation size"
                )
            room, truncate = min(room, limit - around), True
        documents = fit_documents(
            context.tokenizer,
            documents,
            room,
            max_tokens_per_doc,
            truncate,
            keep_end,
            field,
            how_to_cut,
        )
        if images is None:
            job = RankJob(self.function, shared, tuple(documents))
        else:
            documents = images.document_texts(documents, field)
            job = RankJob(self.function, shared, tuple(documents), images.query, images.item_images)
        rows = await server_backend(context).run(job)
        ranking = self.function.ranking(documents, rows)
        return Reranked(items=ranking.items, usage=call_usage(context))

    def _prompt_tokens(self, context, shared: dict) -> int:
        """Tokens of the ranker's prompt around an empty document, plus the joins' slack."""
        tokenizer = context.tokenizer
        prompt = self.function.prompt(tokenizer, **shared, **{self.function.item_param: ""})
        n = len(tokenizer.encode(prompt.text))
        if prompt.continuation:
            n += len(tokenizer.encode(prompt.continuation, add_special_tokens=False))
        return n + JOIN_SLACK

    def meta(self, usage: Usage, version: str) -> RerankResponseMeta:
        return RerankResponseMeta(
            api_version=RerankApiVersion(version=version),
            tokens=RerankTokens(input_tokens=usage.prompt_tokens),
            ranker=self.name,
            method=self.method,
        )


def call_usage(context) -> Usage:
    """The answered request's token usage (the API answers' `usage`)."""
    usage = context.usage
    return Usage() if usage is None else api_usage(usage)


def model_name(context, asked: str | None) -> str:
    served = getattr(getattr(context, "tokenizer_manager", None), "served_model_name", None)
    return asked or served or "default"


def _top_n(top_n: int | None, n_documents: int) -> int:
    top_n = n_documents if top_n is None else top_n
    if not 1 <= top_n <= n_documents:
        raise InvalidRequestError(
            f"top_n must be between 1 and the number of documents ({n_documents}), got {top_n}"
        )
    return top_n


def _count(field: str):
    return lambda body: len(body.get(field) or []) or 1


def _cohere_v1_handler(reranker: Reranker, sglang_answer: bool = False):
    """The handler of Cohere v1's (and vLLM's) rerank body, on /v1/rerank and /rerank.
    sglang_answer: SGLang's list for every request (`serve --rerank-answer sglang`), not
    only for those carrying `rid`."""
    function = reranker.function

    async def rerank(request: RerankRequest, context) -> RerankAnswer:
        if request.top_n is not None and request.top_k is not None:
            raise InvalidRequestError("give top_n or top_k (the same thing), not both")
        query, query_images = _query(request)
        documents, document_images = _documents(request.documents, "documents")
        top_n = _top_n(request.top_n if request.top_n is not None else request.top_k,
                       len(documents))  # fmt: skip
        answer = await reranker.rerank(
            context,
            query,
            documents,
            request.instruction or request.instruct,
            request.max_tokens_per_doc,
            truncate_prompt_tokens=request.truncate_prompt_tokens,
            query_images=query_images,
            document_images=document_images,
        )
        best = answer.items[:top_n]
        given = request.documents
        echo = echoes_documents(request.return_documents, request.model_fields_set)
        if sglang_answer or request.wants_sglang_answer:
            # meta_info passes through smg untouched: the DSL's gateway client rebuilds
            # its rows from it (gateway_client.py), whatever the ranker's score.
            labels = [str(t) for t in function.labels.texts]
            return RerankAnswer(
                [
                    SGLangRerankResult(
                        score=r.score,
                        document=_text(given[r.index]) if echo else None,
                        index=r.index,
                        meta_info=RerankMeta(
                            function=reranker.name,
                            labels=labels,
                            call_prompt_tokens=answer.usage.prompt_tokens,
                            call_cached_tokens=answer.usage.cached_tokens,
                            probs=[r.probs[t] for t in function.labels.texts],
                            method=function.method,
                            token_logprobs=r.token_logprobs,
                        ),
                    )
                    for r in best
                ]
            )
        return RerankResponse(
            id=f"rerank-{uuid.uuid4().hex}",
            model=model_name(context, request.model),
            results=_results(answer, best, given, echo, request.use_activation),
            usage=answer.usage,
            meta=reranker.meta(answer.usage, "1"),
        )

    return rerank


def rerank_v1_endpoint(reranker: Reranker, sglang_answer: bool = False) -> EndpointSpec:
    """POST /v1/rerank: Cohere v1's (and vLLM's) schema, or SGLang's native answer for
    ``rid`` (for every request with ``sglang_answer``)."""
    handler = _cohere_v1_handler(reranker, sglang_answer)
    return _endpoint(reranker, "/v1/rerank", RerankRequest, RerankAnswer, handler, "Cohere v1")


def _text(document) -> str:
    """A document's text, as an answer echoes it (its images never)."""
    return content_text(document)


def _query(request) -> tuple[str, list]:
    """A Cohere-shaped request's query text and its images: ``image_data``'s, then the
    query's own parts'."""
    text, own = split_content(request.query, "query")
    return text, image_list(request.image_data, "image_data") + own


def _documents(documents, field: str) -> tuple[list[str], list[list] | None]:
    """The documents' texts and, when any has images, per document its own."""
    split = [split_content(d, f"{field}[{i}]") for i, d in enumerate(documents)]
    images = [own for _, own in split]
    return [text for text, _ in split], images if any(images) else None


def _tei_images(request) -> tuple[list, list[list] | None]:
    """TEI's extension fields: the query's images and per text its own."""
    query = image_list(request.image_data, "image_data")
    per_text = request.item_image_data
    if per_text is None:
        return query, None
    if len(per_text) != len(request.texts):
        raise InvalidRequestError(
            f"item_image_data has {len(per_text)} entries for {len(request.texts)} texts: "
            "give one list per text ([] for a text without images)"
        )
    return query, [image_list(own, f"item_image_data[{i}]") for i, own in enumerate(per_text)]


def _results(answer: Reranked, best, given, echo: bool, use_activation) -> list[RerankResult]:
    """Cohere v1's / vLLM's results, best first: `document` only when ``echo``."""
    return [
        RerankResult(
            index=r.index,
            relevance_score=answer.relevance(r, use_activation),
            document=RerankDocument(text=_text(given[r.index])) if echo else None,
        )
        for r in best
    ]


def rerank_v2_endpoint(reranker: Reranker) -> EndpointSpec:
    """POST /v2/rerank: Cohere v2's schema."""

    async def rerank(request: RerankV2Request, context) -> RerankV2Response:
        if request.relevant_spans and request.relevant_spans.get("mode") == "enabled":
            raise InvalidRequestError("relevant_spans is not supported: leave it out")
        top_n = _top_n(request.top_n, len(request.documents))
        query, query_images = _query(request)
        documents, document_images = _documents(request.documents, "documents")
        answer = await reranker.rerank(
            context, query, documents,
            max_tokens_per_doc=request.max_tokens_per_doc,
            truncate_prompt_tokens=request.truncate_prompt_tokens,
            query_images=query_images, document_images=document_images,
        )  # fmt: skip
        echo = echoes_documents(request.return_documents, request.model_fields_set)
        return RerankV2Response(
            id=f"rerank-{uuid.uuid4().hex}",
            model=model_name(context, request.model),
            results=_results(
                answer, answer.items[:top_n], request.documents, echo, request.use_activation
            ),
            usage=answer.usage,
            meta=reranker.meta(answer.usage, "2"),
        )

    return _endpoint(reranker, "/v2/rerank", RerankV2Request, RerankV2Response, rerank, "Cohere v2")


def tei_rerank_endpoint(reranker: Reranker) -> EndpointSpec:
    """POST /rerank: Hugging Face TEI's schema (`texts`), or vLLM's /rerank (`documents`,
    answered as /v1/rerank): the body's own field decides."""
    vllm_rerank = _cohere_v1_handler(reranker)

    async def tei_rerank(request: TeiRerankRequest, context) -> TeiRerankResponse:
        query_images, text_images = _tei_images(request)
        answer = await reranker.rerank(
            context,
            request.query,
            list(request.texts),
            truncate=request.truncate,
            keep_end=request.truncation_direction.lower() == "left",
            field="texts",
            how_to_cut="truncate: true",
            query_images=query_images,
            document_images=text_images,
        )
        return TeiRerankResponse(
            [
                TeiRank(
                    index=r.index,
                    score=r.score if request.raw_scores else answer.relevance(r),
                    text=request.texts[r.index] if request.return_text else None,
                )
                for r in answer.items
            ]
        )

    async def rerank(body: object, context):
        if isinstance(body, dict) and "documents" in body and "texts" not in body:
            return await vllm_rerank(parse_body(RerankRequest, body), context)
        return await tei_rerank(parse_body(TeiRerankRequest, body), context)

    spec = _endpoint(
        reranker, "/rerank", TeiRerankRequest, TeiRerankResponse, rerank, "TEI", field="texts"
    )
    return dataclasses.replace(
        spec, raw_body=True, count_prompts=lambda body: len(body.get("texts") or body.get(
            "documents") or []) or 1,
    )  # fmt: skip


def _endpoint(reranker, path, request, response, handler, schema, field="documents"):
    """One ranking API's EndpointSpec: `field` names the request's list of texts."""
    return EndpointSpec(
        path,
        request,
        response,
        handler,
        summary=f"Rerank {field} for a query ({schema} schema; {reranker.name}, {reranker.method})",
        tags=("prefillonly",),
        count_prompts=_count(field),
    )


def rerank_endpoints(function, sglang_answer: bool = False) -> list[EndpointSpec]:
    """/v1/rerank, /v2/rerank and /rerank backed by ``function`` (ValueError if it cannot
    serve them); ``sglang_answer``: /v1/rerank answers SGLang's list to every request."""
    reranker = Reranker(function)
    return [
        rerank_v1_endpoint(reranker, sglang_answer),
        rerank_v2_endpoint(reranker),
        tei_rerank_endpoint(reranker),
    ]

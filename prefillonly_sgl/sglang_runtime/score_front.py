"""The one scoring path of the main process: check a score call, run it on SGLang's
TokenizerManager, return a ScoreResult with its usage.

    Engine.score / async_score  ──┐
    server: typed endpoints      ─┼─> ScoringFront.score ─> TokenizerManager.score_request
    server: /v1/score's checks   ─┘   (ScoringFront.check)

    Engine.decide                ─┐
    server: /v1/decisions,        ├─> ScoringFront.decide ─> ScoringFront.score per group
            /v1/systemone        ─┘   (decisions/plan.py: the state once, questions items)
    (on a decision checkpoint, /v1/systemone runs SGLang's own handler instead:
     http_server/systemone_checkpoints.py; ScoringFront.decide refuses it)

    Engine.continuation_logprobs ─┐
    server: /v1/rerank, /rerank   ─┴> ScoringFront.continuation_logprobs
                                      ─> continuation_logprobs.py (generate_request)

SGLang's own /v1/score handler still answers /v1/score (its response format, with every
SGLang field), after the guard has run its checks on the body.

Every method takes the call's context (scoring/call_context.py: salt, adapter, the HTTP
request, the enclosing usage record), built by the door the call came in through, and runs
each call into SGLang under a copy of it with its own usage record (_sglang_call): that
context is what request_recording.py writes into SGLang's requests.

Labels of one token each go to score_request as one call (one forward per prompt);
labels of several tokens go through label_sequences.py (the prompts, then the label
prefixes as cache hits of them).
"""

from __future__ import annotations

import contextlib

from prefillonly_sgl.decisions.call import DecisionCall, DecisionOutcome
from prefillonly_sgl.decisions.checkpoints import CHECKPOINT_REFUSAL, Readout
from prefillonly_sgl.decisions.execution import decide
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.features.prefill_kv.tokenizer_process import (
    allow_setwise_with_cache,
    mark_image_pad,
)
from prefillonly_sgl.scoring.call_context import CallContext, carrying
from prefillonly_sgl.scoring.class_head import ClassHead
from prefillonly_sgl.scoring.continuations import (
    ContinuationResult,
    plan_continuations,
    tokenizer_encode,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.image_prompts import check_reads_images
from prefillonly_sgl.scoring.label_trie import build_trie, label_token_logprobs
from prefillonly_sgl.scoring.score_options import ScoreOptions
from prefillonly_sgl.scoring.score_result import LabelTokenLogprobs, ScoreResult
from prefillonly_sgl.scoring.text_prompts import joined_token_ids
from prefillonly_sgl.scoring.usage import RequestRecord
from prefillonly_sgl.scoring.validation import (
    ModelLimits,
    TextOrIds,
    prompt_token_counter,
    validate_prompts,
    validate_score_request,
)
from prefillonly_sgl.sglang_runtime.continuation_logprobs import continuation_logprobs
from prefillonly_sgl.sglang_runtime.label_sequences import read_nodes, score_label_sequences
from prefillonly_sgl.sglang_runtime.model_facts import model_facts
from prefillonly_sgl.sglang_runtime.request_recording import record_generate_requests
from prefillonly_sgl.sglang_runtime.shared_image_features import share_images


class ScoringFront:
    """Scoring on one running SGLang TokenizerManager (the Engine's or the server's)."""

    def __init__(self, tokenizer_manager, limits: ModelLimits) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.limits = limits
        # what the model is, decided once here; every door reads it (model_facts.py)
        self.facts = model_facts(
            tokenizer_manager.model_config,
            limits,
            getattr(tokenizer_manager, "mm_processor", None),
            getattr(tokenizer_manager.server_args, "attention_backend", None),
        )
        self.count_prompt_tokens = prompt_token_counter(tokenizer_manager.tokenizer)
        record_generate_requests(tokenizer_manager)  # cached tokens and rids per call
        # the setwise readout keeps the prefix cache where prefill-only KV runs
        allow_setwise_with_cache(tokenizer_manager, limits.max_scoring_prompt_tokens is not None)
        # an image of the query is reusable in its expanded positions (prefill_kv)
        placeholder = self.facts.image_placeholder
        mark_image_pad(tokenizer_manager, None if placeholder is None else placeholder.pad_token_id)
        # a call's prompts name their image's one shared segment (where prefill-only KV
        # runs: a stock engine keeps SGLang's copy per prompt)
        share_images(
            tokenizer_manager,
            placeholder is not None and limits.max_scoring_prompt_tokens is not None,
        )

    @property
    def tokenizer(self):
        return self.tokenizer_manager.tokenizer

    def check(
        self, query, items, label_token_ids, item_first: bool = False
    ) -> tuple[TextOrIds, list[TextOrIds], list[tuple[int, ...]]]:
        """(query, items, labels as token-id tuples) normalised; InvalidRequestError
        naming the problem."""
        return validate_score_request(
            query, items, label_token_ids, self.limits, self.count_prompt_tokens, item_first
        )

    async def score(
        self,
        ctx: CallContext,
        query,
        items,
        label_token_ids,
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
        score_extraction_token: str | int | None = None,
        options: ScoreOptions | None = None,
    ) -> ScoreResult:
        """prefillonly_sgl.Engine.score semantics, under the call's context `ctx` (its
        salt, adapter and HTTP request, which SGLang watches for disconnects).
        score_extraction_token: the setwise readout (a dedicated token, by its text or
        id): labels read at every occurrence of it in each prompt, one [anchors x labels]
        matrix per item. options: SGLang's other score fields, passed through
        (scoring/score_options.py). On a model with a classification head (``head``): no
        label_token_ids, each item's class scores."""
        options = options or ScoreOptions()
        if self.head is not None:
            return await self._score_head(
                ctx,
                query,
                items,
                label_token_ids,
                apply_softmax,
                item_first,
                score_extraction_token,
                options,
            )
        if label_token_ids is None:
            raise InvalidRequestError(
                "label_token_ids is required: this model reads label tokens (a model with a "
                "classification head answers its classes without them; docs/heads.md)"
            )
        query, items, labels = self.check(query, items, label_token_ids, item_first)
        if options.image_data is not None:
            self._check_reads_images()
            # each prompt's images are the query's then the item's, in the text's order
            if item_first or score_extraction_token is not None:
                raise InvalidRequestError(
                    "images cannot be combined with "
                    + ("item_first" if item_first else "score_extraction_token")
                )
        if not items:  # SGLang's answer to no items: no rows
            return ScoreResult(scores=[], prompt_tokens=0)
        trie = build_trie(labels)
        options.check(apply_softmax, trie.one_token_labels, len(items))
        if score_extraction_token is not None and not trie.one_token_labels:
            raise InvalidRequestError(
                "score_extraction_token reads labels of one token each at every anchor; "
                "labels of several tokens are read after the whole prompt only"
            )
        fields = self._sglang_fields(options, score_extraction_token)
        if self._text_as_ids(query, items, item_first, score_extraction_token, options):
            query, items = joined_token_ids(self.tokenizer.encode, query, items)
        request = ctx.http_request
        with _sglang_call("score", ctx) as call:
            if trie.one_token_labels:  # per token, a length is 1: nothing to normalise
                result = await self.tokenizer_manager.score_request(
                    query=query,
                    items=items,
                    label_token_ids=[label[0] for label in labels],
                    apply_softmax=apply_softmax,
                    item_first=item_first,
                    request=request,
                    **fields,
                )
                scores, prompt_tokens = result.scores, result.prompt_tokens
                token_logprobs = result.token_logprobs
            else:
                scores, prompt_tokens, sequences = await score_label_sequences(
                    self.tokenizer_manager,
                    query,
                    items,
                    trie,
                    apply_softmax,
                    length_normalize,
                    item_first,
                    request,
                    options.temperature,
                    options.image_data,
                )
                token_logprobs = sequences if options.return_token_logprobs else None
        return ScoreResult(
            scores=scores,
            prompt_tokens=prompt_tokens,
            cached_tokens=call.record.usage.cached_tokens,
            token_logprobs=token_logprobs,
        )

    def _check_reads_images(self) -> None:
        check_reads_images(self.facts.image_placeholder, self.facts.image_refusal)

    async def label_token_logprobs(
        self, ctx: CallContext, query, items, label_token_ids, image_data=None
    ) -> LabelTokenLogprobs:
        """Each label's per-token log-probabilities after each query + item (the chain
        rule's factors; labels of several tokens through the prefix cache, as ``score``
        reads them), under the call's context: what a choice request's answer is picked
        from. image_data: per item its images (encoded bytes; query and items then text
        holding their placeholders; labels of several tokens continue as text:
        label_sequences.py, NotExactAsText where that would not be exact)."""
        query, items, labels = self.check(query, items, label_token_ids)
        if image_data is not None:
            self._check_reads_images()
        trie = build_trie(labels)
        first: list[RequestRecord] = []  # round 1's own record: the prompts' cache hits

        with _sglang_call("label_token_logprobs", ctx) as call:

            @contextlib.contextmanager
            def first_round():
                with _sglang_call("label_token_logprobs.prompts", call) as prompts:
                    first.append(prompts.record)
                    yield

            by_item, _ = await read_nodes(
                self.tokenizer_manager, query, items, trie, request=ctx.http_request,
                first_round=first_round, image_data=image_data,
            )  # fmt: skip
        record = call.record
        rows = [label_token_logprobs(trie, by_node) for by_node in by_item]
        return LabelTokenLogprobs(
            rows=rows,
            prompt_tokens=record.usage.prompt_tokens,
            cached_tokens=record.usage.cached_tokens,
            prompt_cached_tokens=first[0].usage.cached_tokens,
            prompt_own_tokens=first[0].usage.prompt_tokens,
        )

    def _text_as_ids(self, query, items, item_first, score_extraction_token, options) -> bool:
        """A text call sent as token ids (scoring/text_prompts.py: SGLang then dispatches
        its prompts together); the setwise readout, embedding overrides, item-first
        prompts and multi-item scoring keep SGLang's text path."""
        from sglang.srt.runtime_context import get_exec

        return (
            isinstance(query, str)
            and all(isinstance(item, str) for item in items)
            and not item_first
            and score_extraction_token is None
            and options.embed_override_token_id is None
            and options.image_data is None  # the processor expands the placeholders in text
            and self.tokenizer is not None
            and not get_exec().features.enable_mis
        )

    @property
    def head(self) -> ClassHead | None:
        """The served model's classification head, or None: it reads label tokens."""
        return self.facts.head

    async def _score_head(
        self,
        ctx: CallContext,
        query,
        items,
        label_token_ids,
        apply_softmax: bool,
        item_first: bool,
        score_extraction_token,
        options: ScoreOptions,
    ) -> ScoreResult:
        """Each item's class scores from the head (SGLang's score_request without labels:
        an embedding request per prompt, the query computed once and cached as for label
        tokens: prefill-only KV and packing read its reusable prefix)."""
        self.head.check_no_labels(label_token_ids)
        self.head.check_softmax(apply_softmax)
        query, items = validate_prompts(
            query, items, self.limits, self.count_prompt_tokens, item_first
        )
        if not items:
            return ScoreResult(scores=[], prompt_tokens=0)
        options.check(apply_softmax, True, len(items))
        fields = self._sglang_fields(options, score_extraction_token)
        with _sglang_call("score", ctx) as call:
            result = await self.tokenizer_manager.score_request(
                query=query,
                items=items,
                label_token_ids=None,
                apply_softmax=apply_softmax,
                item_first=item_first,
                request=ctx.http_request,
                **fields,
            )
        return ScoreResult(
            scores=result.scores,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=call.record.usage.cached_tokens,
            pooled_hidden_states=result.pooled_hidden_states,
        )

    def _sglang_fields(self, options: ScoreOptions, score_extraction_token) -> dict:
        """score_request's keywords beyond the prompts and labels: the options SGLang takes
        as they are, and the setwise anchor as its token id."""
        fields = options.sglang_kwargs()
        if score_extraction_token is not None:
            fields["score_extraction_token_id"] = self._extraction_token_id(score_extraction_token)
        return fields

    def _extraction_token_id(self, token: str | int) -> int:
        """The setwise anchor's token id: an id below the vocabulary, or a token's text
        resolved as SGLang's /v1/score resolves it (a dedicated token)."""
        if isinstance(token, bool) or not isinstance(token, (str, int)):
            raise InvalidRequestError(
                f"score_extraction_token must be a token's text or id, got {token!r}"
            )
        if isinstance(token, int):
            if not 0 <= token < self.limits.vocab_size:
                raise InvalidRequestError(
                    f"score_extraction_token {token} is outside the vocabulary "
                    f"(0..{self.limits.vocab_size - 1})"
                )
            return token
        try:
            return self.tokenizer_manager._resolve_score_extraction_token_id(token)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None

    @property
    def readout(self) -> Readout:
        """How the served model answers decisions (decisions/checkpoints.py)."""
        return self.facts.readout

    async def decide(self, ctx: CallContext, call: DecisionCall) -> DecisionOutcome:
        """Every question of a decision call answered behind its state, computed once
        (decisions/: the plan, its score requests through ``score``, the answers), under
        the call's context (its salt and adapter for every score request). A decision
        checkpoint is refused: its questions have no place in the prompt it was trained on
        (the server answers it on /v1/systemone)."""
        if self.readout.is_checkpoint:
            raise InvalidRequestError(CHECKPOINT_REFUSAL)
        plan = plan_decision(call, self.tokenizer, self.limits.scoring_prompt_tokens)
        decision = ctx.for_sglang("decide")  # the score calls' records are its children

        async def score(query, items, labels):
            result = await self.score(decision, query, items, labels, apply_softmax=False)
            return result.scores

        with _refusals():
            return await decide(plan, score, decision.record.usage)

    async def continuation_logprobs(
        self, ctx: CallContext, query, items, continuation
    ) -> ContinuationResult:
        """Each continuation token's log-probability after query + item
        (prefillonly_sgl.Engine.continuation_logprobs semantics), under the call's
        context."""
        plan = plan_continuations(
            query, items, continuation, self.limits, tokenizer_encode(self.tokenizer)
        )
        with _sglang_call("continuation_logprobs", ctx) as call:
            rows, prompt_tokens = await continuation_logprobs(
                self.tokenizer_manager, plan, ctx.http_request
            )
        return ContinuationResult(
            token_logprobs=rows,
            prompt_tokens=prompt_tokens,
            cached_tokens=call.record.usage.cached_tokens,
        )


@contextlib.contextmanager
def _sglang_call(name: str, ctx: CallContext):
    """One call into SGLang under a copy of `ctx` with its own usage record (yielded, the
    copy; the enclosing record, an HTTP request's or a decision's, is its parent), carried
    through SGLang's stack to request_recording.py; SGLang's ValueError (its way of
    refusing a request) as an InvalidRequestError."""
    call = ctx.for_sglang(name)
    with _refusals(), carrying(call):  # SGLang's tasks below copy the carried context
        yield call


@contextlib.contextmanager
def _refusals():
    """SGLang's ValueError (its way of refusing a request) as an InvalidRequestError."""
    try:
        yield
    except InvalidRequestError:
        raise
    except ValueError as e:
        raise InvalidRequestError(str(e)) from e

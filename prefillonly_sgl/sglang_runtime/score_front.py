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

Labels of one token each go to score_request as one call (one forward per prompt);
labels of several tokens go through label_sequences.py (the prompts, then the label
prefixes as cache hits of them).
"""

from __future__ import annotations

import contextlib
import functools

from prefillonly_sgl.decisions.call import DecisionCall, DecisionOutcome
from prefillonly_sgl.decisions.checkpoints import CHECKPOINT_REFUSAL, Readout, readout_of
from prefillonly_sgl.decisions.execution import decide
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.features.prefill_kv.tokenizer_process import allow_setwise_with_cache
from prefillonly_sgl.models.families import HEAD_ARCHITECTURES
from prefillonly_sgl.scoring.adapters import REQUEST_LORA, check_lora_path
from prefillonly_sgl.scoring.cache_salts import REQUEST_SALT, check_salt
from prefillonly_sgl.scoring.class_head import ClassHead
from prefillonly_sgl.scoring.continuations import (
    ContinuationResult,
    plan_continuations,
    tokenizer_encode,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.label_trie import build_trie, label_token_logprobs
from prefillonly_sgl.scoring.score_options import ScoreOptions
from prefillonly_sgl.scoring.score_result import LabelTokenLogprobs, ScoreResult
from prefillonly_sgl.scoring.text_prompts import joined_token_ids
from prefillonly_sgl.scoring.usage import CURRENT_REQUEST, RequestRecord
from prefillonly_sgl.scoring.validation import (
    ModelLimits,
    TextOrIds,
    prompt_token_counter,
    validate_prompts,
    validate_score_request,
)
from prefillonly_sgl.sglang_runtime.continuation_logprobs import continuation_logprobs
from prefillonly_sgl.sglang_runtime.label_sequences import read_nodes, score_label_sequences
from prefillonly_sgl.sglang_runtime.request_recording import record_generate_requests


class ScoringFront:
    """Scoring on one running SGLang TokenizerManager (the Engine's or the server's)."""

    def __init__(self, tokenizer_manager, limits: ModelLimits) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.limits = limits
        self.count_prompt_tokens = prompt_token_counter(tokenizer_manager.tokenizer)
        record_generate_requests(tokenizer_manager)  # cached tokens and rids per call
        # the setwise readout keeps the prefix cache where prefill-only KV runs
        allow_setwise_with_cache(tokenizer_manager, limits.max_scoring_prompt_tokens is not None)

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
        query,
        items,
        label_token_ids,
        apply_softmax: bool = True,
        item_first: bool = False,
        request=None,
        length_normalize: bool = False,
        cache_salt: str | None = None,
        score_extraction_token: str | int | None = None,
        options: ScoreOptions | None = None,
        lora_path: str | None = None,
    ) -> ScoreResult:
        """prefillonly_sgl.Engine.score semantics. request: the HTTP request, if any (SGLang
        watches it for disconnects). cache_salt: the call's prefix-cache namespace (None:
        the enclosing one, scoring/cache_salts.py). score_extraction_token: the setwise
        readout (a dedicated token, by its text or id): labels read at every occurrence of
        it in each prompt, one [anchors x labels] matrix per item. options: SGLang's other
        score fields, passed through (scoring/score_options.py). lora_path: the LoRA adapter
        the call runs under (scoring/adapters.py; None: the enclosing one, or the base
        model). On a model with a classification head (``head``): no label_token_ids, each
        item's class scores."""
        options = options or ScoreOptions()
        if self.head is not None:
            return await self._score_head(
                query,
                items,
                label_token_ids,
                apply_softmax,
                item_first,
                request,
                cache_salt,
                score_extraction_token,
                options,
                lora_path,
            )
        if label_token_ids is None:
            raise InvalidRequestError(
                "label_token_ids is required: this model reads label tokens (a model with a "
                "classification head answers its classes without them; docs/heads.md)"
            )
        query, items, labels = self.check(query, items, label_token_ids, item_first)
        if not items:  # SGLang's answer to no items: no rows
            return ScoreResult(scores=[], prompt_tokens=0)
        trie = build_trie(labels)
        options.check(apply_softmax, trie.single_token, len(items))
        if score_extraction_token is not None and not trie.single_token:
            raise InvalidRequestError(
                "score_extraction_token reads labels of one token each at every anchor; "
                "labels of several tokens are read after the whole prompt only"
            )
        fields = self._sglang_fields(options, score_extraction_token)
        if self._text_as_ids(query, items, item_first, score_extraction_token, options):
            query, items = joined_token_ids(self.tokenizer.encode, query, items)
        with _sglang_call("score", cache_salt, lora_path) as record:
            if trie.single_token:  # per token, a length is 1: nothing to normalise
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
                )
                token_logprobs = sequences if options.return_token_logprobs else None
        return ScoreResult(
            scores=scores,
            prompt_tokens=prompt_tokens,
            cached_tokens=record.usage.cached_tokens,
            token_logprobs=token_logprobs,
        )

    async def label_token_logprobs(
        self,
        query,
        items,
        label_token_ids,
        request=None,
        cache_salt: str | None = None,
        lora_path: str | None = None,
    ) -> LabelTokenLogprobs:
        """Each label's per-token log-probabilities after each query + item (the chain
        rule's factors; labels of several tokens through the prefix cache, as ``score``
        reads them): what a choice request's answer is picked from."""
        query, items, labels = self.check(query, items, label_token_ids)
        trie = build_trie(labels)
        first: list[RequestRecord] = []  # round 1's own record: the prompts' cache hits

        @contextlib.contextmanager
        def first_round():
            with _sglang_call("label_token_logprobs.prompts") as prompts_record:
                first.append(prompts_record)
                yield

        with _sglang_call("label_token_logprobs", cache_salt, lora_path) as record:
            by_item, _ = await read_nodes(
                self.tokenizer_manager, query, items, trie, request=request,
                first_round=first_round,
            )  # fmt: skip
        rows = [label_token_logprobs(trie, by_node) for by_node in by_item]
        return LabelTokenLogprobs(
            rows=rows,
            prompt_tokens=record.usage.prompt_tokens,
            cached_tokens=record.usage.cached_tokens,
            prompt_cached_tokens=first[0].usage.cached_tokens,
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
            and self.tokenizer is not None
            and not get_exec().features.enable_mis
        )

    @functools.cached_property
    def head(self) -> ClassHead | None:
        """The served model's classification head (a fine-tuned classifier or reward model
        of a family in the table), or None: it reads label tokens."""
        config = self.tokenizer_manager.model_config
        if config.is_generation:
            return None
        hf = config.hf_config
        heads = [a for a in (getattr(hf, "architectures", None) or ()) if a in HEAD_ARCHITECTURES]
        if not heads:
            return None
        return ClassHead.from_config(heads[0], hf.num_labels, getattr(hf, "id2label", None))

    async def _score_head(
        self,
        query,
        items,
        label_token_ids,
        apply_softmax: bool,
        item_first: bool,
        request,
        cache_salt: str | None,
        score_extraction_token,
        options: ScoreOptions,
        lora_path: str | None = None,
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
        with _sglang_call("score", cache_salt, lora_path) as record:
            result = await self.tokenizer_manager.score_request(
                query=query,
                items=items,
                label_token_ids=None,
                apply_softmax=apply_softmax,
                item_first=item_first,
                request=request,
                **fields,
            )
        return ScoreResult(
            scores=result.scores,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=record.usage.cached_tokens,
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

    @functools.cached_property
    def readout(self) -> Readout:
        """How the served model answers decisions: what SGLang's ModelConfig found beside
        the weights (decisions/checkpoints.py)."""
        config = self.tokenizer_manager.model_config
        return readout_of(config.decision_config, config.joint_head_config, config.pointer_head)

    async def decide(
        self, call: DecisionCall, request=None, cache_salt: str | None = None
    ) -> DecisionOutcome:
        """Every question of a decision call answered behind its state, computed once
        (decisions/: the plan, its score requests through ``score``, the answers). A
        decision checkpoint is refused: its questions have no place in the prompt it was
        trained on (the server answers it on /v1/systemone)."""
        if self.readout.is_checkpoint:
            raise InvalidRequestError(CHECKPOINT_REFUSAL)
        plan = plan_decision(call, self.tokenizer, self.limits.scoring_prompt_tokens)

        async def score(query, items, labels):
            result = await self.score(query, items, labels, apply_softmax=False, request=request)
            return result.scores

        with _sglang_call("decide", cache_salt) as record:
            return await decide(plan, score, record.usage)

    async def continuation_logprobs(
        self,
        query,
        items,
        continuation,
        request=None,
        cache_salt: str | None = None,
        lora_path: str | None = None,
    ) -> ContinuationResult:
        """Each continuation token's log-probability after query + item
        (prefillonly_sgl.Engine.continuation_logprobs semantics)."""
        plan = plan_continuations(
            query, items, continuation, self.limits, tokenizer_encode(self.tokenizer)
        )
        with _sglang_call("continuation_logprobs", cache_salt, lora_path) as record:
            rows, prompt_tokens = await continuation_logprobs(self.tokenizer_manager, plan, request)
        return ContinuationResult(
            token_logprobs=rows,
            prompt_tokens=prompt_tokens,
            cached_tokens=record.usage.cached_tokens,
        )


@contextlib.contextmanager
def _sglang_call(name: str, cache_salt: str | None = None, lora_path: str | None = None):
    """One call into SGLang under its own usage record (yielded; an HTTP request's record,
    the guard's, is its parent) and, when given, its own cache salt and LoRA adapter (else
    the enclosing ones: a decision's score calls share the decision's), SGLang's
    ValueError (its way of refusing a request) as an InvalidRequestError."""
    try:
        salt = check_salt(cache_salt)
        lora = check_lora_path(lora_path)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None
    outer = CURRENT_REQUEST.get()
    record = outer.child(name) if outer is not None else RequestRecord(name)
    token = CURRENT_REQUEST.set(record)  # SGLang's tasks below copy this context
    salt_token = REQUEST_SALT.set(salt) if salt is not None else None
    lora_token = REQUEST_LORA.set(lora) if lora is not None else None
    try:
        yield record
    except InvalidRequestError:
        raise
    except ValueError as e:
        raise InvalidRequestError(str(e)) from e
    finally:
        if lora_token is not None:
            REQUEST_LORA.reset(lora_token)
        if salt_token is not None:
            REQUEST_SALT.reset(salt_token)
        CURRENT_REQUEST.reset(token)

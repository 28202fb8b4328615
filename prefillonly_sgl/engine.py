"""prefillonly_sgl.Engine: SGLang's offline engine with the right defaults per device.

    from prefillonly_sgl import Engine
    with Engine() as engine:                       # the embedded default model
        tok = engine.tokenizer
        labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" positive", " negative")]
        result = engine.score("Review: great!\nSentiment:", [""], labels)
        result.scores  # [[p_positive, p_negative]]: one row per item

``score`` has SGLang's ``Engine.score`` semantics (one list of label probabilities per
item, query and item concatenated as text or token ids) and checks the request first, so a
bad request raises InvalidRequestError and never reaches — or kills — SGLang's workers.
The scoring itself is sglang_runtime/score_front.py, shared with the HTTP server; the
start and the stop of SGLang's processes, sglang_runtime/engine_lifecycle.py.
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.config.runtime_config import RuntimeConfig
from prefillonly_sgl.features import STOCK_SGLANG  # noqa: F401  (re-exported)
from prefillonly_sgl.features.hybrid_prefill.settings import HybridSettings
from prefillonly_sgl.features.jct_scheduler.settings import JctSettings
from prefillonly_sgl.memory.budget import MemoryPlan
from prefillonly_sgl.scoring.call_context import CallContext, current
from prefillonly_sgl.scoring.continuations import ContinuationResult
from prefillonly_sgl.scoring.errors import EngineClosedError, EngineDiedError
from prefillonly_sgl.scoring.image_prompts import with_images_off_the_loop
from prefillonly_sgl.scoring.score_options import ScoreOptions
from prefillonly_sgl.scoring.score_result import ScoreResult
from prefillonly_sgl.scoring.validation import ModelLimits, TextOrIds
from prefillonly_sgl.sglang_runtime import engine_lifecycle
from prefillonly_sgl.sglang_runtime.event_loop import check_running_loop_is_served, run_to_end


class Engine:
    """A running SGLang engine for scoring. Start-up takes ~15 s on CPU (worker processes
    import SGLang), so create one and reuse it; ``shutdown()`` (or ``with``) stops every
    process it started.

    model: a Hugging Face model folder (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral, Phi-3,
        Granite, OLMo 2, GLM-4, Gemma 3, gpt-oss, Qwen3.5 families: docs/models.md; a
        feature the family cannot run is off, with a warning saying why), or None for the
        embedded default model (SmolLM2-135M-Instruct, converted once into the user cache).
    device: "cpu" or "cuda"; default: cuda when available.
    dtype: "auto" (the folder's dtype), "float32", "bfloat16", "float16".
    max_total_tokens: KV pool size in tokens (CPU default 16384; GPU: SGLang's sizing).
    context_length: override the model's context length.
    prefill_only_attention: attention of new tokens only, so a prefix-cache hit skips
        the attention over the cached prefix (default). False: stock SGLang attention
        (for A/B runs).
    prefill_only_kv: scoring requests keep pool KV only for their reusable prefix (the
        query), the rest of the prompt is discarded layer by layer, so the pool buys
        prefix-cache capacity and a scoring prompt may be as long as the context, not the
        pool. Needs prefill_only_attention. Default: same as prefill_only_attention.
        False: stock SGLang KV (for A/B runs).
    schedule_policy: "jct" (default): the JCT-aware scheduler, shortest predicted
        remaining time first with aging and prefix groups (docs/scheduler.md); any of
        SGLang's policies ("fcfs", "lpm", "shortest-prefill-first", ...) for A/B runs.
    jct_aging: seconds of priority a request gains per second waited (default 1.0: a
        request waits about its own predicted time at most behind shorter ones).
    jct_profile: a profile file from `prefillonly profile`; default: the saved profile of
        this model, device, dtype and features, else the built-in default model.
    jct_eviction: "queue" (default): under memory pressure the cached prefixes waiting
        requests will hit are evicted last, and those hits run before a batch would evict
        them; "lru": SGLang's least-recently-used eviction (for A/B runs).
    jct_batch_tokens: new tokens per planned batch of whole scoring prompts, up to
        SGLang's max_prefill_tokens (default on CUDA: max_prefill_tokens, 16384 unless
        set, with the prefill CUDA graphs' buckets to match; on CPU stock's
        min(max_prefill_tokens, chunked_prefill_size)). docs/scheduler.md.
    hybrid_prefill: run long prompts in chunks of hybrid_prefill_chunk_size tokens: a long
        prompt's peak activation memory drops, its scores stay the same
        (docs/hybrid_prefill.md). hybrid_prefill_mode "layer" (default): whole decoder
        layers in query chunks, only the residual stream and one layer's K/V whole
        (Llama / Qwen2 layers on CPU); "token": only the token-wise modules (MLPs, norms,
        rotary embeddings), attention whole. False: unchunked (for A/B runs). Chunk size
        default: mode layer cpu 1024, cuda 2048; mode token cpu 2048, cuda 4096.
    memory_budget: bytes (or "6GiB") for the scheduler's model, activations and KV pool
        together: the engine measures the peak memory of a max_prompt_tokens prompt once
        (saved per settings; minutes on CPU for long prompts), then sizes the pool (the
        prefix cache) to what is left (docs/hybrid_prefill.md). Instead of
        max_total_tokens. The plan is `engine.memory_plan`.
    max_prompt_tokens: the longest prompt the memory budget must fit (default: the longest
        the engine accepts, the context less the few tokens SGLang keeps back).
    **settings: the features' switches and options above (the feature registry,
        features/__init__.py, says which keywords are; config/runtime_config.py checks them
        together), and any other sglang ServerArgs field, passed through unchanged.

    The resolved configuration is ``engine.config`` (runtime_config.RuntimeConfig).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str | None = None,
        dtype: str = "auto",
        max_total_tokens: int | None = None,
        context_length: int | None = None,
        memory_budget: int | str | None = None,
        max_prompt_tokens: int | None = None,
        **settings,
    ) -> None:
        config, sglang_args = runtime_config.from_engine_args(
            model,
            device=device,
            dtype=dtype,
            max_total_tokens=max_total_tokens,
            context_length=context_length,
            memory_budget=memory_budget,
            max_prompt_tokens=max_prompt_tokens,
            **settings,
        )
        engine_lifecycle.warn_at_start(config)
        if config.memory is not None:
            config = config.planned(plan_memory(config))
        self._start(config, sglang_args)

    @classmethod
    def from_config(cls, config: RuntimeConfig, **sglang_args) -> Engine:
        """An engine of a resolved configuration (runtime_config.resolve), e.g. `serve`'s
        memory calibration; a configuration with an unplanned memory budget is planned."""
        if config.memory is not None and config.memory_plan is None:
            config = config.planned(plan_memory(config))
        engine = cls.__new__(cls)
        engine._start(config, sglang_args)
        return engine

    def _start(self, config: RuntimeConfig, sglang_args: dict) -> None:
        self.config = config
        self.model_path = config.model_path
        self.device = config.device
        self._lock = threading.Lock()
        self._sgl = None
        self._watch = None
        started = engine_lifecycle.start(self, config, sglang_args)
        self._sgl, self._watch, self._finalizer = started.sgl, started.watch, started.finalizer
        self.limits: ModelLimits = started.limits
        self._front = started.front

    @property
    def features(self) -> tuple[str, ...]:
        """The runtime features this engine runs with (features/__init__.py), in order."""
        return self.config.features

    @property
    def jct_settings(self) -> JctSettings | None:
        """The JCT scheduler's settings (its job-time model); None under SGLang's policies."""
        return self.config.settings("jct_scheduler")

    @property
    def hybrid_settings(self) -> HybridSettings | None:
        """Hybrid prefilling's chunk size and mode; None when it is off."""
        return self.config.settings("hybrid_prefill")

    @property
    def memory_plan(self) -> MemoryPlan | None:
        """How the memory budget was split (None without one)."""
        return self.config.memory_plan

    @property
    def model_family(self) -> str | None:
        """The model's family (prefillonly_sgl/models/families.py; docs/models.md), None when its
        architecture is outside the table."""
        return self.config.model_family

    def get_server_info(self) -> dict:
        """SGLang's Engine.get_server_info() (server arguments, the scheduler's start-up
        info), plus "prefillonly": the model family, the features running and the ones the
        family switched off with why ({feature: reason}); the server's /server_info has
        the same key. Its "decision_readout": how the model answers decisions (an LM head, or
        a decision checkpoint's own readout: decisions/checkpoints.py)."""
        info = dict(self._require_running().get_server_info())
        info["prefillonly"] = {**self.config.worker.info(), **self._front.facts.info()}
        return info

    @property
    def class_labels(self) -> tuple[str, ...] | None:
        """A model with a classification head: its classes in id order (the checkpoint's
        id2label), what each score row holds; None for a model that reads label tokens."""
        return self._front.facts.class_labels

    @property
    def image_placeholder(self) -> str | None:
        """How the served model marks an image in a prompt's text (its processor's
        placeholder, Qwen2.5-VL's "<|vision_start|><|image_pad|><|vision_end|>"); None for a
        model that reads text only (docs/images.md)."""
        placeholder = self._front.facts.image_placeholder
        return None if placeholder is None else placeholder.text

    @property
    def prefill_only_kv_active(self) -> bool:
        """Whether the scheduler drops scoring prompts' KV after the reusable prefix (it
        then reports a score-prompt limit of its own: the context, not the KV pool)."""
        return self.limits.max_scoring_prompt_tokens is not None

    # -- scoring -------------------------------------------------------------------------
    def score(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        label_token_ids: list[int | list[int]] | None = None,
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
        *,
        cache_salt: str | None = None,
        score_extraction_token: str | int | None = None,
        temperature: float = 1.0,
        return_token_logprobs: bool = False,
        embed_override_token_id: int | None = None,
        query_embed_overrides: list | None = None,
        item_embed_overrides: list | None = None,
        return_pooled_hidden_states: bool = False,
        lora_path: str | None = None,
        images=None,
        item_images=None,
    ) -> ScoreResult:
        """Probabilities of the labels after each query+item prompt (item+query with
        item_first). A label is a token id, or a list of token ids (a label of several
        tokens: the product of its tokens' conditional probabilities, the prompt computed
        once and each label prefix a cache hit of it; docs/labels.md).
        apply_softmax=True normalises over the labels; False gives each label's
        probability over everything the model could write (SGLang's meaning).
        length_normalize: a label's per-token (geometric mean) probability instead of
        the product, before normalising. The result also reads as SGLang's list of
        per-item rows (result[i], len, iter). cache_salt: the prefix-cache namespace of
        the call: it reuses (and reports as cached) only prefixes cached under the same
        salt (docs/server.md, "Tenants"). score_extraction_token: SGLang's setwise readout
        (a dedicated token's text or id): the labels are read at every occurrence of the
        token in each prompt, and each item's row is a matrix, one row per occurrence
        (several candidates or questions scored in one prefill; the query from the
        prefix cache where it is there; docs/server.md). temperature (with apply_softmax),
        return_token_logprobs (result.token_logprobs) and the embedding overrides are
        SGLang's score fields, passed through for labels of one token each
        (prefillonly_sgl/scoring/score_options.py says what each does). On a model with a
        classification head (``class_labels`` is not None): no label_token_ids; each item's
        row is the head's class scores in ``class_labels`` order (probabilities with
        apply_softmax; a reward model's one score needs apply_softmax=False), and
        return_pooled_hidden_states gives each item's hidden state under the head
        (docs/heads.md). lora_path: the LoRA adapter (a name loaded with
        ``enable_lora=True, lora_paths=[...]``) the call runs under: its prompts are
        computed with it, and read only prefixes cached under it (docs/lora.md).
        images / item_images (a vision-language model): the query's images, shared by
        every item (computed once, in the reusable prefix), and per item its own; each a
        path, URL, data URL, bytes or PIL image, placed at the text's image placeholders
        or first (docs/images.md)."""
        call = self.async_score(
            query,
            items,
            label_token_ids,
            apply_softmax,
            item_first,
            length_normalize,
            cache_salt=cache_salt,
            score_extraction_token=score_extraction_token,
            temperature=temperature,
            return_token_logprobs=return_token_logprobs,
            embed_override_token_id=embed_override_token_id,
            query_embed_overrides=query_embed_overrides,
            item_embed_overrides=item_embed_overrides,
            return_pooled_hidden_states=return_pooled_hidden_states,
            lora_path=lora_path,
            images=images,
            item_images=item_images,
        )
        return self.run_until_complete(call)

    async def async_score(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        label_token_ids: list[int | list[int]] | None = None,
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
        *,
        cache_salt: str | None = None,
        score_extraction_token: str | int | None = None,
        temperature: float = 1.0,
        return_token_logprobs: bool = False,
        embed_override_token_id: int | None = None,
        query_embed_overrides: list | None = None,
        item_embed_overrides: list | None = None,
        return_pooled_hidden_states: bool = False,
        lora_path: str | None = None,
        images=None,
        item_images=None,
    ) -> ScoreResult:
        """``score`` for asyncio code; must run on the event loop of the thread that
        created the engine (SGLang's tokenizer manager lives there): a RuntimeError
        otherwise, never a hang."""
        check_running_loop_is_served(self._require_running())
        ctx = _call_context(cache_salt, lora_path)
        image_data = None
        if images is not None or item_images is not None:
            placeholder = self._front.facts.image_placeholder
            query, items, image_data = await with_images_off_the_loop(
                query, items, images, item_images, placeholder, allow_paths=True
            )
        return await self._watch.until_died(
            self._front.score(
                ctx,
                query,
                items,
                label_token_ids,
                apply_softmax,
                item_first,
                length_normalize,
                score_extraction_token=score_extraction_token,
                options=ScoreOptions(
                    temperature,
                    return_token_logprobs,
                    embed_override_token_id,
                    query_embed_overrides,
                    item_embed_overrides,
                    return_pooled_hidden_states,
                    image_data,
                ),
            )
        )

    def continuation_logprobs(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        continuation: TextOrIds | list[TextOrIds],
        *,
        cache_salt: str | None = None,
        lora_path: str | None = None,
    ) -> ContinuationResult:
        """The log-probability of each token of ``continuation`` after each query+item
        prompt: one prefill per prompt (the query computed once and kept in the prefix
        cache), never one request per continuation token. continuation: one text (or
        token-id list) for every item, or one per item; text is tokenized on its own
        (no special tokens), after the prompt's tokens. ``result.means``: the mean per
        token (query likelihood's score); ``result.sums``: the continuation's
        log-probability (docs/reranking.md). cache_salt: as ``score``'s."""
        return self.run_until_complete(
            self.async_continuation_logprobs(
                query, items, continuation, cache_salt=cache_salt, lora_path=lora_path
            )
        )

    async def async_continuation_logprobs(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        continuation: TextOrIds | list[TextOrIds],
        *,
        cache_salt: str | None = None,
        lora_path: str | None = None,
    ) -> ContinuationResult:
        """``continuation_logprobs`` for asyncio code (on the engine's loop, as async_score)."""
        check_running_loop_is_served(self._require_running())
        ctx = _call_context(cache_salt, lora_path)
        return await self._watch.until_died(
            self._front.continuation_logprobs(ctx, query, items, continuation)
        )

    def decide(
        self,
        input,
        questions: list,
        *,
        model: str | None = None,
        cache_salt: str | None = None,
        lora_path: str | None = None,
        **options,
    ):
        """Typed questions about a state, each answered with every option's probability:
        OpenAI's /v1/decisions request (``input``: text or a list of messages; each
        question a dict: {"type": "predicate" | "choice" | "score", "instructions", ...};
        ``options``: debias, calibrate, min_label_mass, chat_template_kwargs) answered
        with what the server's /v1/decisions returns (wire.openai.Decision).
        The state is computed once for every question and stays in the prefix cache for
        the next call about it (docs/decisions.md), under the call's ``cache_salt`` and
        ``lora_path`` (as ``score``'s)."""
        return self.run_until_complete(
            self.async_decide(
                input,
                questions,
                model=model,
                cache_salt=cache_salt,
                lora_path=lora_path,
                **options,
            )  # fmt: skip
        )

    async def async_decide(
        self,
        input,
        questions: list,
        *,
        model: str | None = None,
        cache_salt: str | None = None,
        lora_path: str | None = None,
        **options,
    ):
        """``decide`` for asyncio code (on the engine's loop, as async_score)."""
        from prefillonly_sgl.decisions.bodies import parse
        from prefillonly_sgl.wire import openai as openai_wire

        check_running_loop_is_served(self._require_running())
        body = {"model": model or Path(str(self.model_path)).name, "input": input}
        request = parse(openai_wire.DecisionsRequest, {**body, "questions": questions, **options})
        call = openai_wire.to_call(request)
        ctx = _call_context(cache_salt, lora_path)
        outcome = await self._watch.until_died(self._front.decide(ctx, call))
        return openai_wire.to_response(request.model, outcome)

    def moderate(self, input, *, policies=None, categories=None, guard=None, threshold=0.5, **call):
        """A moderation call (docs/moderation.md): each input (a text, or a conversation:
        a list of {"role", "content"}; or a list of them) checked by the served guard
        model, its verdict and every category's probability read off the prefill.
        policies: a policy classifier's (any model) or Granite Guardian's risks;
        categories: the guard's categories to check (default: all); guard: the family,
        when the chat template does not say; threshold: the probability that flags
        (moderation/flags.py); `cache_salt`, `lora_path` as ``score``'s.
        Returns sglang_runtime.moderation_calls.ModerationOutcome."""
        return self.run_until_complete(
            self.async_moderate(
                input,
                policies=policies,
                categories=categories,
                guard=guard,
                threshold=threshold,
                **call,
            )  # fmt: skip
        )

    async def async_moderate(
        self, input, *, policies=None, categories=None, guard=None, threshold=0.5,
        cache_salt=None, lora_path=None,
    ):  # fmt: skip
        """``moderate`` for asyncio code (on the engine's loop, as async_score)."""
        from prefillonly_sgl.moderation.moderation_call import ModerationCall
        from prefillonly_sgl.sglang_runtime.moderation_calls import moderate

        check_running_loop_is_served(self._require_running())
        call = ModerationCall.of(input, policies, categories, guard, threshold)
        ctx = _call_context(cache_salt, lora_path)
        return await self._watch.until_died(moderate(self._front, ctx, call))

    async def async_decide_call(
        self, call, cache_salt: str | None = None, lora_path: str | None = None
    ):
        """A decisions.call.DecisionCall's outcome (what the DSL's decision functions send)."""
        check_running_loop_is_served(self._require_running())
        ctx = _call_context(cache_salt, lora_path)
        return await self._watch.until_died(self._front.decide(ctx, call))

    def run_until_complete(self, coroutine):
        """Run a coroutine that awaits this engine (``async_score``, a DSL job) to the end
        from synchronous code, on the engine's event loop, as SGLang's own Engine.score
        does."""
        try:
            loop = self._require_running().loop
        except EngineClosedError:
            coroutine.close()  # never awaited: no "coroutine was never awaited" warning
            raise
        # Any coroutine that awaits SGLang (a DSL job, verify's echo request) must not wait
        # forever on a dead worker.
        return run_to_end(loop, self._watch.until_died(coroutine))

    # -- LoRA adapters (docs/lora.md) ----------------------------------------------------
    def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False):
        """Load a LoRA adapter on the running engine (started with enable_lora=True) under
        ``lora_name``, the name ``score(..., lora_path=...)`` then takes: SGLang's
        load_lora_adapter, its answer returned (``success``, ``error_message``)."""
        from prefillonly_sgl.sglang_runtime.lora_adapters import load_adapter

        return self.run_until_complete(
            load_adapter(self.tokenizer_manager, lora_name, lora_path, pinned)
        )

    def unload_lora_adapter(self, lora_name: str):
        """Unload the adapter ``lora_name`` (SGLang's unload_lora_adapter, after the
        requests using it finish); its answer returned."""
        from prefillonly_sgl.sglang_runtime.lora_adapters import unload_adapter

        return self.run_until_complete(unload_adapter(self.tokenizer_manager, lora_name))

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer SGLang uses for text prompts."""
        return self.tokenizer_manager.tokenizer

    @property
    def tokenizer_manager(self):
        """SGLang's TokenizerManager of this engine, as on SGLang's own Engine (code and
        tests written against SGLang's Engine reach it there)."""
        return self._require_running().tokenizer_manager

    # -- lifecycle -----------------------------------------------------------------------
    def _require_running(self):
        if self._sgl is None:
            raise EngineClosedError("this Engine has been shut down; create a new one")
        if self._watch.death is not None:
            # A worker died (WorkerWatch stopped the rest): SGLang would never answer.
            raise EngineDiedError(self._watch.death)
        return self._sgl

    def shutdown(self) -> None:
        """Stop SGLang's worker processes. Idempotent."""
        with self._lock:
            if self._sgl is None:
                return
            self._sgl = None
            self._finalizer()
            atexit.unregister(self._finalizer)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "running" if self._sgl is not None else "shut down"
        return f"Engine(model={self.model_path!r}, device={self.device!r}, {state})"


def _call_context(cache_salt: str | None, lora_path: str | None) -> CallContext:
    """An Engine call's context (scoring/call_context.py): the caller's (the DSL's
    `with cache_salt(...)`, a batch job's) with this call's own salt and adapter where
    given; InvalidRequestError naming a bad one."""
    return current().entering(salt=cache_salt, adapter=lora_path)


def plan_memory(config: RuntimeConfig) -> MemoryPlan:
    """The KV pool the configuration's memory budget leaves (memory/measurement.py),
    measured if needed with an engine of the same configuration and a small pool: what
    Engine(memory_budget=) and `serve --memory-budget` start with."""
    return engine_lifecycle.plan_memory(config, Engine.from_config)

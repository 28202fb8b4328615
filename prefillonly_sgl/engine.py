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
The scoring itself is sglang_runtime/score_front.py, shared with the HTTP server.
"""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from pathlib import Path

from prefillonly_sgl.device_defaults import detect_device, sglang_engine_args
from prefillonly_sgl.errors import EngineClosedError
from prefillonly_sgl.features import engine_features, reads_reusable_len
from prefillonly_sgl.hybrid.settings import HYBRID_SETTINGS_ENV, HybridSettings
from prefillonly_sgl.memory.budget import MemoryPlan, parse_size
from prefillonly_sgl.scheduler.settings import (
    JCT_POLICY,
    JCT_SETTINGS_ENV,
    JctSettings,
    resolve_settings,
)
from prefillonly_sgl.score_result import ScoreResult
from prefillonly_sgl.validation import ModelLimits, TextOrIds

# Engine(model, **STOCK_SGLANG): SGLang as it ships, every runtime feature off (A/B runs).
STOCK_SGLANG = dict(
    prefill_only_attention=False,
    prefill_only_kv=False,
    schedule_policy="fcfs",
    hybrid_prefill=False,
)


class Engine:
    """A running SGLang engine for scoring. Start-up takes ~15 s on CPU (worker processes
    import SGLang), so create one and reuse it; ``shutdown()`` (or ``with``) stops every
    process it started.

    model: a Hugging Face model folder (Llama / Qwen2 families), or None for the embedded
        default model (SmolLM2-135M-Instruct, converted once into the user cache).
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
    hybrid_prefill: run long prompts in chunks of hybrid_prefill_chunk_size tokens: a long
        prompt's peak activation memory drops, its scores stay the same
        (docs/hybrid_prefill.md). hybrid_prefill_mode "layer" (default): whole decoder
        layers in query chunks, only the residual stream and one layer's K/V whole
        (Llama / Qwen2 layers on CPU); "token": only the token-wise modules (MLPs, norms,
        rotary embeddings), attention whole. False: unchunked (for A/B runs). Chunk size
        default: cpu 2048, cuda 4096.
    memory_budget: bytes (or "6GiB") for the scheduler's model, activations and KV pool
        together: the engine measures the peak memory of a max_prompt_tokens prompt once
        (saved per settings; minutes on CPU for long prompts), then sizes the pool (the
        prefix cache) to what is left (docs/hybrid_prefill.md). Instead of
        max_total_tokens. The plan is `engine.memory_plan`.
    max_prompt_tokens: the longest prompt the memory budget must fit (default: the longest
        the engine accepts, the context less the few tokens SGLang keeps back).
    **sglang_args: any other sglang ServerArgs field, passed through unchanged.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str | None = None,
        dtype: str = "auto",
        max_total_tokens: int | None = None,
        context_length: int | None = None,
        prefill_only_attention: bool = True,
        prefill_only_kv: bool | None = None,
        schedule_policy: str = JCT_POLICY,
        jct_aging: float | None = None,
        jct_profile: str | Path | None = None,
        hybrid_prefill: bool = True,
        hybrid_prefill_chunk_size: int | None = None,
        hybrid_prefill_mode: str | None = None,
        memory_budget: int | str | None = None,
        max_prompt_tokens: int | None = None,
        **sglang_args,
    ) -> None:
        from prefillonly_sgl.sglang_runtime.offline_engine import (
            read_limits,
            shutdown_sglang_engine,
            start_sglang_engine,
        )
        from prefillonly_sgl.sglang_runtime.plugin import patches_enabled
        from prefillonly_sgl.sglang_runtime.score_front import ScoringFront

        if model is None:
            from prefillonly_sgl.models.default_model import default_model_path

            model = default_model_path()
        self.model_path = str(model)
        if not Path(self.model_path).is_dir():
            raise FileNotFoundError(f"model folder not found: {self.model_path}")
        self.device = device or detect_device()
        jct = schedule_policy == JCT_POLICY
        if not jct and (jct_aging is not None or jct_profile is not None):
            raise ValueError(
                f"jct_aging / jct_profile apply to schedule_policy={JCT_POLICY!r}, "
                f"not {schedule_policy!r}"
            )
        if not hybrid_prefill and hybrid_prefill_chunk_size is not None:
            raise ValueError("hybrid_prefill_chunk_size applies to hybrid_prefill=True")
        if not hybrid_prefill and hybrid_prefill_mode is not None:
            raise ValueError("hybrid_prefill_mode applies to hybrid_prefill=True")
        # Runtime patches reach SGLang's worker processes through the environment.
        self.runtime_patches: tuple[str, ...] = tuple(
            engine_features(prefill_only_attention, prefill_only_kv, jct, hybrid_prefill)
        )
        # The scheduler's settings (its job-time model): None under SGLang's policies.
        self.jct_settings: JctSettings | None = None
        environment = {}
        # Hybrid prefilling's chunk size (None when it is off).
        self.hybrid_settings: HybridSettings | None = None
        if hybrid_prefill:
            self.hybrid_settings = HybridSettings.for_device(
                self.device, hybrid_prefill_chunk_size, hybrid_prefill_mode
            )
            environment[HYBRID_SETTINGS_ENV] = self.hybrid_settings.to_env()
        if jct:
            self.jct_settings = resolve_settings(
                self.model_path, self.device, dtype, self.runtime_patches, jct_aging, jct_profile
            )
            environment[JCT_SETTINGS_ENV] = self.jct_settings.to_env()
        self._lock = threading.Lock()
        self._sgl = None
        # How the memory budget was split (None without one).
        self.memory_plan: MemoryPlan | None = None
        if memory_budget is not None:
            if max_total_tokens is not None:
                raise ValueError("give memory_budget or max_total_tokens, not both")
            settings = dict(
                device=self.device,
                dtype=dtype,
                context_length=context_length,
                prefill_only_attention=prefill_only_attention,
                prefill_only_kv=prefill_only_kv,
                schedule_policy=schedule_policy,
                jct_aging=jct_aging,
                jct_profile=jct_profile,
                hybrid_prefill=hybrid_prefill,
                hybrid_prefill_chunk_size=hybrid_prefill_chunk_size,
                hybrid_prefill_mode=hybrid_prefill_mode,
                **sglang_args,
            )
            self.memory_plan = plan_memory(
                memory_budget,
                max_prompt_tokens,
                model_path=self.model_path,
                features=self.runtime_patches,
                chunk_size=self.hybrid_settings.chunk_size if self.hybrid_settings else None,
                hybrid_mode=self.hybrid_settings.mode if self.hybrid_settings else None,
                engine_settings=settings,
            )
            max_total_tokens = self.memory_plan.pool_tokens
            if self.device == "cuda":
                # SGLang caps the pool at its own profile (free memory minus a reserve of
                # 1 - mem_fraction_static): a high fraction leaves the budget's pool as the
                # cap, since the reserve for activations is in the plan already.
                sglang_args.setdefault("mem_fraction_static", 0.95)
        elif max_prompt_tokens is not None:
            raise ValueError("max_prompt_tokens applies with a memory_budget")
        args = sglang_engine_args(
            self.model_path,
            self.device,
            dtype=dtype,
            max_total_tokens=max_total_tokens,
            context_length=context_length,
            # The JCT policy replaces SGLang's inside its scheduler (FCFS underneath).
            schedule_policy="fcfs" if jct else schedule_policy,
            **sglang_args,
        )
        if reads_reusable_len(self.runtime_patches):
            from prefillonly_sgl.sglang_runtime import reusable_prefix

            reusable_prefix.install_in_this_process()
        with patches_enabled(list(self.runtime_patches), environment):
            self._sgl, owned_processes = start_sglang_engine(args)
        # An Engine the user forgets to shut down must not leave SGLang processes behind.
        self._finalizer = weakref.finalize(
            self, _shutdown_quietly, shutdown_sglang_engine, self._sgl, owned_processes
        )
        self.limits: ModelLimits = read_limits(self._sgl)
        self._front = ScoringFront(self._sgl.tokenizer_manager, self.limits)
        atexit.register(self._finalizer)
        if "prefill_kv" in self.runtime_patches and not self.prefill_only_kv_active:
            # A warning, not a log line: SGLang sets the root logger to its log level
            # ("error" by default) in this process.
            warnings.warn(
                "prefill-only KV was requested but SGLang's scheduler did not enable it for "
                "this model / backend (its log says why, at level warning): score prompts "
                "keep KV for every token and are bounded by the KV pool",
                RuntimeWarning,
                stacklevel=2,
            )

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
        label_token_ids: list[int | list[int]],
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
    ) -> ScoreResult:
        """Probabilities of the labels after each query+item prompt (item+query with
        item_first). A label is a token id, or a list of token ids (a label of several
        tokens: the product of its tokens' conditional probabilities, the prompt computed
        once and each label prefix a cache hit of it; docs/labels.md).
        apply_softmax=True normalises over the labels; False gives each label's
        probability over everything the model could write (SGLang's meaning).
        length_normalize: a label's per-token (geometric mean) probability instead of
        the product, before normalising. The result also reads as SGLang's list of
        per-item rows (result[i], len, iter)."""
        sgl = self._require_running()
        call = self._front.score(
            query, items, label_token_ids, apply_softmax, item_first, None, length_normalize
        )
        return sgl.loop.run_until_complete(call)  # what SGLang's own Engine.score does

    async def async_score(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        label_token_ids: list[int | list[int]],
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
    ) -> ScoreResult:
        """``score`` for asyncio code; must run on the event loop of the thread that
        created the engine (SGLang's tokenizer manager lives there): a RuntimeError
        otherwise, never a hang."""
        from prefillonly_sgl.sglang_runtime.event_loop import check_running_loop_is_served

        check_running_loop_is_served(self._require_running())
        return await self._front.score(
            query, items, label_token_ids, apply_softmax, item_first, None, length_normalize
        )

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer SGLang uses for text prompts."""
        return self._require_running().tokenizer_manager.tokenizer

    # -- lifecycle -----------------------------------------------------------------------
    def _require_running(self):
        if self._sgl is None:
            raise EngineClosedError("this Engine has been shut down; create a new one")
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


def _shutdown_quietly(shutdown, sgl_engine, owned_processes) -> None:
    try:
        shutdown(sgl_engine, owned_processes)
    except Exception:  # interpreter teardown: the processes are being killed anyway
        pass


def plan_memory(
    budget: int | str,
    max_prompt_tokens: int | None,
    *,
    model_path: str,
    features,
    chunk_size: int | None,
    engine_settings: dict,
    hybrid_mode: str | None = None,
) -> MemoryPlan:
    """The KV pool a memory budget leaves (memory/calibration.py), measured if needed with
    an Engine(model_path, **engine_settings) of a small pool: what Engine(memory_budget=)
    and `serve --memory-budget` start with."""
    from prefillonly_sgl.memory import calibration

    return calibration.plan(
        parse_size(budget),
        lambda pool: Engine(model_path, max_total_tokens=pool, **engine_settings),
        model_path=model_path,
        device=engine_settings["device"],
        dtype=engine_settings["dtype"],
        features=features,
        chunk_size=chunk_size,
        hybrid_mode=hybrid_mode,
        max_prompt_tokens=max_prompt_tokens,
        context_length=engine_settings["context_length"],
    )

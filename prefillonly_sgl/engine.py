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
from prefillonly_sgl.scheduler.settings import (
    JCT_POLICY,
    SETTINGS_ENV,
    JctSettings,
    resolve_settings,
)
from prefillonly_sgl.score_result import ScoreResult
from prefillonly_sgl.validation import ModelLimits, TextOrIds


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
        # Runtime patches reach SGLang's worker processes through the environment.
        self.runtime_patches: tuple[str, ...] = tuple(
            engine_features(prefill_only_attention, prefill_only_kv, jct)
        )
        # The scheduler's settings (its job-time model): None under SGLang's policies.
        self.jct_settings: JctSettings | None = None
        environment = {}
        if jct:
            self.jct_settings = resolve_settings(
                self.model_path, self.device, dtype, self.runtime_patches, jct_aging, jct_profile
            )
            environment[SETTINGS_ENV] = self.jct_settings.to_env()
        self._lock = threading.Lock()
        self._sgl = None
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
        label_token_ids: list[int],
        apply_softmax: bool = True,
        item_first: bool = False,
    ) -> ScoreResult:
        """Probabilities of ``label_token_ids`` at the last position of each query+item
        prompt (item+query with item_first). apply_softmax=True normalises over the labels;
        False gives each label's probability over the whole vocabulary (SGLang's meaning).
        The result also reads as SGLang's list of per-item rows (result[i], len, iter)."""
        sgl = self._require_running()
        call = self._front.score(query, items, label_token_ids, apply_softmax, item_first)
        return sgl.loop.run_until_complete(call)  # what SGLang's own Engine.score does

    async def async_score(
        self,
        query: TextOrIds | None,
        items: list[TextOrIds] | TextOrIds,
        label_token_ids: list[int],
        apply_softmax: bool = True,
        item_first: bool = False,
    ) -> ScoreResult:
        """``score`` for asyncio code; must run on the event loop of the thread that
        created the engine (SGLang's tokenizer manager lives there): a RuntimeError
        otherwise, never a hang."""
        from prefillonly_sgl.sglang_runtime.event_loop import check_running_loop_is_served

        check_running_loop_is_served(self._require_running())
        return await self._front.score(query, items, label_token_ids, apply_softmax, item_first)

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

"""Prefill-only KV: a scoring request keeps pool KV only for its reusable prefix.

Plugin feature "prefill_kv" (see plugin.py). Which tokens keep KV is decided by
prefillonly_sgl/kv/policy.py; this module carries that decision through SGLang:

1. Tokenizer process. `score_request` is wrapped to tokenize the query once per call;
   `_create_tokenized_object` (one call per prompt) then stores the reusable-prefix length
   R = common prefix of (query tokens, prompt tokens) in the request's
   `SamplingParams.custom_params` (SGLang's per-request JSON dict, serialised with the
   request), under policy.REUSABLE_LEN_KEY. Requests without it (generate requests, also
   with max_new_tokens=0) stay stock.
2. Scheduler, length check. `validate_input_length` lets such a request be as long as the
   model's context (the stock limit is also bounded by the KV pool) and clamps R below the
   pool's capacity (R only decides what is kept; a smaller R is always correct).
3. Scheduler, admission. `PrefillAdder.add_one_req` charges the pool budget only for the
   kept tokens, and never chunks such a request (a later chunk would read the earlier
   chunks' KV from the pool): one that does not fit the chunk budget runs alone, as the
   first request of a batch. Its length is bounded by activation memory, not the pool.
4. Scheduler, allocation. `alloc_for_extend` allocates real slots only for kept tokens;
   the dropped ones get slot 0, which SGLang's allocator never hands out (it is the dummy
   slot padded tokens write to). Their `req_to_token` entries are 0 and the request's
   `kv_committed_len` / `kv_allocated_len` end at the kept boundary, so the stock
   `release_kv_cache` inserts only [0, boundary) into the radix cache and frees only real
   slots.
5. Attention never reads the dropped tokens from the pool: the prefill-only backends take
   new tokens' k/v from the layer's hands (prefill_attention.py on CPU; FlashInfer's
   ragged prefill on GPU, prefill_attention_gpu.py) and read only the cached prefix,
   which is always real. Writes of dropped rows land in slot 0. This feature therefore
   requires "prefill_attention" (the Engine enforces it).

Active only where this is known to hold, decided once per scheduler (get_worker_info):
the plain token allocator with page size 1, not a dLLM, and a prefill attention backend
whose `prefill_only_kv_unsupported()` says None (ours: torch_native without sliding
windows; FlashInfer whenever it always plans the ragged prefill). Elsewhere every request
is stock, with a warning in the log saying why.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from dataclasses import dataclass

import torch

from prefillonly_sgl.kv.policy import (
    REUSABLE_LEN_KEY,
    dropped_new_tokens,
    kept_new_tokens,
    reusable_prefix_len,
    slot_mask,
)

logger = logging.getLogger(__name__)

# Tokenizer process, per asyncio task: the query token ids of the score call being
# tokenized ([] when nothing is reusable); None outside score calls.
_QUERY_IDS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "prefillonly_query_ids", default=None
)


@dataclass(frozen=True)
class _Layout:
    """Scheduler: the slot layout alloc_for_extend is allocating right now."""

    num_tokens: int
    kept: list[int]
    extend_lens: list[int]


_LAYOUT: contextvars.ContextVar[_Layout | None] = contextvars.ContextVar(
    "prefillonly_slot_layout", default=None
)


@dataclass
class _SchedulerProcess:
    """Scheduler process: set once from the worker (get_worker_info), before requests."""

    active: bool = False  # this engine's pool and attention backend are supported
    prefill_only_max_input_len: int | None = None
    inactive_because: str | None = None


_PROCESS = _SchedulerProcess()


def active_in_this_process() -> bool:
    """Whether this (scheduler) process drops scoring requests' suffix KV."""
    return _PROCESS.active


# -- tokenizer process -------------------------------------------------------------------
async def _score_request(original, self, *args, **kwargs):
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    token = _QUERY_IDS.set(_query_ids(self, bound.arguments))
    try:
        return await original(*bound.args, **bound.kwargs)
    finally:
        _QUERY_IDS.reset(token)


def _query_ids(tokenizer_manager, arguments: dict) -> list[int]:
    query = arguments.get("query")
    if arguments.get("item_first") or not query:
        return []  # the item comes first, or there is no query: nothing reusable
    if any(
        arguments.get(name) is not None
        for name in (
            "query_embed_overrides",
            "item_embed_overrides",
            "stacked_query_item_embed_overrides",
        )
    ):
        return []
    if isinstance(query, str):
        if tokenizer_manager.tokenizer is None:
            return []
        # Tokenized as SGLang tokenizes the prompt (special tokens included).
        return list(tokenizer_manager.tokenizer.encode(query))
    return list(query)


def _after_create_tokenized_object(result, *args, **kwargs):
    """Stores R in every prompt of a score call (0 when nothing is reusable)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

    query_ids = _QUERY_IDS.get()
    if query_ids is None or not isinstance(result, TokenizedGenerateReqInput):
        return result
    params = result.sampling_params
    if result.input_ids is None or params.max_new_tokens != 0:
        return result
    custom = dict(params.custom_params or {})
    custom[REUSABLE_LEN_KEY] = reusable_prefix_len(query_ids, result.input_ids)
    params.custom_params = custom
    return result


# -- scheduler process: which requests, how long -----------------------------------------
def reusable_len(req) -> int | None:
    """R of a prefill-only scoring request; None for every other request (stock), and
    for all requests where the pool or the attention backend is not supported."""
    if not _PROCESS.active or not req.is_prefill_only:
        return None
    custom = req.sampling_params.custom_params
    if not isinstance(custom, dict) or REUSABLE_LEN_KEY not in custom:
        return None
    return int(custom[REUSABLE_LEN_KEY])


def _after_get_worker_info(result, self, *args, **kwargs):
    runner = self.model_runner
    _PROCESS.inactive_because = _unsupported_here(self, runner)
    _PROCESS.active = _PROCESS.inactive_because is None
    if _PROCESS.active:
        # The eager runner copies every forward's inputs into static buffers sized for the
        # longest forward stock SGLang can run: max(pool, chunked_prefill_size, ...). An
        # unchunked scoring prompt can be longer than both; SGLang's own switch makes it
        # use the live tensors instead (such forwards never fit a CUDA graph anyway).
        from sglang.srt.environ import envs

        envs.SGLANG_EAGER_INPUT_NO_COPY.set(True)
    else:
        logger.warning(
            "prefillonly: prefill-only KV is off in this scheduler (%s): scoring requests "
            "keep KV for every token, as in stock SGLang",
            _PROCESS.inactive_because,
        )
    context_len = self.model_config.context_len
    table_len = runner.req_to_token_pool.max_context_len
    # Same margins as the stock limit (TpModelWorker.get_worker_info), minus the pool bound.
    _PROCESS.prefill_only_max_input_len = min(context_len - 1, table_len - 1) - 5
    return result


def _unsupported_here(worker, runner) -> str | None:
    """Why this scheduler cannot drop suffix KV (None: it can). The pool must be the plain
    token allocator with page size 1 (slot 0 is its never-allocated dummy slot), and the
    prefill attention backend must say it never reads new tokens back from the pool."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    allocator = runner.token_to_kv_pool_allocator
    if type(allocator) is not TokenToKVPoolAllocator or allocator.page_size != 1:
        return f"KV allocator {type(allocator).__name__} (page size {allocator.page_size})"
    if worker.is_dllm():
        return "dLLM models are not handled"
    backend = runner.attn_backend
    backend = getattr(backend, "prefill_backend", backend)  # HybridAttnBackend: prefill side
    check = getattr(backend, "prefill_only_kv_unsupported", None)
    if check is None:  # stock backends read new tokens back from the pool
        return f"attention backend {type(backend).__name__} is not prefillonly's"
    return check()


# Key of the scheduler's init info (SGLang's ready handshake, `Scheduler.get_init_info`):
# the longest score prompt + 1 (SGLang's "refuse len >= limit" form), present only in a
# scheduler where this feature is active. The Engine and the server read their validation
# limit from it (model_limits.py), so they never guess whether the feature is on.
SCHEDULER_INFO_KEY = "prefillonly_max_scoring_input_len"


def _after_get_init_info(result, self, *args, **kwargs):
    if _PROCESS.active and _PROCESS.prefill_only_max_input_len is not None:
        result = dict(result)
        result[SCHEDULER_INFO_KEY] = max(
            int(self.max_req_input_len), _PROCESS.prefill_only_max_input_len
        )
    return result


def _validate_input_length(original, req, max_req_input_len, allow_auto_truncate):
    r = reusable_len(req)
    if r is None or _PROCESS.prefill_only_max_input_len is None:
        return original(req, max_req_input_len, allow_auto_truncate)
    # The kept prefix must fit the pool (max_req_input_len is the stock, pool-bound limit).
    if r >= max_req_input_len:
        req.sampling_params.custom_params[REUSABLE_LEN_KEY] = max(0, max_req_input_len - 1)
    return original(
        req, max(max_req_input_len, _PROCESS.prefill_only_max_input_len), allow_auto_truncate
    )


# -- scheduler process: admission --------------------------------------------------------
class _KeptTokensBudget:
    """The adder's PrefillBudget, charging one request only for the tokens it keeps."""

    def __init__(self, inner, req, reusable: int) -> None:
        self._inner = inner
        self._req = req
        self._reusable = reusable

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def check_prefill(self, *, extend_input_len, total_tokens, chunk_limit, **kwargs):
        total_len = len(self._req.full_untruncated_fill_ids)
        if chunk_limit is None or extend_input_len <= chunk_limit:
            total_tokens -= dropped_new_tokens(
                total_len - extend_input_len, extend_input_len, total_len, self._reusable
            )
        return self._inner.check_prefill(
            extend_input_len=extend_input_len,
            total_tokens=total_tokens,
            chunk_limit=chunk_limit,
            **kwargs,
        )

    def reserve(self, extend_input_len, max_new_tokens, **kwargs):
        total_len = len(self._req.full_untruncated_fill_ids)
        extend_input_len -= dropped_new_tokens(
            self._req.prefix_len, extend_input_len, total_len, self._reusable
        )
        return self._inner.reserve(extend_input_len, max_new_tokens, **kwargs)


def _add_one_req(original, self, req, has_chunked_req, truncation_align_size):
    from sglang.srt.managers.schedule_policy import AddReqResult
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    r = reusable_len(req)
    if r is None or self.page_size != 1 or type(self.memory_budget) is not PrefillBudget:
        return original(self, req, has_chunked_req, truncation_align_size)
    remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
    chunk_budget = self.rem_chunk_tokens
    unchunked = chunk_budget is not None and remaining > chunk_budget
    if unchunked and self.can_run_list:
        return AddReqResult.OTHER  # too long to share a batch: it goes first next time
    budget = self.memory_budget
    self.memory_budget = _KeptTokensBudget(budget, req, r)
    if unchunked:
        self.rem_chunk_tokens = None  # never chunked: later chunks would read the pool
    try:
        result = original(self, req, has_chunked_req, truncation_align_size)
    finally:
        self.memory_budget = budget
        if unchunked:
            self.rem_chunk_tokens = chunk_budget
    if unchunked and self.can_run_list and self.can_run_list[-1] is req:
        self.rem_chunk_tokens = chunk_budget - remaining  # <= 0: the batch is full
        return AddReqResult.OTHER
    return result


# -- scheduler process: allocation -------------------------------------------------------
def _kept_per_request(batch) -> list[int] | None:
    if not _PROCESS.active or batch.is_dllm():
        return None
    kept = []
    for req, prefix_len, extend_len in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
        r = reusable_len(req)
        total_len = len(req.full_untruncated_fill_ids)
        kept.append(
            extend_len if r is None else kept_new_tokens(prefix_len, extend_len, total_len, r)
        )
    if kept == list(batch.extend_lens):
        return None
    return kept


def _alloc_for_extend(original, batch):
    kept = _kept_per_request(batch)
    if kept is None:
        return original(batch)
    token = _LAYOUT.set(_Layout(batch.extend_num_tokens, kept, list(batch.extend_lens)))
    try:
        result = original(batch)
    finally:
        _LAYOUT.reset(token)
    for req, prefix_len, n_kept, n_new in zip(
        batch.reqs, batch.prefix_lens, kept, batch.extend_lens
    ):
        if n_kept < n_new:
            # The row holds real slots only up to here; release_kv_cache caches and
            # frees [0, boundary) and never touches the slot-0 entries after it.
            boundary = prefix_len + n_kept
            req.kv.kv_committed_len = boundary
            req.kv.kv_allocated_len = boundary
    return result


def _alloc_token_slots(original, tree_cache, num_tokens, *args, **kwargs):
    layout = _LAYOUT.get()
    if layout is None or layout.num_tokens != num_tokens:
        return original(tree_cache, num_tokens, *args, **kwargs)
    allocator = tree_cache.token_to_kv_pool_allocator
    n_real = sum(layout.kept)
    out = torch.zeros(num_tokens, dtype=torch.int64, device=allocator.device)  # slot 0
    if n_real:
        real = original(tree_cache, n_real, *args, **kwargs)
        mask = torch.tensor(slot_mask(layout.kept, layout.extend_lens), dtype=torch.bool)
        out = out.to(real.dtype)
        out[mask.to(out.device)] = real
    return out


# -- registration ------------------------------------------------------------------------
HOOKS = {
    "sglang.srt.managers.tokenizer_manager_score_mixin.TokenizerManagerScoreMixin"
    ".score_request": _score_request,
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object": (
        _after_create_tokenized_object
    ),
    "sglang.srt.managers.tp_worker.TpModelWorker.get_worker_info": _after_get_worker_info,
    "sglang.srt.managers.scheduler.Scheduler.get_init_info": _after_get_init_info,
    "sglang.srt.managers.utils.validate_input_length": _validate_input_length,
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": _add_one_req,
    "sglang.srt.mem_cache.allocation.alloc_for_extend": _alloc_for_extend,
    "sglang.srt.mem_cache.allocation.alloc_token_slots": _alloc_token_slots,
}
_AFTER = {
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
    "sglang.srt.managers.tp_worker.TpModelWorker.get_worker_info",
    "sglang.srt.managers.scheduler.Scheduler.get_init_info",
}


_registered = False


def register() -> None:
    """Plugin feature "prefill_kv": registers the hooks above with SGLang's HookRegistry
    (applied by SGLang right after the plugins load, in every process). Idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AFTER if target in _AFTER else HookType.AROUND)


def install_in_this_process() -> None:
    """Registers and applies the hooks in the calling process now.

    SGLang loads plugins once per process (`load_plugins` is guarded), so when a process
    first starts a stock engine and then one with prefill_kv, the plugin never runs again
    in that process and the tokenizer hooks (which live in the process that starts the
    engine) would be missing; the Engine calls this before starting SGLang. The hooks then
    stay for later engines of this process too: a stock engine's requests carry the
    reusable length in custom_params, which its scheduler (without our hooks) ignores.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    register()
    HookRegistry.apply_hooks()  # idempotent: already-patched targets are skipped

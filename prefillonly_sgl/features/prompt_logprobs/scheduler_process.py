"""Prompt logprobs through the prefix cache, scheduler side (plugin feature
"prompt_logprobs"; the plain decisions are plan.py and table.py).

Stock SGLang caps a request's prefix-cache match at its logprob_start_len, which is 0 for
echo requests: every one recomputes its whole prompt. Here, for a request that
caches_prompt_logprobs (echo, top-k <= 20, max_new_tokens 0 or 1):

- match (AROUND Req.init_next_round_input): the match runs uncapped; the side table says
  how many of the matched positions hold entries (L, plan.table_positions), the request
  copies those entries and extends from position L: its logprob_start_len becomes L, so
  SGLang's own chunked prefill, admission and input-logprob code compute positions L..T-1
  and nothing before. A request that finds no entries is stock (L = 0).
- result (BEFORE release_kv_cache: the request's KV slots; AROUND
  SchedulerLogprobResultProcessor.add_input_logprob_return_values, last chunk): its
  computed entries go into the table rows of its KV slots, the copied ones
  are spliced in front (plan.splice) and logprob_start_len is 0 again, so the response
  is the whole prompt's, as SGLang's OpenAI layer expects for echo.
- invalidation (AFTER TokenToKVPoolAllocator.alloc): a slot handed out again holds other
  KV; its row is marked invalid. Nothing else frees slots to new owners (flush_cache
  resets the allocator, whose slots are then handed out by alloc).
- chunks (AFTER InputLogprobProcessor.__init__): input logprobs are computed
  `chunk_size` positions at a time (SGLang's chunked path, chunk 2048 in stock).

Active only where the table's keys are sound: SGLang's radix caches (UnifiedRadixCache,
its default, or RadixCache) on device only, over the plain token allocator with page size
1 (a matched prefix's slots are its KV: prefix_device_indices); elsewhere stock, with a
warning. Requests that do not ask for prompt logprobs never reach the table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prefillonly_sgl.features.prefill_kv.policy import DROPPED_SLOT
from prefillonly_sgl.features.prompt_logprobs.plan import (
    caches_prompt_logprobs,
    splice,
    table_positions,
)
from prefillonly_sgl.features.prompt_logprobs.table import CachedRows, PositionTable
from prefillonly_sgl.hooking import process_state

logger = logging.getLogger(__name__)

FEATURE = "prompt_logprobs"
# On a Req: the top-k of a request served through the table (absent: stock), and the
# entries it copied at its match.
_TOP_K_ATTR = "_prefillonly_prompt_logprob_k"
_ROWS_ATTR = "_prefillonly_prompt_logprob_rows"
_SLOTS_ATTR = "_prefillonly_prompt_logprob_slots"  # its prompt's KV slots, at release


@dataclass
class _Cache:
    tree_cache: object
    table: PositionTable


_CACHE: _Cache | None = None
_INACTIVE: set[str] = set()  # reasons already logged


def _settings():
    return process_state.current().settings(FEATURE)


def _cache_for(tree_cache) -> _Cache | None:
    """The table of this scheduler's pool (made on the first echo request), or None where
    the pool or the tree is not one the table can key."""
    global _CACHE
    if _CACHE is not None and _CACHE.tree_cache is tree_cache:
        return _CACHE
    why = _unsupported(tree_cache)
    if why is not None:
        if why not in _INACTIVE:
            _INACTIVE.add(why)
            logger.warning("prefillonly: prompt logprobs are not cached here (%s)", why)
        return None
    allocator = tree_cache.token_to_kv_pool_allocator
    table = PositionTable(allocator.size + 1, device=allocator.device)
    _CACHE = _Cache(tree_cache, table)
    logger.info("prefillonly: prompt-logprob table for %d pool slots", allocator.size)
    return _CACHE


def _unsupported(tree_cache) -> str | None:
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    if type(tree_cache) not in (RadixCache, UnifiedRadixCache):
        return f"prefix cache {type(tree_cache).__name__}"
    if getattr(tree_cache, "disable", False):
        return "prefix cache disabled"
    # Host tiers and external linkers hand out prefixes whose device slots are new.
    if getattr(tree_cache, "cache_controller", None) is not None:
        return "hierarchical prefix cache"
    if getattr(tree_cache, "linker", None) is not None:
        return "prefix cache with an external linker"
    allocator = tree_cache.token_to_kv_pool_allocator
    if type(allocator) is not TokenToKVPoolAllocator or allocator.page_size != 1:
        return f"KV allocator {type(allocator).__name__} (page size {allocator.page_size})"
    return None


def _served_top_k(req) -> int | None:
    """The request's top-k if the table serves it (decided once, at its first match,
    while its logprob_start_len is still the client's)."""
    if hasattr(req, _TOP_K_ATTR):
        return getattr(req, _TOP_K_ATTR)
    served = _settings() is not None and caches_prompt_logprobs(
        return_logprob=req.return_logprob,
        logprob_start_len=req.logprob_start_len,
        top_logprobs_num=req.logprob.top_logprobs_num,
        named_token_ids=req.logprob.token_ids_logprob,
        max_new_tokens=req.sampling_params.max_new_tokens,
        flat_top_logprobs=req.return_flat_raw_top_logprobs,
        prompt_len=len(req.origin_input_ids),
    )
    served = served and req.multimodal_inputs is None and req.session is None
    k = req.logprob.top_logprobs_num if served else None
    setattr(req, _TOP_K_ATTR, k)
    return k


# -- match -------------------------------------------------------------------------------
def _around_init_next_round_input(original, req, tree_cache=None, *args, **kwargs):
    k = _served_top_k(req) if tree_cache is not None else None
    cache = _cache_for(tree_cache) if k is not None else None
    if cache is None:
        if k is not None:
            setattr(req, _TOP_K_ATTR, None)  # no table here: stock
        return original(req, tree_cache, *args, **kwargs)
    setattr(req, _ROWS_ATTR, None)
    req.logprob_start_len = len(req.origin_input_ids)  # the match is capped only by T - 1
    result = original(req, tree_cache, *args, **kwargs)
    matched = req.prefix_len
    # The matched prefix's slots, read off the tree (SGLang's own accessor for them).
    slots = tree_cache.prefix_device_indices(req) if matched > 1 else None
    usable = cache.table.usable_run(slots[1:], k) if slots is not None else 0
    cached = table_positions(matched, usable)
    req.logprob_start_len = cached
    if cached < matched:  # match again, capped at L (the same tree: prefix_len becomes L)
        result = original(req, tree_cache, *args, **kwargs)
    if cached:
        setattr(req, _ROWS_ATTR, cache.table.read(slots[1 : cached + 1], k))
    return result


# -- result ------------------------------------------------------------------------------
def _around_add_input_logprob_return_values(original, self, i, req, *args, **kwargs):
    done_before = req.logprob.input_token_logprobs_val is not None
    result = original(self, i, req, *args, **kwargs)
    if (
        getattr(req, _TOP_K_ATTR, None) is not None
        and not done_before
        and req.logprob.input_token_logprobs_val is not None
    ):
        try:
            _complete(req)
        except ValueError as e:  # in SGLang's scheduler loop: fail this request alone
            _fail(req, str(e))
    return result


def _complete(req) -> None:
    """Keep the computed entries in the table, splice in the copied ones, and leave the
    request looking like a stock echo request (logprob_start_len 0)."""
    start = req.logprob_start_len
    rows: CachedRows | None = getattr(req, _ROWS_ATTR, None)
    logprob = req.logprob
    prompt = list(req.origin_input_ids)
    k = getattr(req, _TOP_K_ATTR)
    top = None
    if k > 0:
        top = (logprob.input_top_logprobs_val, logprob.input_top_logprobs_idx)
    slots = getattr(req, _SLOTS_ATTR, None)
    if _CACHE is not None and slots is not None:
        try:
            _CACHE.table.write(
                slots[start + 1 : len(prompt)],
                logprob.input_token_logprobs_val[1:],
                top[0][1:] if top else None,
                top[1][1:] if top else None,
                skip_slot=DROPPED_SLOT,
            )
        except ValueError as e:  # refused before writing anything: the table only misses
            logger.warning("prefillonly: prompt logprobs of %s not cached: %s", req.rid, e)
    values, ids, top = splice(
        logprob.input_token_logprobs_val, logprob.input_token_logprobs_idx, top, rows, prompt
    )
    logprob.input_token_logprobs_val, logprob.input_token_logprobs_idx = values, ids
    if top is not None:
        logprob.input_top_logprobs_val, logprob.input_top_logprobs_idx = top
    req.logprob_start_len = 0
    setattr(req, _ROWS_ATTR, None)
    setattr(req, _SLOTS_ATTR, None)


def _fail(req, why: str) -> None:
    """The request's answer cannot be put together (its copied and computed entries do not
    add up: plan.splice): it finishes with the error instead of a wrong answer, the
    scheduler goes on. Its KV is already released (SGLang releases a finished request
    before it adds its logprobs); the finish reason is read when its output is sent."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    message = f"prompt logprobs of request {req.rid}: {why}; this request failed"
    logger.error("prefillonly: %s", message)
    setattr(req, _ROWS_ATTR, None)
    setattr(req, _SLOTS_ATTR, None)
    reason = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR)
    if req.finished():
        req.finished_reason = reason
    else:
        req.to_finish = reason


def _before_release_kv_cache(req, *args, **kwargs):
    """The request's KV slots, read before its row goes back: SGLang releases a finished
    request (its prompt enters the prefix cache) before it adds the request's logprobs.
    Where the tree already held some of these tokens the insert frees the request's
    copies; their entries then die with them (the tree's slots stay as they were)."""
    if _CACHE is not None and getattr(req, _TOP_K_ATTR, None) is not None and req.kv.holds_kv:
        row = _CACHE.tree_cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        setattr(req, _SLOTS_ATTR, row[: len(req.origin_input_ids)].cpu())
    return None


# -- invalidation ------------------------------------------------------------------------
def _after_alloc(result, self, *args, **kwargs):
    if _CACHE is not None and result is not None:
        _CACHE.table.invalidate(result)
    return result


# -- chunked computation -----------------------------------------------------------------
def _after_input_logprob_processor_init(result, self, *args, **kwargs):
    settings = _settings()
    if settings is not None:
        self.enable_logprobs_chunk = True
        self.logprobs_chunk_size = settings.chunk_size
    return result


HOOKS = {
    "sglang.srt.managers.schedule_batch.Req.init_next_round_input": (
        "AROUND",
        _around_init_next_round_input,
    ),
    "sglang.srt.managers.scheduler_components.logprob_result_processor."
    "SchedulerLogprobResultProcessor.add_input_logprob_return_values": (
        "AROUND",
        _around_add_input_logprob_return_values,
    ),
    "sglang.srt.mem_cache.common.release_kv_cache": ("BEFORE", _before_release_kv_cache),
    "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc": ("AFTER", _after_alloc),
    "sglang.srt.layers.logprob_processor.InputLogprobProcessor.__init__": (
        "AFTER",
        _after_input_logprob_processor_init,
    ),
}


def register() -> None:
    """Plugin entry (every SGLang process; acts in the scheduler)."""
    from prefillonly_sgl.hooking.hooks import register_hooks

    register_hooks("prompt_logprobs.scheduler_process", HOOKS)

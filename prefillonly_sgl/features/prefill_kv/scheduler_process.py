"""Prefill-only KV, scheduler side: score prompts get pool slots only for their kept
tokens (policy.py decides which; R arrives in messages.py's field).

Decided once per scheduler (get_worker_info, before any request): process_state's
prefill_kv.active
where this is known to be safe: the plain token allocator with page size 1 (DROPPED_SLOT
is its never-allocated dummy slot), not a dLLM, and a prefill attention backend whose
`prefill_only_kv_unsupported()` says None (ours: torch_native without sliding windows;
FlashInfer whenever it always plans the ragged prefill). Elsewhere every request is
stock, with a warning in the log saying why.

Per request (score prompts and single-token requests: those carrying R), while active:
- length: validate_input_length lets a score prompt be as long as the context (the stock
  limit is also bounded by the pool); R is clamped to the pool where it is read; a
  single-token request keeps its one output token (init_req_max_new_tokens would clip it
  to what the pool leaves after the prompt).
- admission: PrefillAdder.add_one_req charges the pool budget only for kept tokens and
  never chunks a score prompt (a later chunk would read earlier chunks' KV from the
  pool): one that does not fit the chunk budget runs alone, first in its batch.
- allocation: alloc_for_extend gives real slots to kept tokens and DROPPED_SLOT to the
  rest (alloc_token_slots, called once inside it, allocates by the layout handed over in
  _PENDING_LAYOUT), and ends the request's kv_committed_len / kv_allocated_len at the
  kept boundary, so the stock release_kv_cache caches and frees only [0, boundary). How
  many of each request's new tokens got a slot is recorded by its request row
  (PrefillKvState.kept): layers run in query chunks read those back from the pool and
  keep the others themselves (prefill_attention/layer_keys.py).
- followers packed behind their leader (packing.py): a request admitted behind another
  request of the same batch that computes and keeps their common prefix takes that
  prefix as its own (prefix_len moves from its match to S), its row reads the leader's
  slots there (filled in after alloc_for_extend writes the rows), [0, S) is protected
  (never its to free) and, at release, it inserts its own tokens only if the cache then
  holds [0, S) (else nothing). A prefix group thus runs in one forward, not two.
- never a decode step: a single-token request finishes by length with its prefill's
  token. SGLang's overlapped loop (its default, on CPU too) merges a prefill batch into
  the running batch before processing its result, but leaves out of the next decode
  step every request whose queued result finishes it by length
  (Scheduler._reqs_finishing_inflight), so no token slot past the kept boundary is ever
  committed.
The attention backends (prefill_attention/) never read dropped tokens from the pool (the
CPU one does not write them either; FlashInfer's stock write sends them to DROPPED_SLOT).
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass

import torch

from prefillonly_sgl.features.prefill_kv.messages import (
    reusable_len_in,
    with_off_reason,
    with_scoring_limit,
)
from prefillonly_sgl.features.prefill_kv.packing import FOLLOWER_MARK, kept_end, packed_len
from prefillonly_sgl.features.prefill_kv.policy import (
    DROPPED_SLOT,
    KEEP_ALL,
    SPLIT,
    anchors_in_extend,
    clamp_reusable_len,
    discarded_readout_rows,
    dropped_new_tokens,
    kept_new_tokens,
    kept_rows,
    recurrent_state_plan,
    runs_one_forward,
)
from prefillonly_sgl.hooking import process_state

logger = logging.getLogger(__name__)


# Set on a request of a recurrent-state model that keeps every token's KV and its final
# state, as stock SGLang (policy.recurrent_state_plan: KEEP_ALL).
KEEP_ALL_MARK = "_prefillonly_keeps_all_kv"

# On a PrefillAdder that admitted a prompt too long to share a batch: only followers
# (of it, or of each other) may join it now.
RIDERS_ONLY = "_prefillonly_riders_only"
MAX_LEADERS_LOOKED_AT = 16  # admitted requests a new one compares itself with (_leader_for)

# This scheduler's decision, shared with the attention backends (process_state.py).
STATE = process_state.current().prefill_kv


@dataclass(frozen=True)
class _Follower:
    leader: object  # the Req whose slots it reads
    packed: int  # S: its prefix, [0, S)
    matched: int  # what its own cache match was


def reusable_len(req) -> int | None:
    """R of a score prompt or a single-token request, clamped to the pool; None for every
    other request (stock), and for all requests where the pool or the attention backend
    is not supported."""
    if not STATE.active or not runs_one_forward(req.sampling_params.max_new_tokens):
        return None
    if getattr(req, KEEP_ALL_MARK, False):
        return None  # a recurrent-state prompt that keeps every token (recurrent_state_plan)
    r = reusable_len_in(req.sampling_params.custom_params)
    if r is None or STATE.max_pool_input_len is None:
        return r
    return clamp_reusable_len(r, STATE.max_pool_input_len)


# -- start-up ----------------------------------------------------------------------------
def _after_get_worker_info(result, self, *args, **kwargs):
    runner = self.model_runner
    # SGLang keeps linear-attention / mamba layers' states in a pool beside the KV pool.
    STATE.recurrent_state = getattr(runner.req_to_token_pool, "mamba_pool", None) is not None
    STATE.inactive_because = _unsupported_here(self, runner)
    STATE.active = STATE.inactive_because is None
    STATE.packs_followers = (
        STATE.active
        and not STATE.recurrent_state
        and process_state.current().switches.pack_followers
    )
    if STATE.active:
        # The eager runner copies every forward's inputs into static buffers sized for the
        # longest forward stock SGLang can run: max(pool, chunked_prefill_size, ...). An
        # unchunked score prompt can be longer than both; SGLang's own switch makes it
        # use the live tensors instead (such forwards never fit a CUDA graph anyway).
        from sglang.srt.environ import envs

        envs.SGLANG_EAGER_INPUT_NO_COPY.set(True)
    else:
        logger.warning(
            "prefillonly: prefill-only KV is off in this scheduler (%s): scoring requests "
            "keep KV for every token, as in stock SGLang",
            STATE.inactive_because,
        )
    context_len = self.model_config.context_len
    table_len = runner.req_to_token_pool.max_context_len
    # Same margins as the stock limit (TpModelWorker.get_worker_info), minus the pool bound.
    STATE.max_scoring_input_len = min(context_len - 1, table_len - 1) - 5
    if STATE.active and not STATE.recurrent_state:
        result = _reserve_one_pass_scratch(runner, result)
    return result


def _reserve_one_pass_scratch(runner, result):
    """The one-pass attention's scratch slots (prefill_attention/one_pass.py: dropped rows
    are written there so one paged pass reads every key from the pool), taken from the
    allocator once, before any request, and never freed. The scheduler is told a pool
    that much smaller (get_worker_info's first field, and the request limits bound by
    it), so its accounting and its idle leak check stay exact."""
    backend = _prefill_backend(runner.attn_backend)
    ask = getattr(backend, "one_pass_scratch_tokens", None)
    total, max_prefill_tokens = result[0], result[1]
    wanted = ask(max_prefill_tokens) if ask is not None else 0
    if wanted <= 0:
        return result
    if wanted > total // 2:
        logger.warning(
            "prefillonly: one-pass attention off: its %d scratch slots would take more than "
            "half of the %d-token KV pool",
            wanted,
            total,
        )
        return result
    slots = runner.token_to_kv_pool_allocator.alloc(wanted)
    if slots is None:
        logger.warning("prefillonly: one-pass attention off: the pool has no %d free slots", wanted)
        return result
    backend.use_scratch(slots)
    STATE.one_pass = True
    logger.info("prefillonly: one-pass attention on, %d scratch slots reserved", wanted)
    return shrunk_worker_info(result, wanted)


def shrunk_worker_info(result: tuple, reserved: int) -> tuple:
    """get_worker_info's answer for a pool `reserved` tokens smaller: its capacity, and
    the request limits it bounds (max_req_len <= capacity - 1, max_req_input_len =
    max_req_len - 5, as TpModelWorker.get_worker_info derives them)."""
    values = list(result)
    values[0] = result[0] - reserved
    values[4] = min(result[4], values[0] - 1)
    values[5] = min(result[5], values[4] - 5)
    return tuple(values)


def _unsupported_here(worker, runner) -> str | None:
    """Why this scheduler cannot drop suffix KV (None: it can). The pool must be the plain
    token allocator with page size 1 (DROPPED_SLOT is its never-allocated dummy slot), and
    the prefill attention backend must say it never reads new tokens back from the pool."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    allocator = runner.token_to_kv_pool_allocator
    if type(allocator) is not TokenToKVPoolAllocator or allocator.page_size != 1:
        return f"KV allocator {type(allocator).__name__} (page size {allocator.page_size})"
    if worker.is_dllm():
        return "dLLM models are not handled"
    return _prefill_backend_check(runner.attn_backend, HybridAttnBackend, HybridLinearAttnBackend)


def _prefill_backend(backend):
    """The backend that runs score prompts' full attention. Wrappers are unwrapped by
    type, not by attribute: FlashInfer's own backend has a `prefill_backend` too, the
    name of its kernel ("fa2"), which made every CUDA engine report "attention backend
    str" (the H200 run of 2026-11-26)."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    return _unwrapped(backend, HybridAttnBackend, HybridLinearAttnBackend)


def _unwrapped(backend, hybrid_type, hybrid_linear_type):
    if isinstance(backend, hybrid_type):  # prefill and decode backends: the prefill side
        backend = backend.prefill_backend
    # HybridLinearAttnBackend: its full-attention layers' backend (the linear-attention
    # layers keep no per-token KV; their state is split at R instead, _split_at_prefix)
    if isinstance(backend, hybrid_linear_type):
        backend = backend.full_attn_backend
    return backend


def _prefill_backend_check(backend, hybrid_type, hybrid_linear_type) -> str | None:
    """Why the backend that runs score prompts' full attention cannot drop suffix KV."""
    backend = _unwrapped(backend, hybrid_type, hybrid_linear_type)
    check = getattr(backend, "prefill_only_kv_unsupported", None)
    if check is None:  # stock backends read new tokens back from the pool
        return f"attention backend {type(backend).__name__} is not prefillonly's"
    return check()


def _after_get_init_info(result, self, *args, **kwargs):
    """The start-up handshake tells the main process the score-prompt limit (messages.py),
    only where this feature is active."""
    STATE.max_pool_input_len = int(self.max_req_input_len)
    if STATE.active and STATE.max_scoring_input_len is not None:
        limit = max(STATE.max_pool_input_len, STATE.max_scoring_input_len)
        result = with_scoring_limit(dict(result), limit)
    elif STATE.inactive_because:
        result = with_off_reason(dict(result), STATE.inactive_because)
    return result


# -- per request: length -----------------------------------------------------------------
def _around_validate_input_length(original, req, max_req_input_len, allow_auto_truncate):
    if reusable_len(req) is None or STATE.max_scoring_input_len is None:
        return original(req, max_req_input_len, allow_auto_truncate)
    limit = max(max_req_input_len, STATE.max_scoring_input_len)
    return original(req, limit, allow_auto_truncate)


def _around_init_req_max_new_tokens(original, self, req, *args, **kwargs):
    """A single-token request keeps its one token: SGLang clips max_new_tokens to what the
    pool leaves after the prompt (0 for a prompt longer than the pool, which would then
    run as a score prompt and sample nothing), but that token is never decoded, so it
    needs no pool slot."""
    single = reusable_len(req) is not None and req.sampling_params.max_new_tokens == 1
    result = original(self, req, *args, **kwargs)
    if single and not req.finished():
        req.sampling_params.max_new_tokens = 1
    return result


# -- per request: admission --------------------------------------------------------------
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


def _split_at_prefix(original, adder, req, extend, has_chunked_req, truncation_align_size):
    """Admit a cold score prompt of a recurrent-state model as a chunked request whose
    first chunk ends at R (SGLang's own chunking: the adder truncates at its chunk budget,
    lowered here to the tokens up to R). When that chunk ends SGLang's radix cache keeps
    the prefix with a copy of the state there (no_buffer's cache_unfinished_req); the rest
    of the prompt runs next round from that state. A chunked request ends its batch (SGLang
    continues one at a time)."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    if has_chunked_req:
        return AddReqResult.OTHER  # another prompt is mid-chunks: this one waits a round
    budget = adder.rem_chunk_tokens
    adder.rem_chunk_tokens = extend
    try:
        result = original(adder, req, has_chunked_req, truncation_align_size)
    finally:
        admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
        # Admitted: nothing may follow a chunked request in this batch. Refused: it
        # consumed nothing, so the batch keeps the budget it had.
        adder.rem_chunk_tokens = 0 if admitted else budget
    return AddReqResult.OTHER if admitted else result


def _around_add_one_req(original, self, req, has_chunked_req, truncation_align_size):
    follower = _leader_for(self, req)
    if follower is None:
        if getattr(self, RIDERS_ONLY, False):
            from sglang.srt.managers.schedule_policy import AddReqResult

            return AddReqResult.OTHER  # behind a long prompt: its followers only
        return _admit(original, self, req, has_chunked_req, truncation_align_size)
    req.prefix_len = follower.packed  # admitted (and charged) from S, as a cache hit
    setattr(req, FOLLOWER_MARK, follower)
    admitted = False
    try:
        result = _admit(original, self, req, has_chunked_req, truncation_align_size)
        admitted = bool(self.can_run_list) and self.can_run_list[-1] is req
    finally:
        if not admitted:
            req.prefix_len = follower.matched
            delattr(req, FOLLOWER_MARK)
    return result


def _leader_for(adder, req) -> _Follower | None:
    """The admitted request of this batch whose kept tokens give `req` the longest prefix
    beyond its own match (packing.py), or None. Only one-forward requests follow (never a
    decode step: their row past S is theirs alone); both in one prefix-cache namespace; no
    recurrent state (a follower would need the leader's state at S, which exists only
    after the forward); no embedding overrides (their KV is not a function of the token
    ids alone). Images are: SGLang writes each image's hash over its placeholder tokens on
    arrival (pad_input_ids), so equal ids are the same image, and a follower's M-RoPE
    positions and image embeddings are read past its prefix as for a cache hit."""
    if (
        not adder.can_run_list
        or not STATE.packs_followers
        or reusable_len(req) is None
        or not _plain_tokens(req)
    ):
        return None
    ids = req.full_untruncated_fill_ids
    cap = req._compute_max_prefix_len(len(ids))
    matched = req.prefix_len
    best = None
    # The latest admitted first, and only the last few: a group's members are admitted
    # one behind the other (the JCT plan puts them so), and each member keeps the whole
    # prefix it read, so the one just before is as good a leader as the first; the bound
    # keeps admission linear in the batch's size.
    for leader in adder.can_run_list[: -MAX_LEADERS_LOOKED_AT - 1 : -1]:
        leader_ids = leader.full_untruncated_fill_ids
        if (
            len(leader_ids) <= matched
            or leader_ids[matched] != ids[matched]  # the usual case: a stranger, at once
            or leader.extra_key != req.extra_key
            or leader.cache_salt != req.cache_salt
            or not _plain_tokens(leader)
        ):
            continue
        end = kept_end(leader.prefix_len, leader.extend_end, len(leader_ids), reusable_len(leader))
        n = packed_len(ids, matched, cap, leader_ids, end)
        if n and (best is None or n > best.packed):
            best = _Follower(leader, n, matched)
    return best


def _plain_tokens(req) -> bool:
    return req.input_embeds is None and req.positional_embed_overrides is None and not req.is_dllm()


def _admit(original, self, req, has_chunked_req, truncation_align_size):
    from sglang.srt.managers.schedule_policy import AddReqResult
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    r = reusable_len(req)
    if STATE.recurrent_state and r is not None:
        total = len(req.full_untruncated_fill_ids)
        plan = recurrent_state_plan(req.prefix_len, total, r, self.rem_chunk_tokens)
        if plan == SPLIT:
            return _split_at_prefix(
                original, self, req, r - req.prefix_len, has_chunked_req, truncation_align_size
            )
        if plan == KEEP_ALL:
            setattr(req, KEEP_ALL_MARK, True)  # reusable_len(req) is None from now on
            return original(self, req, has_chunked_req, truncation_align_size)
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
        if STATE.packs_followers:
            # Only its followers may join it: they compute their own tokens alone (a
            # chunk's budget of them), and riding along saves each a forward.
            setattr(self, RIDERS_ONLY, True)
            self.rem_chunk_tokens = chunk_budget
            self.rem_input_tokens = chunk_budget
            return AddReqResult.CONTINUE
        self.rem_chunk_tokens = chunk_budget - remaining  # <= 0: the batch is full
        return AddReqResult.OTHER
    return result


# -- per request: allocation -------------------------------------------------------------
@dataclass(frozen=True)
class _SlotLayout:
    """Which of an extend batch's new tokens get real slots (requests in batch order)."""

    kept: list[int]
    extend_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)


# The layout alloc_for_extend hands to the alloc_token_slots call inside it (SGLang passes
# that call only the token count).
_PENDING_LAYOUT: contextvars.ContextVar[_SlotLayout | None] = contextvars.ContextVar(
    "prefillonly_pending_slot_layout", default=None
)


def _layout_of(batch) -> _SlotLayout | None:
    """None when every new token of the batch keeps its KV (the stock allocation)."""
    if not STATE.active or batch.is_dllm():
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
    return _SlotLayout(kept, list(batch.extend_lens))


def _around_alloc_for_extend(original, batch):
    layout = _layout_of(batch)
    if layout is None:
        result = original(batch)
        _read_leaders_slots(batch)
        _record_kept(batch, batch.extend_lens)
        return result
    token = _PENDING_LAYOUT.set(layout)
    try:
        result = original(batch)
    finally:
        _PENDING_LAYOUT.reset(token)
    _read_leaders_slots(batch)
    _record_kept(batch, layout.kept)
    for req, prefix_len, n_kept, n_new in zip(
        batch.reqs, batch.prefix_lens, layout.kept, layout.extend_lens
    ):
        if n_kept < n_new:
            # The row holds real slots only up to here; release_kv_cache caches and
            # frees [0, boundary) and never touches the DROPPED_SLOT entries after it.
            boundary = prefix_len + n_kept
            req.kv.kv_committed_len = boundary
            req.kv.kv_allocated_len = boundary
    return result


def _record_kept(batch, kept) -> None:
    """Each request's new tokens that own a pool slot, by its request-table row (set by
    the allocation, just done): on the host for the attention of layers run in query
    chunks (PrefillKvState.kept)."""
    if not STATE.active:
        return
    for req, n_kept in zip(batch.reqs, kept):
        STATE.kept[req.kv.req_pool_idx] = int(n_kept)


def _around_prefix_kv_indices(original, batch, req):
    """A follower's prefix as alloc_for_extend writes it into its row: its own match,
    then placeholders for [matched, S), which _read_leaders_slots fills with the leader's
    slots once the batch's rows are written (the leader's are allocated in the same
    call, after this)."""
    follower = getattr(req, FOLLOWER_MARK, None)
    if follower is None:
        return original(batch, req)
    req.prefix_len = follower.matched
    try:
        own = original(batch, req).to(batch.device)
    finally:
        req.prefix_len = follower.packed
    gap = follower.packed - follower.matched
    return torch.cat([own, torch.full((gap,), DROPPED_SLOT, dtype=own.dtype, device=own.device)])


def _read_leaders_slots(batch) -> None:
    """Each follower's row [matched, S) := its leader's (packing.py): real slots the
    leader writes in this forward (its row is final here: rows are written in batch order
    and a leader precedes its followers). [0, S) is then protected: the leader, or the
    cache, owns it."""
    req_to_token = batch.req_to_token_pool.req_to_token
    leaders = STATE.leaders if STATE.one_pass else None
    for req in batch.reqs:
        follower = getattr(req, FOLLOWER_MARK, None)
        if leaders is not None:
            # the one-pass attention's view of this forward (PrefillKvState.leaders)
            if follower is None:
                leaders.pop(req.kv.req_pool_idx, None)
            else:
                leaders[req.kv.req_pool_idx] = follower.leader.kv.req_pool_idx
        if follower is None:
            continue
        lo, hi = follower.matched, follower.packed
        # No check that these are real slots: reading them back would synchronise with
        # the forward in flight; packing.kept_end decided they are.
        req_to_token[req.kv.req_pool_idx, lo:hi] = req_to_token[
            follower.leader.kv.req_pool_idx, lo:hi
        ]
        req.kv.cache_protected_len = hi


def _before_release_kv_cache(req, tree_cache, *args, checkpoint=False, **kwargs):
    """A follower inserts its own tokens after S into the cache only where the cache holds
    [0, S) by now (its leader, released first, inserted them); otherwise (the leader was
    aborted and freed them) it inserts nothing, which frees its own slots after S."""
    follower = getattr(req, FOLLOWER_MARK, None)
    if follower is None:
        return None
    delattr(req, FOLLOWER_MARK)
    if checkpoint and not req.skip_radix_cache_insert:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(
            token_ids=req.full_untruncated_fill_ids[: follower.packed],
            extra_key=req.extra_key,
            cache_salt=req.cache_salt,
        )
        held = tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
        if held < follower.packed:
            req.skip_radix_cache_insert = True
    return None


def _around_alloc_token_slots(original, tree_cache, num_tokens, *args, **kwargs):
    layout = _PENDING_LAYOUT.get()
    if layout is None:
        return original(tree_cache, num_tokens, *args, **kwargs)
    if num_tokens != layout.num_tokens:
        raise RuntimeError(
            f"prefill-only KV: alloc_for_extend asked for {num_tokens} slots, its batch has "
            f"{layout.num_tokens} new tokens (an SGLang change?); start with "
            "--disable-prefill-only-kv"
        )
    allocator = tree_cache.token_to_kv_pool_allocator
    n_real = sum(layout.kept)
    if not n_real:
        return torch.full((num_tokens,), DROPPED_SLOT, dtype=torch.int64, device=allocator.device)
    real = original(tree_cache, n_real, *args, **kwargs)
    # Nothing here may wait for the device (this runs on SGLang's schedule stream while
    # the previous forward runs): the rows come from the host (kept_rows), copied without
    # blocking, and scattered by index; a boolean mask would need the device's count.
    rows = torch.tensor(kept_rows(layout.kept, layout.extend_lens), dtype=torch.int64)
    out = torch.full((num_tokens,), DROPPED_SLOT, dtype=real.dtype, device=real.device)
    out.index_copy_(0, rows.to(real.device, non_blocking=True), real)
    return out


# -- the setwise readout (score_extraction_token) with the prefix cache on ------------
# On a setwise Req once its batch is prepared: its anchors' full-prompt positions.
ANCHORS_MARK = "_prefillonly_setwise_anchors"


def _after_prepare_for_extend(result, batch):
    """A setwise score prompt (SGLang reads its labels AT each anchor, token_indices_to_pool,
    in full-prompt positions, which is why stock SGLang requires the radix cache off):
    with prefill-only KV it is never chunked, and its logprob_start_len is its first
    anchor (tokenizer_process.py), which bounds its prefix-cache match, so the cache (or a
    leader) may give it any prefix before that; here its anchors become rows of the
    extend that follows the prefix, as SGLang's readout (LogitsProcessor.
    compute_logprobs_at_positions) and its logprob bookkeeping both read them from
    req.token_indices_to_pool. A request whose anchor lies in that prefix anyway (one
    that reached the scheduler without the bound) fails alone: _fail_setwise_request."""
    for i, req in enumerate(batch.reqs):
        anchors = getattr(req, ANCHORS_MARK, None)
        if anchors is None:
            if not getattr(req, "token_indices_to_pool", None) or reusable_len(req) is None:
                continue
            anchors = list(req.token_indices_to_pool)
            setattr(req, ANCHORS_MARK, anchors)
        try:
            req.token_indices_to_pool = anchors_in_extend(anchors, req.prefix_len)
        except ValueError as e:
            _fail_setwise_request(batch, i, req, anchors, str(e))
    return result


def _fail_setwise_request(batch, i: int, req, anchors: list[int], why: str) -> None:
    """The batch is prepared (its slots allocated, its tensors built), so the request stays
    in it and takes its forward, reading harmless rows (policy.discarded_readout_rows);
    SGLang's discard_output_reason then drops that output and finishes the request with
    the error, its KV released without entering the prefix cache (as for a failed KV
    load), while the batch's other requests and the engine go on."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    message = (
        f"prefill-only KV: the setwise readout of request {req.rid} cannot run: {why}, "
        "where nothing computes it; this request failed, the engine goes on"
    )
    logger.error("prefillonly: %s", message)
    req.token_indices_to_pool = discarded_readout_rows(
        anchors, req.prefix_len, batch.extend_logprob_start_lens[i], batch.extend_lens[i]
    )
    req.skip_radix_cache_insert = True
    req.discard_output_reason = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR)


# -- a Kev checkpoint's pointer head behind a cached state -----------------------------
class _BehindPrefix:
    """The forward batch as SGLang's pooler reads it, its decision layouts placed on the
    computed part of each prompt (decisions/checkpoints.layout_behind_prefix)."""

    def __init__(self, forward_batch, layouts) -> None:
        self._batch = forward_batch
        self.decision_layouts = layouts
        self.extend_prefix_lens_cpu = [0] * len(layouts)

    def __getattr__(self, name):
        return getattr(self._batch, name)


def _around_pointer_pooler(original, self, hidden_states, forward_batch):
    """SGLang's pointer head scores only prompts computed from position 0 (stock serves Kev
    with the prefix cache off). Each Kev question's prompt is the state, then the
    question: its options' closing tokens and its decide token all follow the state, so
    behind a cached state the head reads the same positions, moved back by the cached
    length."""
    from prefillonly_sgl.decisions.checkpoints import layout_behind_prefix

    cached = forward_batch.extend_prefix_lens_cpu
    layouts = forward_batch.decision_layouts
    if layouts is None or not cached or not any(cached):
        return original(self, hidden_states, forward_batch)
    moved = [
        layout if layout is None else layout_behind_prefix(layout, prefix)
        for layout, prefix in zip(layouts, cached)
    ]
    return original(self, hidden_states, _BehindPrefix(forward_batch, moved))


HOOKS = {
    "sglang.srt.layers.pointer_head.PointerPooler.forward": ("AROUND", _around_pointer_pooler),
    "sglang.srt.managers.tp_worker.TpModelWorker.get_worker_info": (
        "AFTER",
        _after_get_worker_info,
    ),
    "sglang.srt.managers.scheduler.Scheduler.get_init_info": ("AFTER", _after_get_init_info),
    "sglang.srt.managers.utils.validate_input_length": ("AROUND", _around_validate_input_length),
    "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens": (
        "AROUND",
        _around_init_req_max_new_tokens,
    ),
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": (
        "AROUND",
        _around_add_one_req,
    ),
    "sglang.srt.mem_cache.allocation.alloc_for_extend": ("AROUND", _around_alloc_for_extend),
    "sglang.srt.mem_cache.allocation.alloc_token_slots": ("AROUND", _around_alloc_token_slots),
    "sglang.srt.mem_cache.allocation._prefix_kv_indices": ("AROUND", _around_prefix_kv_indices),
    "sglang.srt.mem_cache.common.release_kv_cache": ("BEFORE", _before_release_kv_cache),
    "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend": (
        "AFTER",
        _after_prepare_for_extend,
    ),
}

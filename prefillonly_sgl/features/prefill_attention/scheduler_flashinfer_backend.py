"""GPU side of the prefill-only attention backend (imported only on a CUDA engine).

Stock FlashInferAttnBackend already computes only what is new in an extend batch: ragged
attention of the new tokens over their own k / v (causal), merged by log-sum-exp with
paged attention over the cached prefix in the pool (`use_ragged`). That is issue 6's
"attention of new tokens only", so the forward itself is stock.

What this subclass adds is prefill-only KV (prefill_kv/) on GPU: a scoring request's
tokens after its reusable prefix get DROPPED_SLOT instead of a real slot, so attention
must never read new tokens back from the pool. The ragged path never does (new k / v in
hand; the paged part covers only the cached prefix, which is always real); FlashInfer's
paged-only path does (it writes the new k / v to the pool, then reads the whole sequence
from it). `prefill_only_kv_unsupported()` names the configurations where FlashInfer takes
the paged-only path, and prefill_kv keeps every request stock there. As a last line of
defence, an extend batch planned without ragged while prefill-only KV is active raises
instead of returning wrong probabilities.

Followers packed behind their leader (prefill_kv/packing.py) read, as their prefix, pool
slots their leader writes in the same forward. Stock forward_extend's ragged path writes
the batch's k / v to the pool after its attention; with prefill-only KV active this
subclass writes them first (the same write, earlier), so the paged part of every request
reads its leader's keys of the same layer.

Hybrid prefilling's layers in query chunks (features/hybrid_prefill/layer_chunks.py) attend through
forward_query_chunk: FlashInfer's ragged prefill over the chunk's own rows merged with the
paged pool (prefixes, and the rows earlier chunks wrote) and the keys the layer keeps of
rows without a slot (layer_keys.py), flashinfer_chunk.py. Opt-in (PREFILLONLY_CUDA_QUERY_CHUNKS=1)
until tests/test_flashinfer_query_chunk.py has passed on a GPU: scores must not come from
a kernel path nobody has run; without it the layers keep SGLang's forward (with the
token-wise chunks of mode "token").

One pass per layer (PREFILLONLY_CUDA_ONE_PASS=1, opt-in until a card has checked it
against the three-pass path: issue 83): an extend batch's attention as ONE FlashInfer
paged prefill per layer, each prefix group one sequence under multi-item scoring's item
mask (one_pass.py, flashinfer_one_pass.py), instead of a ragged pass, a paged pass over
the prefixes and their merge. Every key is then read from the pool, so the batch's
dropped rows (prefill-only KV) are written to scratch slots this backend reserves at
start (prefill_kv/scheduler_process.py takes them from the allocator once and reports
the pool that much smaller) instead of the dummy slot; kept rows go to their real
slots as before. A forward with more new tokens than the scratch holds, or one this
path does not cover (query chunks, sinks, a paged-only configuration), runs as before.

Not run on a GPU yet (no GPU was lent to this project's sessions); the decision logic
is tested on CPU (tests/test_prefill_kv_backend_support.py) and tests/test_gpu_engine.py
runs the parity checks wherever CUDA is present.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import (
    FlashInferQueryChunk,
    with_sinks,
)
from prefillonly_sgl.features.prefill_attention.flashinfer_one_pass import (
    PAGED_BACKEND,
    OnePassAttention,
)
from prefillonly_sgl.features.prefill_attention.layer_keys import LayerKeys, kept_new_tokens
from prefillonly_sgl.features.prefill_attention.one_pass import Member
from prefillonly_sgl.features.prefill_attention.one_pass import plan as plan_one_pass
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk
from prefillonly_sgl.features.prefill_kv.policy import DROPPED_SLOT
from prefillonly_sgl.hooking import process_state

# The forward modes prefill-only KV requests run in (no speculative / dLLM modes here).
_PLAIN_EXTEND = (ForwardMode.EXTEND, ForwardMode.MIXED)


def flashinfer_pool_reads(backend, prefill_graph_backend: str | None) -> str | None:
    """Why this FlashInfer backend would read new tokens' k / v from the pool in an extend
    batch (its paged-only path), or None when every extend batch runs ragged + paged-prefix.
    Mirrors FlashInferAttnBackend.init_forward_metadata / forward_extend of SGLang 0.5.23."""
    checks = (
        (backend.is_multimodal, "multimodal models use the paged-only prefill"),
        (backend.enable_mis, "multi-item scoring (--enable-mis) uses the paged-only prefill"),
        (backend.enable_deterministic, "deterministic inference uses the paged-only prefill"),
        (backend.use_paged, "SGLANG_FLASHINFER_USE_PAGED forces the paged-only prefill"),
        (backend.num_wrappers != 1, "sliding-window / cross-attention models use two wrappers"),
        (backend.use_sliding_window_kv_pool, "the sliding-window KV pool is not handled"),
        (backend.prefill_uses_dequant_workspace, "the FP4 dequant workspace reads the pool"),
        (backend.is_dllm_model, "dLLM extend batches are not handled"),
        (
            prefill_graph_backend in ("full", "tc_piecewise"),
            f"the {prefill_graph_backend} prefill CUDA graph plans the paged-only prefill",
        ),
    )
    return next((why for failed, why in checks if failed), None)


def _prefill_graph_backend() -> str | None:
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase
    from sglang.srt.model_executor.cuda_graph_config import check_cuda_graph_backend as check

    return next((b for b in (Backend.FULL, Backend.TC_PIECEWISE) if check(Phase.PREFILL, b)), None)


class PrefillOnlyFlashInferBackend(FlashInferAttnBackend):
    def prefill_only_kv_unsupported(self) -> str | None:
        """prefill_kv's question to the prefill backend (see the module docstring)."""
        return flashinfer_pool_reads(self, _prefill_graph_backend())

    def one_pass_scratch_tokens(self, max_forward_tokens: int) -> int:
        """prefill_kv's question at start-up: how many scratch slots the one-pass path
        wants reserved in the pool (0: the path is off here). One per new token of the
        largest forward it runs (SGLang's max_prefill_tokens)."""
        if not process_state.current().switches.cuda_one_pass:
            return 0
        if flashinfer_pool_reads(self, _prefill_graph_backend()) is not None:
            return 0
        return max(0, int(max_forward_tokens))

    def use_scratch(self, slots) -> None:
        """The reserved slots (a device tensor), in the order rows use them."""
        self._scratch = slots

    def init_forward_metadata(self, forward_batch) -> None:
        self._one_pass = self._one_pass_for(forward_batch)
        self._query_chunks = {}
        self._chunk_spans = None
        if self._one_pass is not None:
            # Stock's plan (its ragged and paged wrappers) is not made: nothing of this
            # forward runs them. use_ragged False keeps query chunks off it.
            self.forward_metadata = PrefillMetadata(
                self.prefill_wrappers_paged, use_ragged=False, extend_no_prefix=False
            )
            if not hasattr(self, "_chunk_wrappers"):
                self._chunk_wrappers = {}
            return
        super().init_forward_metadata(forward_batch)
        # FlashInfer wrappers per chunk position in a forward, kept across forwards (a
        # wrapper allocates its own workspace; each chunk plans its own once per forward).
        if not hasattr(self, "_chunk_wrappers"):
            self._chunk_wrappers: dict[int, dict] = {}
        paged_only = forward_batch.forward_mode in _PLAIN_EXTEND and not getattr(
            self.forward_metadata, "use_ragged", True
        )
        if paged_only and _drops_kv():
            raise RuntimeError(
                "prefill-only KV is active but FlashInfer planned its paged-only prefill, "
                "which would read dropped tokens from the KV pool; start with "
                "--disable-prefill-only-kv (Engine(prefill_only_kv=False)) and report "
                "this configuration"
            )

    def forward_extend(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs
    ):
        """Stock, with the batch's k / v written to the pool before attention (the module
        docstring: followers read their leader's slots of this forward). With attention
        sinks (gpt-oss, opt-in on CUDA: sink_models.py) the whole extend is one query
        chunk, whose gathered keys take each layer's window and whose log-sum-exp takes
        the sinks (flashinfer_chunk.py); stock FlashInfer has no sinks."""
        one_pass = getattr(self, "_one_pass", None)
        if one_pass is not None and sinks is None:
            if (
                k is None
                or layer.is_cross_attention
                or layer.attn_type == AttentionType.ENCODER_ONLY
            ):
                # stock's wrappers were not planned for this forward (init_forward_metadata)
                raise RuntimeError(
                    "prefillonly's one-pass attention cannot run a layer without its own "
                    "k / v, a cross-attention or an encoder-only layer; unset "
                    "PREFILLONLY_CUDA_ONE_PASS for this model"
                )
            return self._forward_one_pass(one_pass, q, k, v, layer)
        if sinks is not None:
            n = q.shape[0]
            if k is None:
                # the layer passed no k / v (its KV is in the pool already): read them back
                loc = forward_batch.out_cache_loc
                k_pool, v_pool = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
                k, v = k_pool[loc].to(q.dtype), v_pool[loc].to(q.dtype)
            k = k.view(n, layer.tp_k_head_num, layer.qk_head_dim)
            v = v.view(n, layer.tp_v_head_num, layer.v_head_dim)
            return self.forward_query_chunk(q, k, v, layer, forward_batch, 0, n, sinks=sinks)
        if (
            save_kv_cache
            and k is not None
            and _drops_kv()
            and getattr(self.forward_metadata, "use_ragged", False)
            and not layer.is_cross_attention
            and layer.attn_type != AttentionType.ENCODER_ONLY
        ):
            self._write_kv(
                layer,
                KVWriteLoc.for_layer(
                    forward_batch, layer, swa_loc=self.forward_metadata.swa_out_cache_loc
                ),
                k,
                v,
            )
            save_kv_cache = False
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def _forward_one_pass(self, one_pass, q, k, v, layer):
        """The batch's k / v written first (dropped rows to scratch slots), then one paged
        pass over the pool (module docstring)."""
        write_loc = one_pass.write_loc
        n = write_loc.shape[0]  # q / k may carry a CUDA graph's padding past the batch
        k = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)[:n]
        v = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)[:n]
        # Written even where SGLang would not save this layer's KV: the pass reads it here.
        self._write_kv(layer, KVWriteLoc(write_loc, None), k, v)
        k_pool, v_pool = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        o = one_pass.attention(
            q.view(-1, layer.tp_q_head_num, layer.head_dim),
            k_pool,
            v_pool,
            layer.scaling,
            layer.logit_cap or 0.0,
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _one_pass_for(self, forward_batch):
        """This forward's one-pass attention, or None where it runs as before."""
        scratch = getattr(self, "_scratch", None)
        if scratch is None or forward_batch.forward_mode not in _PLAIN_EXTEND:
            return None
        pool_rows = getattr(forward_batch, "req_pool_indices_cpu", None)
        if pool_rows is None or forward_batch.out_cache_loc is None:
            return None
        prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
        new_lens = list(forward_batch.extend_seq_lens_cpu)
        n = sum(new_lens)
        if n > scratch.shape[0] or forward_batch.out_cache_loc.shape[0] != n:
            return None
        pool_rows = [int(r) for r in pool_rows.tolist()]
        members = _members(pool_rows, prefix_lens, new_lens, process_state.current())
        loc = forward_batch.out_cache_loc
        # Dropped rows hold the dummy slot (prefill-only KV's allocation); here each
        # gets its own scratch slot (row i -> scratch[i]), without reading `loc` back.
        write_loc = torch.where(loc == DROPPED_SLOT, scratch[:n].to(loc.dtype), loc)
        wrapper = self._one_pass_wrapper()
        attention = OnePassAttention(
            plan_one_pass(members),
            write_loc,
            self.req_to_token_pool.req_to_token,
            pool_rows,
            wrapper,
        )
        return _OnePass(write_loc, attention)

    def _one_pass_wrapper(self):
        """The paged wrapper of the one-pass path, made once (it allocates its own
        buffers; the float workspace is the backend's, as its other wrappers')."""
        wrapper = getattr(self, "_one_pass_paged", None)
        if wrapper is None:
            import flashinfer

            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer, "NHD", backend=PAGED_BACKEND
            )
            self._one_pass_paged = wrapper
        return wrapper

    def forward_decode(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, **kwargs
    ):
        """Stock decode; with sinks, FlashInfer's decode with its log-sum-exp, the sinks
        applied from it (flashinfer_chunk.with_sinks)."""
        if sinks is None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        wrapper = self.forward_metadata.decode_wrappers[self._get_wrapper_idx(layer)]
        if k is not None and save_kv_cache:
            self._write_kv(
                layer,
                KVWriteLoc.for_layer(
                    forward_batch, layer, swa_loc=self.forward_metadata.swa_out_cache_loc
                ),
                k,
                v,
            )
        o, lse = wrapper.forward_return_lse(
            q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim),
            self.token_to_kv_pool.get_kv_buffer(layer.layer_id),
            sm_scale=layer.scaling,
            logits_soft_cap=layer.logit_cap,
            k_scale=layer.k_scale_float,
            v_scale=layer.v_scale_float,
        )
        return with_sinks(o, lse, sinks).view(-1, layer.tp_q_head_num * layer.head_dim)

    def _write_kv(self, layer, loc, k, v) -> None:
        """The pool's write of k / v before attention reads them. With KV scales (an FP8
        pool) SGLang's write divides k and v by them in place, which stock never minds
        (it writes after attention); here attention reads them afterwards, so the pool
        is handed copies."""
        scales = self._kv_write_scales(layer)
        if any(scale is not None for scale in scales):
            k, v = k.clone(), v.clone()
        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, *scales)

    def supports_query_chunks(self, forward_batch) -> bool:
        """Whether this extend batch's layers may run in query chunks: a plain ragged +
        paged-prefix extend (what forward_query_chunk reproduces per chunk)."""
        return (
            process_state.current().switches.cuda_query_chunks
            and forward_batch.forward_mode in _PLAIN_EXTEND
            and getattr(self.forward_metadata, "use_ragged", False)
            # the batch's request rows on the host (_spans), never read from the device
            and getattr(forward_batch, "req_pool_indices_cpu", None) is not None
            and flashinfer_pool_reads(self, _prefill_graph_backend()) is None
        )

    def new_layer_keys(self) -> LayerKeys:
        """What one layer call run in query chunks keeps for its later chunks and the pool
        does not hold (layer_keys.py), handed back to forward_query_chunk."""
        return LayerKeys()

    def forward_query_chunk(
        self, q, k, v, layer, forward_batch, start, end, sinks=None, layer_keys=None
    ):
        """forward_extend for the batch's rows [start, end) of a layer run in query chunks
        (the CPU backend's method of the same name, with FlashInfer). k / v: the chunk's
        own, (end - start, Hkv, D)."""
        n = end - start
        k = k.reshape(n, layer.tp_k_head_num, layer.head_dim)
        v = v.reshape(n, layer.tp_v_head_num, layer.head_dim)
        # Every row is written, dropped ones too: they go to DROPPED_SLOT, the pool's
        # never-allocated dummy slot that nothing reads (stock FlashInfer writes them there
        # too). Selecting the kept rows with a mask would make the host wait for the device
        # (its count) once per layer per chunk.
        self._write_kv(layer, KVWriteLoc(forward_batch.out_cache_loc[start:end], None), k, v)
        spans, slots, kept = self._spans(forward_batch)
        chunk = self._query_chunks.get((start, end))
        if chunk is None:
            plan = plan_query_chunk(spans, start, end, kept)
            own = None
            if plan.head is not None and plan.head_kept:
                first = spans[plan.head].q_start
                # the head's earlier rows that own a slot: their chunks wrote them there
                own = forward_batch.out_cache_loc[first : first + plan.head_kept]
            chunk = FlashInferQueryChunk(
                plan,
                spans,
                slots,
                self.workspace_buffer,
                self._chunk_wrappers.setdefault(len(self._query_chunks), {}),
                own_slots=own,
            )
            self._query_chunks[start, end] = chunk
        if layer_keys is None:  # one call over the batch: nothing for later chunks
            layer_keys = LayerKeys()
        earlier = layer_keys.step(chunk._plan, spans, kept, k, v)
        k_pool, v_pool = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        window_size = layer.sliding_window_size
        o = chunk(
            q.view(n, layer.tp_q_head_num, layer.head_dim),
            k,
            v,
            k_pool,
            v_pool,
            layer.scaling,
            window=None if window_size is None or window_size <= -1 else int(window_size),
            sinks=sinks,
            earlier=earlier,
        )
        return o.view(n, layer.tp_q_head_num * layer.head_dim)

    def _spans(self, forward_batch):
        """The batch's requests as plan.Span rows, their prefix slots and their new tokens
        that own a pool slot (layer_keys.kept_new_tokens), once per forward."""
        if self._chunk_spans is None:
            prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
            new_lens = list(forward_batch.extend_seq_lens_cpu)
            req_to_token = self.req_to_token_pool.req_to_token
            spans, slots, row = [], [], 0
            # The host's copy (SGLang keeps one for plain extend batches): reading the
            # device's would wait for it.
            # (supports_query_chunks: present).
            pool_indices = forward_batch.req_pool_indices_cpu.tolist()
            for pool_index, p, n in zip(pool_indices, prefix_lens, new_lens):
                spans.append(Span(row, p, n))
                slots.append(req_to_token[pool_index, :p] if p else None)
                row += n
            self._chunk_spans = (spans, slots, kept_new_tokens(pool_indices, new_lens))
        return self._chunk_spans


class _OnePass:
    """One forward's one-pass state: where its rows are written, and its attention."""

    def __init__(self, write_loc, attention) -> None:
        self.write_loc = write_loc
        self.attention = attention


def _members(pool_rows, prefix_lens, new_lens, state) -> list[Member]:
    """The batch's requests for one_pass.plan: each follower's leader by its request row
    (prefill_kv records them per forward: PrefillKvState.leaders), as a batch index."""
    position = {row: i for i, row in enumerate(pool_rows)}
    leaders = state.prefill_kv.leaders
    members = []
    for row, p, n in zip(pool_rows, prefix_lens, new_lens):
        leader = position.get(leaders.get(row, -1))
        members.append(Member(int(p), int(n), leader))
    return members


def _drops_kv() -> bool:
    """Whether this scheduler drops score prompts' suffix KV (prefill-only KV decided it
    at start-up: process_state.py)."""
    return process_state.current().prefill_kv.active

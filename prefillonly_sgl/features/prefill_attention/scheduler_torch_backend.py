"""Prefill-only attention backend: computes attention for new tokens only.

Stock SGLang's torch_native backend pads every request's queries to its full length and
recomputes causal attention over the cached prefix (`per_req_query_redudant`), so a
prefix-cache hit saves only the MLP and projections. This backend, for each request of
an extend batch, computes the attention of its new tokens against (cached prefix KV read
from the pool) + (its own new k / v, in hand), causal within the new part — with
PyTorch's fused SDPA, small requests batched (prefillonly_sgl/prefill_attention/).

Registration: SGLang's attention-backend registry (`register_attention_backend`) maps a
backend *name* to a factory. We re-register the names "torch_native" (CPU) and
"flashinfer" (GPU) with our factories instead of adding a new name, because SGLang keys
many decisions on these names (server-args validation, CUDA-graph and triton switches,
KV-allocation paths); a new name would need those patched too. For the same reason the
models SGLang's checks hold to other backends get ours under the names those checks allow:
"intel_amx" (a sink model on a CPU) and "triton" (EXAONE 4's windows on a CPU; a sink
model on CUDA, opt-in), each factory choosing ours by model and device and SGLang's own
otherwise (sink_models.py says precisely which checks refuse a name of our own). Only
processes whose runtime configuration lists "prefill_attention" are affected (see
plugin.py), so stock SGLang in the same environment stays stock.

What falls back to the stock implementation (unchanged behaviour): decode (except in
layers with attention sinks, which stock torch_native lacks: forward_decode here), forward
modes other than EXTEND / MIXED, encoder-decoder and encoder-only layers, SGLang's hybrid
sliding-window pool, q/k head dims different from the v head dim. Sliding-window layers
and attention sinks (gpt-oss: `layer.sliding_window_size`, the `sinks=` keyword SGLang's
attention passes) run here, masked by position (windowed.py); a layer with sinks never
falls back to the stock forward, which would drop them: it raises instead.

GPU: stock FlashInferAttnBackend already runs ragged attention over the new tokens
merged with paged attention over the cached prefix, so its forward stays stock;
PrefillOnlyFlashInferBackend (scheduler_flashinfer_backend.py, beside this file) adds what
prefill-only KV needs: it says when FlashInfer never reads new tokens from the pool, and
refuses a plan that would.

Debugging: PREFILLONLY_ATTENTION_LOG=<file> appends one "prefill_attention.plan" event
per extend batch (hooking/events.py): each request's (prefix, new) tokens, which ran
alone in how many blocks, which were batched, which shared one prefix.
PREFILLONLY_SHARED_PREFIX_ATTENTION=0 turns the shared-prefix groups off (each hit then
gathers and attends to its prefix on its own, as before): for A/B measurements
(benchmarks/forward_profile.py).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from prefillonly_sgl.features.prefill_attention import windowed
from prefillonly_sgl.features.prefill_attention.cpu_extend import ExtendAttention
from prefillonly_sgl.features.prefill_attention.layer_keys import LayerKeys, kept_new_tokens
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk
from prefillonly_sgl.features.prefill_attention.query_chunk import (
    QueryChunkAttention,
    query_chunks_supported,
)
from prefillonly_sgl.features.prefill_kv.policy import DROPPED_SLOT
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event

_SUPPORTED_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED)
_UNREAD = object()  # a forward's kept new tokens, not read yet


class PrefillOnlyTorchBackend(TorchNativeAttnBackend):
    """CPU (and any torch device) backend; see the module docstring."""

    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        self._model_runner = model_runner

    def prefill_only_kv_unsupported(self) -> str | None:
        """prefill_kv's question (asked once the model is loaded): could an extend batch
        read new tokens from the pool? Only in layers left to the stock forward (_handles)."""
        runner = self._model_runner
        if self.use_sliding_window_kv_pool:
            return "SGLang's hybrid sliding-window KV pool is read by the stock torch_native path"
        if runner.model_config.is_encoder_decoder:
            return "cross-attention layers use the stock torch_native path"
        return None

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(forward_batch)
        self.extend_attention = None
        self.kept_rows = None
        self._query_chunks = {}
        self._kept = _UNREAD
        if (
            forward_batch.forward_mode in _SUPPORTED_MODES
            and forward_batch.encoder_lens is None
            and not self.use_sliding_window_kv_pool
        ):
            self.extend_attention = self._plan(forward_batch)
            self.kept_rows = _kept_rows(forward_batch.out_cache_loc)

    def _plan(self, forward_batch) -> ExtendAttention:
        prefix_lens = _as_list(
            forward_batch.extend_prefix_lens_cpu, forward_batch.extend_prefix_lens
        )
        new_lens = _as_list(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens)
        pool_indices = forward_batch.req_pool_indices.tolist()
        req_to_token = self.req_to_token_pool.req_to_token
        spans, slots, start = [], [], 0
        for pool_index, prefix_len, n_new in zip(pool_indices, prefix_lens, new_lens):
            spans.append(Span(start, prefix_len, n_new))
            slots.append(req_to_token[pool_index, :prefix_len].long() if prefix_len else None)
            start += n_new
        shared = process_state.current().switches.shared_prefix_attention
        attention = ExtendAttention(spans, slots, device=self.device, shared_prefix=shared)
        _log_plan(attention)
        return attention

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
        if not self._handles(layer, k, v):
            _refuse_sinks(sinks, layer)
            _refuse_dropped_tokens(forward_batch)
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if save_kv_cache:
            # Kept for the prefix cache (and decode of generate requests). Rows whose KV
            # prefill-only KV dropped (DROPPED_SLOT) are not written at all.
            loc, k_saved, v_saved = forward_batch.out_cache_loc, k, v
            if self.kept_rows is not None:
                rows = self.kept_rows
                loc, k_saved, v_saved = loc[rows], k[rows], v[rows]
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(loc, self.swa_out_cache_loc), k_saved, v_saved
            )
        o = self.extend_attention(  # (T, H, Dv); one SDPA call's own output when it is one
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
            v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            layer.scaling,
            window=_window(layer),
            sinks=sinks,
        )
        return o.view(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None):
        """Stock decode, except in layers with attention sinks (stock torch_native has
        none): each request's one query against its keys in the pool (within the layer's
        window), then the sink. Decode runs only for generate requests, whose KV is whole."""
        if sinks is None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        _refuse_sinks(sinks if self.use_sliding_window_kv_pool else None, layer)
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        heads, window = layer.tp_q_head_num, _window(layer)
        q_ = q.reshape(-1, heads, layer.qk_head_dim)
        out = q_.new_empty((q_.shape[0], heads, layer.v_head_dim))
        k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = _as_list(getattr(forward_batch, "seq_lens_cpu", None), forward_batch.seq_lens)
        for r, (pool_index, seq_len) in enumerate(
            zip(forward_batch.req_pool_indices.tolist(), seq_lens)
        ):
            lo = windowed.first_key(seq_len - 1, window)
            slots = req_to_token[pool_index, lo:seq_len].long()
            seen = windowed.visible(
                torch.tensor([seq_len - 1], device=q.device),
                torch.arange(lo, seq_len, device=q.device),
                window,
            )
            o, lse = windowed.attend(q_[r : r + 1], k_buf[slots], v_buf[slots], seen, layer.scaling)
            out[r] = windowed.with_sinks(o, lse, sinks)[0].to(out.dtype)
        return out.view(q_.shape[0], heads * layer.v_head_dim)

    def supports_query_chunks(self, forward_batch) -> bool:
        """Whether this extend batch's layers may run in query chunks (hybrid prefilling,
        features/hybrid_prefill/layer_chunks.py): planned by this backend, no sliding-window
        pool."""
        return (
            getattr(self, "extend_attention", None) is not None
            and not self.use_sliding_window_kv_pool
            and str(self.device).startswith("cpu")  # the chunk kernels are torch's CPU ones
            and query_chunks_supported()
        )

    def new_layer_keys(self) -> LayerKeys:
        """What one layer call run in query chunks keeps for its later chunks and the pool
        does not hold (layer_keys.py), handed back to forward_query_chunk."""
        return LayerKeys()

    def forward_query_chunk(
        self, q, k, v, layer, forward_batch, start, end, sinks=None, layer_keys=None
    ):
        """forward_extend for the batch's rows [start, end) of a layer run in query
        chunks: saves the chunk's k / v to the pool (rows prefill-only KV keeps), keeps in
        `layer_keys` those of the other rows that later chunks read, and returns the
        attention of its queries against every key so far, (end - start, H * Dv).
        k / v: the chunk's own, (end - start, Hkv, D)."""
        if not self._handles(layer, k, v):
            raise RuntimeError(f"layer {layer.layer_id} cannot run in query chunks")
        n = end - start
        k = k.reshape(n, layer.tp_k_head_num, layer.qk_head_dim)
        v = v.reshape(n, layer.tp_v_head_num, layer.v_head_dim)
        loc, k_new, v_new = forward_batch.out_cache_loc[start:end], k, v
        if _drops_kv():
            kept = loc != DROPPED_SLOT
            if not bool(kept.all()):
                rows = kept.nonzero().squeeze(1)
                loc, k_new, v_new = loc[rows], k_new[rows], v_new[rows]
        if loc.numel():
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, None), k_new, v_new)
        del k_new, v_new
        spans = self.extend_attention.spans
        kept = self._kept_new_tokens(forward_batch)
        chunk = self._query_chunks.get((start, end))
        if chunk is None:  # planned once per forward, used by every layer
            plan = plan_query_chunk(spans, start, end, kept)
            own = None
            if plan.head is not None and plan.head_kept:
                first = spans[plan.head].q_start
                own = forward_batch.out_cache_loc[first : first + plan.head_kept]
            chunk = QueryChunkAttention(
                plan,
                spans,
                self.extend_attention.prefix_slots,
                own,
                device=self.device,
                shared_prefix=process_state.current().switches.shared_prefix_attention,
            )
            self._query_chunks[start, end] = chunk
        if layer_keys is None:  # one call over the batch: nothing for later chunks
            layer_keys = LayerKeys()
        earlier = layer_keys.step(chunk.plan, spans, kept, k, v)
        o = chunk(
            q.view(n, layer.tp_q_head_num, layer.qk_head_dim),
            k,
            v,
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            layer.scaling,
            window=_window(layer),
            sinks=sinks,
            earlier=earlier,
        )
        return o.reshape(n, layer.tp_q_head_num * layer.v_head_dim)

    def _kept_new_tokens(self, forward_batch) -> list[int]:
        """Per request of this forward, its new tokens that own a pool slot; read once per
        forward (layer_keys.kept_new_tokens)."""
        if getattr(self, "_kept", _UNREAD) is _UNREAD:
            self._kept = kept_new_tokens(
                forward_batch.req_pool_indices.tolist(),
                [span.n_new for span in self.extend_attention.spans],
            )
        return self._kept

    def _handles(self, layer, k, v) -> bool:
        return (
            getattr(self, "extend_attention", None) is not None
            and k is not None
            and v is not None
            and not layer.is_cross_attention
            and layer.attn_type != AttentionType.ENCODER_ONLY
            and layer.qk_head_dim == layer.v_head_dim
        )


def _window(layer) -> int | None:
    """The layer's sliding window as windowed.py takes it (SGLang's -1 / None: full)."""
    size = layer.sliding_window_size
    return None if size is None or size <= -1 else int(size)


def _refuse_sinks(sinks, layer) -> None:
    """The stock torch_native forward has no attention sinks: a layer with sinks left to
    it would score wrong (SGLang refuses torch_native for such models for this reason)."""
    if sinks is not None:
        raise RuntimeError(
            f"layer {layer.layer_id} has attention sinks, which the stock torch_native path "
            "(here: SGLang's hybrid sliding-window KV pool) does not apply"
        )


def _kept_rows(out_cache_loc):
    """Rows of the batch that own a pool slot, or None when all do (prefill-only KV gives
    the tokens it drops DROPPED_SLOT, which the allocator never hands out)."""
    if out_cache_loc is None or not _drops_kv():
        return None
    kept = out_cache_loc != DROPPED_SLOT
    if bool(kept.all()):
        return None
    return kept.nonzero().squeeze(1)


def _refuse_dropped_tokens(forward_batch) -> None:
    """The stock forward reads new tokens back from the pool: wrong for tokens whose KV
    prefill-only KV dropped (DROPPED_SLOT). prefill_kv turns itself off where this could
    happen; should a layer still get here with such tokens, fail loudly, not score wrong."""
    dropped = forward_batch.out_cache_loc == DROPPED_SLOT
    if _drops_kv() and bool(dropped.any()):
        raise RuntimeError(
            "a layer the prefill-only attention backend leaves to stock torch_native got "
            "tokens without pool KV (prefill-only KV); start with --disable-prefill-only-kv"
        )


def _as_list(cpu_list, tensor) -> list[int]:
    return list(cpu_list) if cpu_list is not None else tensor.tolist()


def _log_plan(attention: ExtendAttention) -> None:
    path = process_state.current().switches.attention_log
    if not path:
        return
    append_event(
        path,
        "prefill_attention.plan",
        spans=[[s.prefix_len, s.n_new] for s in attention.spans],  # (prefix, new) per request
        alone={str(i): len(blocks) for i, blocks in attention.alone},  # request: its blocks
        groups=[list(g.group.members) for g in attention.groups],
        shared_prefix=[list(g.group.members) for g in attention.shared],
    )


def create_torch_backend(runner):
    return PrefillOnlyTorchBackend(runner)


def create_flashinfer_backend(runner):
    """Our FlashInfer subclass for plain MHA models; SGLang's own factory otherwise
    (MLA models, EAGLE's extra stream)."""
    from sglang.srt.runtime_context import get_spec

    if runner.use_mla_backend or get_spec().speculative_algorithm is not None:
        return _STOCK_FACTORIES["flashinfer"](runner)
    from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
        PrefillOnlyFlashInferBackend,
    )

    return PrefillOnlyFlashInferBackend(runner, init_new_workspace=runner.init_new_workspace)


_STOCK_FACTORIES: dict = {}


def create_intel_amx_backend(runner):
    """Ours for models with attention sinks, which sink_models.py asks SGLang to run
    under SGLang's CPU name "intel_amx" (SGLang's own choice for gpt-oss on a CPU; its
    check refuses torch_native for them); SGLang's AMX backend for any other model a user
    runs on it."""
    if runner.model_config.has_attention_sinks:
        return PrefillOnlyTorchBackend(runner)
    return _STOCK_FACTORIES["intel_amx"](runner)


def create_triton_backend(runner):
    """Ours on a CPU, where window_models.py asks SGLang for "triton" (its check holds
    EXAONE 4's windows to fa3 / triton / trtllm_mha, and triton has no CPU driver); on
    CUDA our FlashInfer backend for a model with attention sinks where the opt-in asked
    for "triton" (sink_models.py); SGLang's Triton backend otherwise."""
    if runner.device == "cpu":
        return PrefillOnlyTorchBackend(runner)
    if runner.model_config.has_attention_sinks and process_state.current().switches.cuda_sinks:
        return create_flashinfer_backend(runner)
    return _STOCK_FACTORIES["triton"](runner)


def register() -> None:
    """Plugin feature "prefill_attention": our factories under SGLang's backend names."""
    from sglang.srt.layers.attention import attention_registry

    for name, factory in (
        ("torch_native", create_torch_backend),
        ("intel_amx", create_intel_amx_backend),
        ("triton", create_triton_backend),
        ("flashinfer", create_flashinfer_backend),
    ):
        _STOCK_FACTORIES.setdefault(name, attention_registry.ATTENTION_BACKENDS[name])
        attention_registry.register_attention_backend(name)(factory)


def _drops_kv() -> bool:
    """Whether this scheduler drops score prompts' suffix KV (prefill-only KV decided it
    at start-up: process_state.py)."""
    return process_state.current().prefill_kv.active

"""The SGLang symbols the runtime features hook, call or replace, and why: prefill-only
attention (with sinks and windows) and KV, the JCT scheduler, hybrid prefilling and prompt
logprobs (prefillonly_sgl/features/). Part of hook_targets.HOOK_TARGETS (see there),
resolved by tests/test_sglang_hook_targets.py."""

from __future__ import annotations

FEATURE_TARGETS: dict[str, str] = {
    # -- prefill-only attention (features/prefill_attention/scheduler_torch_backend.py) --
    "sglang.srt.layers.attention.attention_registry.register_attention_backend": (
        "re-registers SGLang's names torch_native, flashinfer, intel_amx and triton with "
        "our factories (scheduler_torch_backend.register), never a name of our own: the "
        "registry would take one, but SGLang's resolution keys on names it lists "
        "(handle_model_specific_adjustments' GptOssForCausalLM list, local to it; "
        "arg_groups.choices.ATTENTION_BACKEND_CHOICES; handle_page_major_kv_layout's and "
        "the KV4 checks' sets), which only patching SGLang would extend (sink_models.py)"
    ),
    "sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS": (
        "name -> factory; the stock factories are kept for MLA / speculative decoding"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend": (
        "base class of PrefillOnlyTorchBackend (decode and unsupported layers stay stock)"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend": (
        "overridden: attention of the new tokens only"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
    ".init_forward_metadata": "overridden: plans the batch's SDPA calls once per forward",
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend": (
        "base class of PrefillOnlyFlashInferBackend (GPU; ragged + paged already)"
    ),
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch": (
        "reads extend_prefix_lens(_cpu), extend_seq_lens(_cpu), req_pool_indices, "
        "out_cache_loc, encoder_lens, forward_mode"
    ),
    "sglang.srt.model_executor.forward_batch_info.ForwardMode.EXTEND": "modes we handle",
    "sglang.srt.model_executor.forward_batch_info.ForwardMode.MIXED": "modes we handle",
    "sglang.srt.mem_cache.memory_pool.KVWriteLoc": "where set_kv_buffer writes the new KV",
    "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.get_key_buffer": "prefix keys",
    "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.get_value_buffer": "prefix values",
    "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer": "saves new KV",
    "sglang.srt.layers.radix_attention.AttentionType.ENCODER_ONLY": "left to stock",
    "sglang.srt.runtime_context.get_spec": "speculative decoding -> stock flashinfer factory",
    "sglang.srt.runtime_context.get_exec": (
        "called (score_front.py): under multi-item scoring (--enable-mis) a text score "
        "call keeps SGLang's text path (its delimiter is text there)"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_batch_request": (
        "relied on: a batch without text goes to the scheduler as one message, which is "
        "why ScoringFront sends a text call as token ids (scoring/text_prompts.py)"
    ),
    # -- attention sinks and sliding windows (gpt-oss; features/prefill_attention/) --
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode": (
        "overridden for layers with attention sinks (stock has none); stock otherwise"
    ),
    "sglang.srt.layers.attention.base_attn_backend.AttentionBackend.forward": (
        "relied on: passes the model's sinks= keyword on to forward_extend / forward_decode"
    ),
    "sglang.srt.models.gpt_oss.GptOssAttention.forward_core": (
        "relied on: calls the attention with sinks= (kept in bfloat16 unless trtllm_mha)"
    ),
    "sglang.srt.models.gpt_oss.get_attention_sliding_window_size": (
        "relied on: layer.sliding_window_size = the config's sliding_window - 1, which "
        "windowed.visible reads as torch_native's mask does (q - window <= k <= q)"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
    "._make_sliding_window_mask": "the window's meaning, which windowed.visible keeps",
    "sglang.srt.layers.attention.attention_registry.create_intel_amx_backend": (
        "kept (as ATTENTION_BACKENDS['intel_amx']) for models without sinks; ours "
        "registered under intel_amx serves models with sinks"
    ),
    "sglang.srt.layers.attention.attention_registry.create_triton_backend": (
        "kept (as ATTENTION_BACKENDS['triton']) for every other runner; ours registered "
        "under triton serves CPU runners (window_models.py asks for it for EXAONE 4's "
        "windows) and, on CUDA with PREFILLONLY_CUDA_SINKS=1, sink models (our FlashInfer "
        "backend: sink_models.py asks for triton, which SGLang's gpt-oss check allows)"
    ),
    "sglang.srt.arg_groups.model_overrides.exaone._exaone_overrides": (
        "relied on: picks triton on a CPU when no backend is given, and sets "
        "disable_hybrid_swa_memory for a model with a sliding-window pattern"
    ),
    "sglang.srt.configs.model_config.ModelConfig._detect_attention_sinks": (
        "sets has_attention_sinks, which picks our backend under intel_amx and steers a "
        "sink model there (sink_models.py)"
    ),
    "sglang.srt.arg_groups.resolution_hooks.register_resolution_hook": (
        "SGLang's plugin API for resolution steps: our wrapper of handle_cpu_backends "
        "(features/prefill_attention/tokenizer_process.py)"
    ),
    "sglang.srt.arg_groups.platform_hook.handle_cpu_backends": (
        "wrapped (by name, through register_resolution_hook): a sink model on CPU asks "
        "for intel_amx, with disable_hybrid_swa_memory"
    ),
    "sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments": (
        "relied on: refuses torch_native for GptOssForCausalLM, accepts intel_amx; holds "
        "EXAONE 4 with windows to fa3 / triton / trtllm_mha; runs after handle_cpu_backends. "
        "Its gpt-oss list is a literal inside it: why a sink model runs ours under "
        "intel_amx / triton, not a name of our own (sink_models.py)"
    ),
    "sglang.srt.arg_groups.overrides._attention_backend_platform_fallbacks": (
        "relied on: intel_amx becomes torch_native where SGLang's AMX kernels are absent "
        "(both names are our backend for a sink model)"
    ),
    "sglang.srt.arg_groups.overrides.declare_resolution": "declares the sink model's fields",
    "sglang.srt.arg_groups.overrides.resolving_view": "the device and backends so far",
    "sglang.srt.arg_groups.model_override_base.resolved_view": (
        "hybrid prefilling's limit: the scheduler's resolved chunked_prefill_size, "
        "max_prefill_tokens and prefill graph buckets"
    ),
    "sglang.srt.configs.model_config.ModelConfig.from_server_args": (
        "a throwaway ModelConfig (has_attention_sinks) while the arguments resolve, unless "
        "SGLang memoized one on them already (its _model_config, model_config_of's memo)"
    ),
    "sglang.srt.arg_groups.model_override_base.model_config_of": (
        "relied on: memoizes the ModelConfig as server_args._model_config, which "
        "tokenizer_process reads when present"
    ),
    "sglang.srt.server_args.ServerArgs.disable_hybrid_swa_memory": (
        "set for sink models: one KV pool for sliding and full layers (the prefill-only "
        "kernels read no SWA pool)"
    ),
    # -- prefill-only KV (features/prefill_kv/), all via HookRegistry --
    # (features/prefill_kv/tokenizer_process.py: for prefill_kv and jct_scheduler)
    "sglang.srt.managers.tokenizer_manager_score_mixin.TokenizerManagerScoreMixin"
    ".score_request": "AROUND: tokenizes the query once per score call (contextvar)",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object": (
        "AFTER: stores the reusable-prefix length in SamplingParams.custom_params"
    ),
    "sglang.srt.managers.tokenizer_manager_score_mixin.TokenizerManagerScoreMixin"
    "._validate_score_extraction": (
        "AROUND: where prefill-only KV runs, a causal LM's setwise check is SGLang's "
        "item_first and auto-truncation conditions with its messages (features/prefill_kv/"
        "setwise.py); the radix-cache and chunked-prefill ones are met by prefill-only KV"
    ),
    "sglang.srt.runtime_context.get_serving": ("read by that check: SGLang's allow_auto_truncate"),
    "sglang.srt.managers.tokenizer_manager_score_mixin.TokenizerManagerScoreMixin"
    "._resolve_score_extraction_token_id": (
        "called by ScoringFront: Engine.score's score_extraction_token text resolved to a "
        "dedicated token id as SGLang's /v1/score resolves it"
    ),
    "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend": (
        "AFTER: a setwise request's anchors (token_indices_to_pool) as rows of its extend, "
        "after the prefix it got from the cache or its leader"
    ),
    "sglang.srt.managers.schedule_batch.FINISH_ABORT": (
        "the finish reason of a request a scheduler hook fails alone (status and message "
        "reach the caller): a setwise request with an anchor in its cached prefix "
        "(prefill_kv/scheduler_process._fail_setwise_request, as its discard_output_reason), "
        "prompt logprobs that do not add up (prompt_logprobs/scheduler_process._fail)"
    ),
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_prefill": (
        "relied on: a request whose discard_output_reason is set finishes with it, its "
        "forward's output dropped and its KV released without entering the prefix cache"
    ),
    "sglang.srt.managers.io_struct.TokenizedGenerateReqInput": "the per-prompt request",
    "sglang.srt.sampling.sampling_params.SamplingParams.custom_params": (
        "per-request JSON dict carried to the scheduler's Req (our key: reusable length)"
    ),
    "sglang.srt.managers.schedule_batch.Req.is_prefill_only": (
        "only max_new_tokens == 0 (ours: kv.policy.runs_one_forward, 0 or 1 with R)"
    ),
    "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens": (
        "AROUND: a single-token request keeps its one token (SGLang clips it to what the "
        "pool leaves after the prompt: 0 for a prompt longer than the pool)"
    ),
    "sglang.srt.managers.scheduler.Scheduler._reqs_finishing_inflight": (
        "relied on: the overlapped loop leaves a request its queued prefill result "
        "finishes by length (a single-token request) out of the next decode step, so "
        "no slot past its kept KV boundary is committed"
    ),
    "sglang.srt.managers.schedule_batch.Req.next_output_finishes_by_length": (
        "relied on, by _reqs_finishing_inflight (max_new_tokens == 1: the first token)"
    ),
    # -- JCT scheduler (features/jct_scheduler/scheduler_process.py) --
    "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy": (
        "AFTER: the scheduler's SchedulePolicy becomes JctSchedulePolicy"
    ),
    "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class": (
        "AFTER: SGLang's extension point for the PrefillAdder; ours admits only the plan"
    ),
    "sglang.srt.managers.schedule_policy.SchedulePolicy": (
        "base of JctSchedulePolicy (calc_priority replaced; the rest inherited)"
    ),
    "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority": (
        "called by the scheduler before every prefill batch: where the plan is made"
    ),
    "sglang.srt.managers.schedule_policy.PrefillAdder": "base of the planned adder",
    "sglang.srt.mem_cache.base_prefix_cache.MatchPrefixParams": "radix-cache matches",
    "sglang.srt.mem_cache.radix_cache.RadixKey": (
        "a request's tokens as a match key (limit=: its reusable prefix only, no copy)"
    ),
    "sglang.srt.mem_cache.radix_cache.RadixCache.match_prefix": (
        "device_prefix_len: how much of a prompt the cache holds now"
    ),
    "sglang.srt.mem_cache.radix_cache.RadixCache.evict": (
        "AFTER: counts evictions; after one every prefix group is matched again"
    ),
    "sglang.srt.mem_cache.radix_cache.RadixCache": (
        "evictions are counted for this exact class; other caches (SGLang's default "
        "UnifiedRadixCache): every group matched each step"
    ),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache": (
        "the default tree cache; queue-aware eviction applies to this exact class"
    ),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.evict_for_alloc": (
        "AROUND (queue-aware eviction): the allocator's eviction (params.num_tokens: the "
        "shortfall) run with the waiting groups' prefixes locked, released one at a time "
        "only when it frees too little"
    ),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.lock": (
        "a waiting group's cached prefix (match_prefix's last_device_node) -> TreeLock"
    ),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.unlock": "releases it",
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.evictable_size": (
        "with the waiting prefixes locked: the room a batch has without evicting them"
    ),
    "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator.available_size": (
        "tree_cache.token_to_kv_pool_allocator: free pool tokens (queue-aware eviction)"
    ),
    "sglang.srt.mem_cache.base_prefix_cache.EvictParams": "num_tokens (a dataclass)",
    "sglang.srt.mem_cache.base_prefix_cache.EvictResult": "num_tokens_evicted",
    "sglang.srt.observability.req_time_stats.SchedulerReqTimeStats.set_wait_queue_entry_time": (
        "Req.time_stats.wait_queue_entry_time (perf_counter seconds): when it joined"
    ),
    # -- hybrid prefilling (features/hybrid_prefill/scheduler_process.py) --
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": (
        "AFTER: the loaded model's token-wise modules run chunk by chunk "
        "(features/hybrid_prefill/chunking.py)"
    ),
    "sglang.srt.layers.layernorm.RMSNorm": (
        "chunked: forward(x[, residual[, post_residual_addition]]), attribute variance_epsilon"
    ),
    "sglang.srt.layers.rotary_embedding.RotaryEmbedding": (
        "chunked in place: forward(positions, query, key) -> (query, key), cos_sin_cache"
    ),
    "sglang.srt.models.llama.LlamaMLP": "chunked: a gated MLP (gate_up_proj, down_proj)",
    "sglang.srt.models.qwen2.Qwen2MLP": "chunked: a gated MLP (gate_up_proj, down_proj)",
    # mode 'layer' (features/hybrid_prefill/layer_chunks.py): any decoder layer with one
    # causal RadixAttention and a known residual convention; these are the family table's
    "sglang.srt.models.llama.LlamaDecoderLayer.forward": (
        "replaced per instance in mode 'layer': called per slice of rows, (positions, "
        "hidden_states, forward_batch, capture_output) -> output; residual in "
        "forward_batch.residual_stream (attn_boundary / ffn_boundary); Mistral, Phi-3 too"
    ),
    "sglang.srt.models.qwen2.Qwen2DecoderLayer.forward": "the same, for Qwen2 layers",
    "sglang.srt.models.qwen3.Qwen3DecoderLayer.forward": "the same, for Qwen3 layers",
    "sglang.srt.models.qwen3_moe.Qwen3MoeDecoderLayer.forward": "the same, Qwen3-MoE",
    "sglang.srt.models.glm4.Glm4DecoderLayer.forward": "the same, GLM-4 (output transforms)",
    "sglang.srt.models.gpt_oss.GptOssDecoderLayer.forward": "the same, gpt-oss (attention sinks)",
    "sglang.srt.models.granite.GraniteDecoderLayer.forward": (
        "replaced per instance in mode 'layer': (positions, hidden_states, forward_batch, "
        "residual) -> (hidden_states, residual), called per slice of rows"
    ),
    "sglang.srt.models.gemma3_causal.Gemma3DecoderLayer.forward": (
        "the same, with positions (1, T) and position_embeddings_global / _local (cos, sin) "
        "of (1, T, D), cut along T"
    ),
    "sglang.srt.models.olmo2.Olmo2DecoderLayer.forward": (
        "replaced per instance in mode 'layer': (positions, hidden_states, forward_batch) -> "
        "the complete stream, called per slice of rows"
    ),
    "sglang.srt.layers.radix_attention.RadixAttention.forward": (
        "replaced per instance on the layers run in query chunks: (q, k, v, forward_batch, "
        "save_kv_cache, sinks=) goes to the backend's forward_query_chunk during a slice, "
        "to this forward otherwise"
    ),
    "sglang.srt.layers.layer_boundary.residual.batch.fold": (
        "the residual stream as one complete tensor, left as the stream's written residual; "
        "each slice's output folded the same way"
    ),
    "sglang.srt.layers.layer_boundary.residual.stream.ResidualStream": (
        "a written stream of one slice's rows set as forward_batch.residual_stream while the "
        "slice runs (the boundary checks it is handed that very tensor)"
    ),
    "sglang.srt.layers.layer_boundary.residual.batch.set_written": (
        "the layer's whole output left as the stream's written residual"
    ),
    "sglang.srt.model_executor.forward_context.get_attn_backend": (
        "the batch's attention backend (forward_query_chunk), as RadixAttention finds it"
    ),
    "sglang.srt.layers.radix_attention.RadixAttention": (
        "tp_q_head_num, tp_k_head_num, tp_v_head_num, qk_head_dim, v_head_dim, scaling, "
        "layer_id, attn_type, is_cross_attention, logit_cap, use_irope (which layers qualify)"
    ),
    # -- prompt logprobs (features/prompt_logprobs/scheduler_process.py, scheduler) --
    "sglang.srt.managers.schedule_batch.Req.init_next_round_input": (
        "AROUND: an echo request matches uncapped, then extends from the positions whose "
        "entries the side table holds (its logprob_start_len becomes that length); "
        "continuation calls rely on its stock cap of the match at logprob_start_len "
        "(continuation_logprobs.py: the prompt's last position is recomputed, no more)"
    ),
    "sglang.srt.managers.schedule_batch.Req._compute_max_prefix_len": (
        "stock: caps the match at logprob_start_len, which the hook above sets (and "
        "prefill_kv's tokenizer side, at a setwise prompt's first anchor); called by "
        "prefill_kv's adder hook: a packed follower's prefix is capped as a match is"
    ),
    "sglang.srt.managers.scheduler_components.logprob_result_processor."
    "SchedulerLogprobResultProcessor.add_input_logprob_return_values": (
        "AROUND: computed entries into the table, cached ones spliced in front"
    ),
    "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc": (
        "AFTER: slots handed out again lose their table entries"
    ),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.prefix_device_indices": (
        "the matched prefix's KV slots (SGLang's default prefix cache), the table's keys"
    ),
    "sglang.srt.mem_cache.radix_cache.RadixCache.prefix_device_indices": (
        "the same for the classic radix cache"
    ),
    "sglang.srt.layers.logprob_processor.InputLogprobProcessor.__init__": (
        "AFTER: enable_logprobs_chunk / logprobs_chunk_size from our settings"
    ),
}

"""Every SGLang symbol this project calls, hooks or replaces, and why.

SGLang's internals move fast (thousands of changed lines per release), so the version is
pinned exactly and tests/test_sglang_hook_targets.py resolves every entry below: an
upgrade that renames or removes one fails that test instead of misbehaving at run time.
Add an entry in the same change that starts using a symbol.
"""

from __future__ import annotations

HOOK_TARGETS: dict[str, str] = {
    # -- called (offline engine) --
    "sglang.srt.entrypoints.engine.Engine": "the offline engine prefillonly_sgl.Engine wraps",
    "sglang.srt.utils.hf_transformers_utils.get_tokenizer": (
        "called by serve before SGLang starts (http_server.check_endpoints_before_start), "
        "with the arguments TokenizerManager passes it: the endpoints' label checks run on "
        "the tokenizer the server will use"
    ),
    "sglang.srt.entrypoints.engine.Engine.score": (
        "not called: ScoringFront runs TokenizerManager.score_request on the engine's loop "
        "(Engine.loop.run_until_complete), exactly as this method does"
    ),
    "sglang.srt.entrypoints.engine.Engine.get_server_info": (
        "the scheduler's start-up info (max_req_input_len, our score limit) for validation"
    ),
    "sglang.srt.entrypoints.engine.Engine.shutdown": "stops the worker processes",
    "sglang.srt.entrypoints.engine.kill_process_tree": (
        "AROUND (offline_engine.HOOKS): kills only the processes of the engine this thread "
        "is shutting down; while an Engine of ours starts, SGLang's launch-phase SIGQUIT "
        "handler (a worker failed) does not kill the caller's process"
    ),
    "sglang.srt.entrypoints.engine._set_envs_and_config": (
        "relied on: installs the launch-phase SIGQUIT handler, kill_process_tree(os.getpid()), "
        "which the hook above defuses and start_sglang_engine replaces after start"
    ),
    "sglang.srt.configs.qwen3_next.Qwen3NextConfig.__init__": (
        "AFTER (model_configs.HOOKS, every prefillonly process): full_attention_interval "
        "read from layer_types where a config written by transformers lacks it"
    ),
    "sglang.srt.configs.olmo3.Olmo3Config.__init__": (
        "AFTER (model_configs.HOOKS, every prefillonly process): rope_theta and the full "
        "layers' scaling read from rotary parameters kept per layer type (transformers 5)"
    ),
    "sglang.srt.models.exaone4.Exaone4ForCausalLM.__init__": (
        "BEFORE (model_configs.HOOKS): rope_theta from transformers 5's rope_parameters and "
        "sliding_window_pattern as the string SGLang's EXAONE 4 takes the length of"
    ),
    "sglang.srt.models.exaone4.Exaone4Attention.__init__": (
        "AFTER (model_configs.HOOKS): its q / k norms' variance_epsilon set to the config's "
        "rms_norm_eps (SGLang's code leaves them at 1e-6)"
    ),
    "sglang.srt.layers.layernorm.RMSNorm.__init__": (
        "relied on: keeps its epsilon as variance_epsilon (EXAONE 4's q / k norms)"
    ),
    "sglang.srt.entrypoints.engine.mp": (
        "the multiprocessing module SGLang's engine takes Process and Pipe from: swapped "
        "while an Engine or `serve` starts with PREFILLONLY_WORKER_START=forkserver "
        "(worker_forkserver.py)"
    ),
    "sglang.srt.managers.scheduler.run_scheduler_process": (
        "relied on: loads SGLang's plugins first thing in the worker (a forked worker's "
        "environment is restored before), imported by the forkserver's preload"
    ),
    "sglang.srt.managers.detokenizer_manager.run_detokenizer_process": (
        "relied on, as run_scheduler_process; imported by the forkserver's preload"
    ),
    "sglang.srt.entrypoints.engine._wait_for_scheduler_ready": (
        "relied on: raises when the scheduler's pipe handshake fails or it dies at start "
        "(the Engine's EngineStartError)"
    ),
    "sglang.srt.managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler": (
        "removed from an Engine of ours' event loop (it kills the caller's process tree when "
        "a worker fails); WorkerWatch reports the dead worker instead"
    ),
    "sglang.srt.utils.watchdog.SubprocessWatchdog.stop": (
        "an Engine of ours stops SGLang's watchdog (its answer to a dead worker is a SIGQUIT "
        "to the caller); WorkerWatch replaces it"
    ),
    # -- CPU support: names SGLang imports from sgl_kernel on the CPU path --
    "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func": (
        "calls sgl_kernel.assign_req_to_token_pool_cpu, provided by cpu_support"
    ),
    "sglang.kernels.ops.kvcache.cache_move.copy_all_layer_kv_cache_func": (
        "calls sgl_kernel.copy_all_layer_kv_cache_cpu, provided by cpu_support"
    ),
    "sglang.srt.utils.common.is_cpu": "reads SGLANG_USE_CPU_ENGINE, set by cpu_support.boot",
    # -- CPU support: hybrid linear-attention models (Qwen3.5, Qwen3-Next) --
    "sglang.srt.models.qwen3_5.fused_qkvzba_split_reshape_cat_contiguous": (
        "bound at import to torch.ops.sgl_kernel ops on CPU, which cpu_support.sgl_kernel_ops "
        "registers (with fused_sigmoid_mul_cpu and the fused q/k Gemma norms)"
    ),
    "sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_fn": (
        "sgl_kernel.mamba.causal_conv1d_fn_cpu on CPU, served by cpu_support.sgl_kernel_mamba"
    ),
    "sglang.srt.layers.attention.linear.gdn_backend.fused_gdn_gating": (
        "torch.ops.sgl_kernel.fused_gdn_gating_cpu on CPU (cpu_support.sgl_kernel_ops)"
    ),
    "sglang.srt.layers.attention.linear.kernels.gdn_triton.chunk_gated_delta_rule": (
        "sgl_kernel.mamba.chunk_gated_delta_rule_cpu on CPU (cpu_support.sgl_kernel_mamba)"
    ),
    "sglang.kernels.ops.attention.fla.layernorm_gated._use_cpu": (
        "set after import on CPU (cpu_support.sglang_patches): the gated norm's CPU branch"
    ),
    "sglang.kernels.ops.attention.fla.fused_norm_gate._use_cpu": (
        "set after import on CPU (cpu_support.sglang_patches): Qwen3-Next's gated norm"
    ),
    "sglang.srt.layers.attention.mamba.causal_conv1d.causal_conv1d_fn": (
        "replaced after import on CPU (cpu_support/sglang_patches.short_conv_in_torch): "
        "LFM2's short convolution in torch"
    ),
    "sglang.srt.layers.attention.mamba.causal_conv1d.causal_conv1d_update": (
        "replaced after import on CPU: the convolution's one-token step in torch"
    ),
    "sglang.srt.layers.attention.mamba.mamba.mamba_chunk_scan_combined": (
        "replaced after import on CPU (sglang_patches.mamba2_in_torch): Mamba2's scan in "
        "torch (with the mixer's convolution names, unbound there on a CPU)"
    ),
    "sglang.srt.layers.attention.mamba.mamba.selective_state_update": (
        "replaced after import on CPU: Mamba2's one-token step in torch"
    ),
    "sglang.srt.layers.attention.mamba.mamba.MambaMixer2.forward": (
        "relied on: calls causal_conv1d_fn(_triton), mamba_chunk_scan_combined (varlen, "
        "return_track_states) and selective_state_update through its module's names"
    ),
    "sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul": (
        "replaced after import on CPU by a torch version (a Triton kernel off AMX)"
    ),
    "sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul_add": (
        "replaced after import on CPU by a torch version (a Triton kernel off AMX)"
    ),
    "sglang.srt.configs.mamba_utils.mamba2_state_dtype": (
        "reads SGLANG_MAMBA_CONV_DTYPE, which a float32 engine sets to float32 "
        "(RuntimeConfig.sglang_environment_defaults)"
    ),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend": (
        "read (full_attn_backend) by prefill_kv's start-up check"
    ),
    "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.prepare_for_caching_req": (
        "relied on: a chunk's end keeps a copy of the state (no_buffer), which a recurrent "
        "model's split at R (prefill_kv) leaves in the cache"
    ),
    # -- the engine kit's card (cuda_kit_support.boot): SGLang's CUDA path without sgl-kernel --
    "sglang.srt.layers.dual_gemm.DualGemm._select_mode": (
        "replaced after import where nvidia-cutlass-dsl is absent: the CuTe DSL dual GEMM "
        "module it imports on CUDA needs it"
    ),
    "sglang.srt.environ.envs.SGLANG_FORCE_FUSED_OP_BACKEND": (
        "set to torch (a default) by cuda_kit_support: fused ops on their torch paths"
    ),
    "sglang.srt.environ.envs.SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": (
        "set (a default) by cuda_kit_support: no sgl-kernel to check"
    ),
    "sglang.srt.environ.envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": (
        "set to python (a default) by cuda_kit_support: the Rust tree is built against torch 2.14"
    ),
    # -- server (sglang_runtime/http_server/) --
    "sglang.srt.entrypoints.http_server.app": (
        "SGLang's FastAPI app: we add a middleware, routes, an exception handler and wrap "
        "its router.lifespan_context before it starts"
    ),
    "sglang.srt.entrypoints.http_server.get_global_state": (
        "the running TokenizerManager (limits, tokenizer, score_request, abort_request)"
    ),
    "sglang.srt.entrypoints.http_server._GlobalState": (
        "its scheduler_info field (the scheduler's start-up info) gives the server's limits"
    ),
    "sglang.srt.entrypoints.http_server.validate_json_request": (
        "content-type check kept on our replacement /v1/score route"
    ),
    "sglang.srt.entrypoints.openai.protocol.ScoringRequest": (
        "body model of /v1/score; also what the DSL's RemoteBackend sends"
    ),
    "sglang.srt.entrypoints.openai.serving_score.OpenAIServingScore.handle_request": (
        "SGLang's /v1/score handler, called by our route (app.state.openai_serving_score)"
    ),
    "sglang.srt.entrypoints.http_server.available_models": (
        "SGLang's GET /v1/models, called by our route, which adds System One's `models`"
    ),
    "sglang.srt.entrypoints.http_server.v1_decisions_request": (
        "SGLang's /v1/decisions route, replaced by apis/decisions.py (REPLACED_PATHS)"
    ),
    "sglang.srt.entrypoints.http_server.systemone_decisions": (
        "SGLang's /v1/systemone route, replaced by apis/decisions.py (REPLACED_PATHS)"
    ),
    "sglang.launch_server.run_server": "runs the server exactly as `sglang serve` does",
    "sglang.srt.server_args.prepare_server_args": (
        "what server_flags.py does in two steps (parse once, build ServerArgs after our "
        "configuration); a test compares the two"
    ),
    "sglang.srt.server_args.ServerArgs.add_cli_args": (
        "SGLang's parser: serve's flags parsed once (server_flags.py) and listed in --help"
    ),
    "sglang.srt.server_args.ServerArgs.from_cli_args": "ServerArgs from the parsed values",
    "sglang.srt.utils.server_args_config_parser.ConfigArgumentMerger.merge_config_with_args": (
        "a --config file merged into serve's flags as `sglang serve` merges it"
    ),
    "sglang.srt.sampling.watermarking.core.redact_watermark_command_line": (
        "the launch command SGLang keeps on ServerArgs, as prepare_server_args sets it"
    ),
    "sglang.srt.utils.kill_process_tree": "no worker process outlives `serve`",
    "sglang.srt.sampling.custom_logit_processor.CustomLogitProcessor.from_str": (
        "a request's custom logit processor loaded first in a throwaway child process, "
        "never in the HTTP process (http_server/processor_check.py): a 400, not a stopped "
        "scheduler"
    ),
    # -- decision checkpoints (http_server/systemone_checkpoints.py, decisions/checkpoints.py) --
    "sglang.srt.entrypoints.systemone.serving.SystemOneServing": (
        "subclassed: /v1/systemone on a decision checkpoint is SGLang's own handler, built "
        "from app.state.openai_serving_chat as SGLang's app builds its own"
    ),
    "sglang.srt.entrypoints.systemone.serving.SystemOneServing._score": (
        "overridden: a causal decision_config checkpoint's prompts scored as their shared "
        "prefix (the state) once and each question behind it (score_request with a query)"
    ),
    "sglang.srt.entrypoints.systemone.serving.SystemOneServing.handle_request": (
        "called: the handler's validation, prompts, heads and answer"
    ),
    "sglang.srt.entrypoints.openai.serving_decisions._encode_all": (
        "called by the _score override: the questions' prompt and label ids, as SGLang's"
    ),
    "sglang.srt.entrypoints.systemone.kev._DELIMITERS": (
        "Kev's delimiter tokens: a question's prompt is reusable up to its question delimiter"
    ),
    "sglang.srt.entrypoints.systemone.serving.SystemOneServing._pointer_request": (
        "extended: Kev's per-question prompts carry their reusable prefix (the state)"
    ),
    "sglang.srt.entrypoints.systemone.protocol.SystemOneRequest": (
        "parses the body, so a body SGLang refuses is refused with its validation errors"
    ),
    "sglang.srt.configs.model_config.ModelConfig": (
        "its decision_config, joint_head_config and pointer_head attributes (what SGLang's "
        "loaders found beside the weights) name the readout (ScoringFront.readout)"
    ),
    "sglang.srt.layers.pointer_head.PointerPooler.forward": (
        "AROUND (prefill_kv/scheduler_process.py): Kev's head reads its positions behind a "
        "cached state (the layouts moved back by the cached length)"
    ),
    "sglang.srt.arg_groups.model_hook.handle_model_capability_adjustments": (
        "wrapped (register_resolution_hook, prefill_kv/tokenizer_process.py): after it turns "
        "the prefix cache off for a Kev checkpoint, ours turns it back on"
    ),
    # -- keys (http_server/access.py) --
    "sglang.srt.utils.auth.decide_request_auth": (
        "AROUND (access.HOOKS): the admin key opens normal routes too, so an admin can send "
        "what needs it there (a custom logit processor); SGLang decides otherwise"
    ),
    "sglang.srt.utils.auth.AuthLevel": (
        "the level every route serve adds declares (its endpoint's _auth_level), read by "
        "SGLang's API-key middleware"
    ),
    "sglang.srt.utils.auth.add_api_key_middleware": (
        "relied on: SGLang adds it at start, outside our middlewares, so a missing or wrong "
        "key is refused before a body is read"
    ),
    "sglang.srt.entrypoints.http_server.server_info": (
        "GET /server_info: answered through server/redaction.redact (SGLang 0.5.23 answers "
        "api_key and admin_api_key in plain text, its issue #30166)"
    ),
    "sglang.srt.entrypoints.http_server.get_server_info": (
        "GET /get_server_info: the same, redacted"
    ),
    "sglang.srt.entrypoints.engine._server_args_for_logging": (
        "AROUND (redacted_settings.HOOKS, serve and the Engine): the start-up "
        "`server_args=` log line without the keys"
    ),
    "sglang.srt.server_args.ServerArgs.resolved_dict": (
        "the server's settings, from which the secret values kept out of answers and logs "
        "are taken (redaction.secret_values)"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request": (
        "wrapped per instance (request_recording.py): records each HTTP request's or "
        "Engine.score call's rids and meta_info (usage, cached_tokens)"
    ),
    # -- classification heads as their checkpoints are (head_models.py) --
    "sglang.srt.models.qwen2_classification.Qwen2ForSequenceClassification.load_weights": (
        "AROUND: the score layer's bias zeroed where the checkpoint has none (SGLang's is "
        "nn.Linear's random init)"
    ),
    "sglang.srt.models.qwen3_classification.Qwen3ForSequenceClassification.load_weights": (
        "AROUND: as Qwen2's"
    ),
    # -- LoRA adapters per request (scoring/adapters.py) --
    "sglang.srt.managers.io_struct.GenerateReqInput._normalize_lora_paths": (
        "spreads the lora_path request_recording.py's wrapper writes (the call's adapter, "
        "from its context, where the request names none) over a batch's prompts"
    ),
    "sglang.srt.managers.io_struct.EmbeddingReqInput._normalize_lora_paths": (
        "as GenerateReqInput's (a classification head's score prompts)"
    ),
    "sglang.srt.managers.io_struct.LoadLoRAAdapterReqInput": (
        "built by lora_adapters.load_adapter (Engine.load_lora_adapter)"
    ),
    "sglang.srt.managers.io_struct.UnloadLoRAAdapterReqInput": (
        "built by lora_adapters.unload_adapter (Engine.unload_lora_adapter)"
    ),
    "sglang.srt.lora.lora_registry.LoRARegistry.get_all_adapters": (
        "the loaded adapters by name (TokenizerManager.lora_registry's, through "
        "sglang_state.loaded_adapter_names): whether a body's model names a loaded adapter "
        "(SGLangRuntime.adapter_named; tests/test_lora_adapters.py)"
    ),
    # -- LoRA on a CPU (cpu_support/lora_host_tensors.py: a CPU install without CUDA) --
    # SGLang pins these host staging tensors unconditionally (sglang #31894); torch refuses
    # pinned memory without an accelerator. AROUND each: the function runs under a torch
    # function mode (per thread, for the call) that drops pin_memory= and answers
    # Tensor.pin_memory() with the tensor. The memory pool asks is_pin_memory_available
    # (False on SGLang's CPU platform) and needs nothing.
    "sglang.srt.lora.layers.VocabParallelEmbeddingWithLoRA.__init__": (
        "AROUND: output_offset_cpu built with pin_memory=True"
    ),
    "sglang.srt.lora.layers.ParallelLMHeadWithLoRA.__init__": (
        "AROUND: output_offset_cpu built with pin_memory=True"
    ),
    "sglang.srt.lora.layers.ColumnParallelLinearWithLoRA.__init__": (
        "AROUND: output_offset_cpu built with pin_memory=True (the merged and QKV column "
        "layers run it through super())"
    ),
    "sglang.srt.lora.layers.MergedColumnParallelLinearWithLoRA.set_lora_info": (
        "AROUND: output_offset_cpu as output_offset.cpu().pin_memory()"
    ),
    "sglang.srt.lora.layers.QKVParallelLinearWithLoRA.__init__": (
        "AROUND: output_offset_cpu built with pin_memory=True"
    ),
    "sglang.srt.lora.layers.RowParallelLinearWithLoRA.set_lora_info": (
        "AROUND: output_offset_cpu built with pin_memory=True"
    ),
    "sglang.srt.lora.backend.torch_backend.TorchNativeLoRABackend.prepare_lora_batch": (
        "AROUND: every batch's segment lengths, indices, ranks and scalings pinned (the "
        "torch backend: a CPU's, machine/device_defaults.py)"
    ),
    "sglang.srt.lora.mem_pool.LoRAMemoryPool.__init__": (
        "relied on: pins only where is_pin_memory_available() (its pin_memory_available)"
    ),
    "sglang.srt.platforms.cpu.CpuSRTPlatform.is_pin_memory_available": (
        "relied on: False, so the LoRA memory pool copies weights unpinned on a CPU"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_batch_output": (
        "wrapped per instance (request_recording.py): an embedding batch output's "
        "cached_tokens (a classification head's score prompts) kept for its meta_info"
    ),
    "sglang.srt.managers.io_struct.BatchEmbeddingOutput.cached_tokens": (
        "read by request_recording.py (SGLang leaves it out of an embedding's meta_info)"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.score_request": (
        "the one scoring call (score_front.ScoringFront: Engine, typed endpoints)"
    ),
    # -- continuation logprobs (continuation_logprobs.py: query likelihood) --
    "sglang.srt.managers.io_struct.GenerateReqInput": (
        "a continuation call's batch: input_ids, return_logprob, logprob_start_len (the "
        "prompt's last position), max_new_tokens 0, custom_params (the reusable prefix)"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.abort_request": (
        "aborts a disconnected client's prompts; abort_all after --shutdown-timeout"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.auto_create_handle_loop": (
        "arms SGLang's SIGTERM drain at start-up instead of at the first request; the DSL's "
        "event_loop.py checks which loop it bound (SGLang answers only on that loop); AFTER "
        "(offline_engine.HOOKS): an Engine of ours takes the running-phase SIGQUIT handler "
        "it adds off the loop"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.gracefully_exit": (
        "set by SGLang's SIGTERM handler: we refuse new work (503) while it drains"
    ),
    # -- plugin mechanism --
    "sglang.srt.plugins.load_plugins": "runs our entry point in every SGLang process",
    "sglang.srt.plugins.hook_registry.HookRegistry.register": "how runtime patches attach",
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
    # -- hook tables (hooking/hooks.py) --
    "sglang.srt.plugins.hook_registry.HookType": "AROUND / AFTER: a table's hook types",
    "sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks": (
        "hooks.apply_hooks_now: hooks needed in a process whose plugins already loaded "
        "(prefill_kv's tokenizer side, the shutdown hook)"
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
    # -- single-token OpenAI requests (sglang_runtime/single_token.py), main process --
    "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest": (
        "subclassed: our chat route's body model (+ logprob_token_ids)"
    ),
    "sglang.srt.entrypoints.openai.protocol.CompletionRequest": (
        "subclassed: our completions route's body model (+ logprob_token_ids, shared_prefix)"
    ),
    "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize"
    "._handle_non_streaming_request": (
        "AROUND (tokenizer_endpoints.py): /detokenize also answers `prompt` (vLLM's key, "
        "which lm-eval's remote tokenizer reads)"
    ),
    "sglang.srt.entrypoints.openai.protocol.CompletionRequest.validate_max_tokens_positive": (
        "replaced by name in our subclass: max_tokens 0 with echo is allowed"
    ),
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat.handle_request": (
        "called by our /v1/chat/completions route (app.state.openai_serving_chat)"
    ),
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion.handle_request": (
        "called by our /v1/completions route (app.state.openai_serving_completion)"
    ),
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request": (
        "AFTER: a single-token request's prefix ids in custom_params, token_ids_logprob; "
        "called (choice_requests.py, as for completions' below): a choice request's prompt "
        "as SGLang renders it (template, tools, LoRA, cache salt)"
    ),
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
    "._convert_to_internal_request": (
        "AFTER: a single-token request's prefix ids in custom_params (a loglikelihood "
        "request's: the whole prompt); token_ids_logprob (GenerateReqInput's field: "
        "meta_info output_token_ids_logprobs) for logprob_token_ids"
    ),
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response": (
        "BEFORE: logprob_token_ids rows replace the natural top logprobs"
    ),
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
    "._build_completion_response": (
        "BEFORE: logprob_token_ids rows; AFTER: real text_offset (SGLang writes -1)"
    ),
    "sglang.srt.entrypoints.http_server.model_json_response": (
        "how SGLang's OpenAI routes answer; ours keep it"
    ),
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase._validate_request": (
        "called (choice_requests.py): a choice request gets SGLang's own checks, as "
        "handle_request runs them, before it is answered by scoring"
    ),
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request": (
        "called (choice_requests.py): chat's own checks (messages, tools)"
    ),
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.create_error_response": (
        "called (choice_requests.py): a refused choice request in SGLang's error shape"
    ),
    "sglang.srt.entrypoints.openai.protocol.ResponseFormat": (
        "built (choice_requests.py): vLLM's `json` constraint as SGLang's response_format"
    ),
    "sglang.srt.managers.tp_worker.TpModelWorker.get_worker_info": (
        "AFTER: records the context-bound input limit (stock one is also pool-bound)"
    ),
    "sglang.srt.managers.scheduler.Scheduler.get_init_info": (
        "AFTER: adds the context-bound score limit to the start-up handshake, so the "
        "Engine and the server validate with what this scheduler accepts; reads the "
        "scheduler's pool-bound max_req_input_len"
    ),
    "sglang.srt.layers.attention.hybrid_attn_backend.HybridAttnBackend": (
        "its prefill_backend is the one asked whether prefill_kv is supported"
    ),
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata": (
        "decides use_ragged; overridden to refuse a paged-only plan under prefill_kv "
        "(prefill_attention/scheduler_flashinfer_backend.flashinfer_pool_reads mirrors its "
        "conditions)"
    ),
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.forward_extend": (
        "stock: ragged over new k/v in hand + paged over the cached prefix; overridden to "
        "write the batch's k / v first (followers read their leader's slots of the same "
        "forward: prefill_kv/packing.py)"
    ),
    "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend._kv_write_scales": (
        "forward_query_chunk saves a chunk's k / v with the layer's scales, as forward_extend"
    ),
    "sglang.srt.model_executor.cuda_graph_config.check_cuda_graph_backend": (
        "full / tc_piecewise prefill CUDA graphs plan FlashInfer's paged-only prefill"
    ),
    "sglang.srt.model_executor.cuda_graph_config.Backend.FULL": "see above",
    "sglang.srt.model_executor.cuda_graph_config.Backend.TC_PIECEWISE": "see above",
    "sglang.srt.model_executor.cuda_graph_config.Phase.PREFILL": "see above",
    "sglang.srt.managers.tp_worker.TpModelWorker.is_dllm": "dLLM engines stay stock",
    # (ATTENTION_BACKENDS, listed above, also tells prefill_kv whether our backend is in.)
    "sglang.srt.environ.envs.SGLANG_EAGER_INPUT_NO_COPY": (
        "set in the scheduler: eager static input buffers only fit max(pool, chunk) tokens"
    ),
    "sglang.srt.model_executor.runner.eager_runner.EagerRunner.load_batch": (
        "reads SGLANG_EAGER_INPUT_NO_COPY (why it is set)"
    ),
    "sglang.srt.managers.utils.validate_input_length": (
        "AROUND: scoring prompts may exceed the pool (the kept prefix is clamped to it "
        "where R is read, features/prefill_kv/policy.clamp_reusable_len)"
    ),
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": (
        "AROUND: charges the pool for kept tokens only; such requests are never chunked"
    ),
    "sglang.srt.managers.schedule_policy.AddReqResult": "OTHER: run a long one alone",
    "sglang.srt.mem_cache.prefill_budget.PrefillBudget": (
        "check_prefill / reserve wrapped per request by _KeptTokensBudget"
    ),
    "sglang.srt.mem_cache.allocation.alloc_for_extend": (
        "AROUND: sets the slot layout; kv_committed/allocated_len end at the kept boundary"
    ),
    "sglang.srt.mem_cache.allocation.alloc_token_slots": (
        "AROUND: real slots for kept tokens only, DROPPED_SLOT (never allocated) for the rest"
    ),
    "sglang.srt.mem_cache.allocation._prefix_kv_indices": (
        "AROUND: a packed follower's prefix row is its match plus placeholders up to S, "
        "filled with its leader's slots once alloc_for_extend has written the rows"
    ),
    "sglang.srt.managers.schedule_batch.ReqKvInfo.cache_protected_len": (
        "set to S on a packed follower: [0, S) is its leader's or the cache's, never freed "
        "by it; release inserts from there"
    ),
    "sglang.srt.managers.schedule_policy.PrefillAdder.budget_state": (
        "relied on: the adder hook reads can_run_list (the admitted requests a new one may "
        "follow), sets a follower's prefix_len to S, and after a prompt too long to share a "
        "batch resets rem_chunk_tokens / rem_input_tokens for its followers only, which "
        "budget_state reads"
    ),
    "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator": "the only pool handled",
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
    # -- memory probe (sglang_runtime/memory_probe/scheduler_process.py, calibration only) --
    "sglang.srt.model_executor.model_runner.ModelRunner.forward": (
        "AROUND: memory resident before each extend forward and its peak (memory budget)"
    ),
    "sglang.srt.model_executor.forward_batch_info.ForwardMode.is_extend": "probe: extends only",
    # -- forward profile (sglang_runtime/forward_profile/scheduler_process.py, benchmarks) --
    "sglang.srt.managers.scheduler.Scheduler.run_batch": (
        "AROUND: wall time of an extend step (forward, then the label logprobs); the "
        "forward log's timing events recorded around it on the stream it launches the "
        "forward on (its enable_overlap, forward_stream and schedule_stream read: the "
        "model runner's forward stream when overlapping, the current stream otherwise)"
    ),
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result": (
        "AFTER: a batch's results are on the host, so its forward has ended: the forward "
        "log's held lines whose end event has completed are written (no wait)"
    ),
    "sglang.srt.managers.scheduler.Scheduler.on_idle": (
        "BEFORE: the scheduler has nothing to run: every held forward-log line is written, "
        "waiting on its end event"
    ),
    "sglang.srt.layers.logits_processor.LogitsProcessor": (
        "kernel profile (forward_profile/kernel_profile.py): a profiler range around each "
        "instance's forward while a forward is profiled (found by class name among "
        "scheduler.tp_worker.model_runner.model's modules, with RadixAttention, RMSNorm, "
        "the *Linear and *RotaryEmbedding layers, SiluAndMul), and around the pool's "
        "set_kv_buffer (wrapped per instance, then restored): the LM head's GEMM and the "
        "KV writes told apart from other kernels"
    ),
    "sglang.srt.mem_cache.common.release_kv_cache": (
        "stock; caches and frees [0, kv_committed_len), hence the boundary above; BEFORE "
        "(features/prompt_logprobs/scheduler_process.py): an echo request's KV slots, read before "
        "its row goes; BEFORE (features/prefill_kv/scheduler_process.py): a packed follower "
        "inserts nothing unless the cache holds its borrowed prefix by then"
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
    # -- prefix-cache namespaces (scoring/cache_salts.py, http_server/tenant_requests.py) --
    "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments": (
        "relied on: spreads the cache_salt request_recording.py writes (the tenant's and the "
        "caller's) to one per prompt; TokenizedGenerateReqInput and Req carry it to RadixKey's "
        "cache_salt, so a salt matches only its own cached prefixes"
    ),
    "sglang.srt.managers.scheduler.Scheduler._maybe_namespace_elastic_radix_cache": (
        "AFTER (embedding_salts.py, every prefillonly scheduler): called on each new Req "
        "right after SGLang builds it; an embedding Req gets the cache_salt its "
        "custom_params carry (SGLang gives embeddings no salt field)"
    ),
    "sglang.srt.managers.scheduler.Scheduler.handle_embedding_request": (
        "relied on: builds an embedding Req with its request's SamplingParams (the "
        "custom_params request_recording.py salted) and calls the hook above on it "
        "before queueing it"
    ),
    "sglang.srt.utils.auth._get_auth_level_from_app_and_scope": (
        "AROUND (http_server/access.HOOKS): SGLang's lookup of a route's level misses the "
        "routers its app includes, so the API key opened their admin routes "
        "(/scale_elastic_ep); ours searches them. Also called by --tenant-keys' key check "
        "(http_server/tenant_requests.py) with decide_request_auth: SGLang's decision, one "
        "tenant's key standing for --api-key"
    ),
}


# SGLang's private instance attributes we read or write (set in an __init__, by a
# decorator or by prepare_server_args, so a class lookup cannot resolve them), each as
# "<the SGLang class or function whose code sets it>.<attribute>": (the one module of ours
# that names it, why). tests/test_sglang_hook_targets.py checks that code still sets it and
# that no other module of prefillonly_sgl names it. Private methods are in HOOK_TARGETS.
PRIVATE_ATTRIBUTES: dict[str, tuple[str, str]] = {
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._subprocess_watchdog": (
        "prefillonly_sgl.sglang_runtime.sglang_state",
        "the SubprocessWatchdog the Engine sets after start: an Engine of ours stops it "
        "(offline_engine.py: its answer to a dead worker is a SIGQUIT to the caller)",
    ),
    "sglang.srt.utils.auth.auth_level._auth_level": (
        "prefillonly_sgl.sglang_runtime.sglang_state",
        "a route's level, which SGLang's API-key middleware reads from its endpoint "
        "function: declared on every route serve adds (set with SGLang's auth_level "
        "decorator), read back by http_server/access.py",
    ),
    "sglang.srt.server_args.prepare_server_args._radix_eviction_policy_explicitly_set": (
        "prefillonly_sgl.sglang_runtime.sglang_state",
        "set on the parsed flags before ServerArgs is built, as prepare_server_args sets "
        "it (server_flags.server_args)",
    ),
    "sglang.srt.server_args.prepare_server_args._launch_command": (
        "prefillonly_sgl.sglang_runtime.sglang_state",
        "the redacted command line kept on ServerArgs (its launch_command), as "
        "prepare_server_args keeps it (server_flags.server_args)",
    ),
    "sglang.srt.arg_groups.model_override_base.model_config_of._model_config": (
        "prefillonly_sgl.features.prefill_attention.tokenizer_process",
        "SGLang's memoized ModelConfig on the arguments, used where present while they "
        "resolve (tokenizer_process._model_config, its one reader)",
    ),
}

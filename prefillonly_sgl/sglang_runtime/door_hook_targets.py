"""The SGLang symbols the doors call, hook or replace, and why: the server
(sglang_runtime/http_server/), keys, decision checkpoints, classification heads, LoRA
adapters, continuation logprobs, single-token OpenAI requests and prefix-cache salts. Part
of hook_targets.HOOK_TARGETS (see there), resolved by tests/test_sglang_hook_targets.py."""

from __future__ import annotations

DOOR_TARGETS: dict[str, str] = {
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
    # -- images (scoring/image_prompts.py, sglang_runtime/shared_image_features.py) --
    "sglang.srt.server_args.ServerArgs.mm_preprocess_cache_size_mb": (
        "a default under our features on a family with image tokens "
        "(RuntimeConfig.sglang_defaults): a call's prompts carry the query's image each, "
        "which its content-addressed cache processes once (Qwen-VL's fast path)"
    ),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request": (
        "AROUND (shared_image_features.HOOKS): before SGLang wraps a prompt's features in a "
        "segment of its own, an image shared under its content hash is named by one "
        "segment for every prompt that carries it"
    ),
    "sglang.srt.managers.mm_utils.ShmPointerMMData": (
        "base class of SharedImageFeature: its __init__ writes the segment, its pickled "
        "state is the segment's name, shape, dtype and hash"
    ),
    "sglang.srt.managers.mm_utils.ShmPointerMMData.materialize": (
        "relied on: the scheduler maps the segment copy-on-write, then calls close_and_unlink"
    ),
    "sglang.srt.managers.mm_utils.ShmPointerMMData.close_and_unlink": (
        "overridden by SharedImageFeature: a reader closes, the tokenizer process unlinks"
    ),
    "sglang.srt.managers.mm_utils.wrap_shm_features": (
        "relied on: wraps only torch tensors, so a feature already named by a "
        "SharedImageFeature passes through"
    ),
    "sglang.srt.managers.mm_utils._get_is_default_transport": (
        "called: SGLang's default transport pickles features (nothing to share then)"
    ),
    "sglang.srt.runtime_context.get_serving": (
        "called: skip_tokenizer_init (no features pass through this process)"
    ),
    "sglang.srt.multimodal.processors.base_processor.MultimodalSpecialTokens": (
        "its image_token and image_token_id (the placeholder and the pad token it expands "
        "to) read once from the tokenizer manager's mm_processor.mm_tokens (model_facts.py)"
    ),
}

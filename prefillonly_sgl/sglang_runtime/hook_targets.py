"""Every SGLang symbol this project calls, hooks or replaces, and why.

SGLang's internals move fast (thousands of changed lines per release), so the version is
pinned exactly and tests/test_sglang_hook_targets.py resolves every entry: an upgrade that
renames or removes one fails that test instead of misbehaving at run time. Add an entry in
the same change that starts using a symbol. The list is kept in three modules by who uses
the symbols: here the runtime's own (the offline engine, CPU support, the GPU kit, the
plugin mechanism, the instruments), door_hook_targets.py the doors' (the server, keys,
heads, LoRA, continuations, single-token requests, salts), feature_hook_targets.py the
runtime features' (prefill-only attention and KV, the JCT scheduler, hybrid prefilling,
prompt logprobs); HOOK_TARGETS is all of them.
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.door_hook_targets import DOOR_TARGETS
from prefillonly_sgl.sglang_runtime.feature_hook_targets import FEATURE_TARGETS

RUNTIME_TARGETS: dict[str, str] = {
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
    # -- plugin mechanism --
    "sglang.srt.plugins.load_plugins": "runs our entry point in every SGLang process",
    "sglang.srt.plugins.hook_registry.HookRegistry.register": "how runtime patches attach",
    # -- hook tables (hooking/hooks.py) --
    "sglang.srt.plugins.hook_registry.HookType": "AROUND / AFTER: a table's hook types",
    "sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks": (
        "hooks.apply_hooks_now: hooks needed in a process whose plugins already loaded "
        "(prefill_kv's tokenizer side, the shutdown hook)"
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
}

HOOK_TARGETS: dict[str, str] = {**RUNTIME_TARGETS, **DOOR_TARGETS, **FEATURE_TARGETS}


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

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
    "sglang.srt.entrypoints.engine.Engine.score": "scoring entry point (query, items, labels)",
    "sglang.srt.entrypoints.engine.Engine.async_score": "asyncio variant of score",
    "sglang.srt.entrypoints.engine.Engine.get_server_info": "max_req_input_len for validation",
    "sglang.srt.entrypoints.engine.Engine.shutdown": "stops the worker processes",
    # -- CPU support: names SGLang imports from sgl_kernel on the CPU path --
    "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func": (
        "calls sgl_kernel.assign_req_to_token_pool_cpu, provided by cpu_support"
    ),
    "sglang.kernels.ops.kvcache.cache_move.copy_all_layer_kv_cache_func": (
        "calls sgl_kernel.copy_all_layer_kv_cache_cpu, provided by cpu_support"
    ),
    "sglang.srt.utils.common.is_cpu": "reads SGLANG_USE_CPU_ENGINE, set by cpu_support.boot",
    # -- plugin mechanism --
    "sglang.srt.plugins.load_plugins": "runs our entry point in every SGLang process",
    "sglang.srt.plugins.hook_registry.HookRegistry.register": "how runtime patches attach",
    # -- scoring DSL (prefillonly_sgl/dsl) --
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.auto_create_handle_loop": (
        "binds the tokenizer manager to one event loop (event_loop.py checks it)"
    ),
    "sglang.srt.entrypoints.openai.protocol.ScoringRequest": (
        "the /v1/score request schema the DSL's RemoteBackend sends"
    ),
}

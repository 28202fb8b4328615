"""Everything that imports or patches SGLang lives in this package.

- score_front.py: the scoring path of the main process (Engine and server);
  label_sequences.py: labels of several tokens (the prompt, then the label prefixes).
- offline_engine.py: starting and stopping SGLang's offline Engine; model_limits.py: the
  limits its scheduler reported; event_loop.py: which loop it answers on.
- http_server.py: `prefillonly serve` on SGLang's HTTP server (guard, usage, typed
  endpoints; the plain logic is in prefillonly_sgl/server/; the endpoints, the built-in
  APIs of prefillonly_sgl/apis/ among them, come from its caller); request_recording.py:
  usage and rids from the TokenizerManager.
- plugin.py: the SGLang plugin that installs the runtime features in every SGLang process
  (from the runtime configuration, read once into process_state.py, where hooks read it);
  hooks.py: their hook tables. Features, one folder each: prefill_attention/ (attention
  backends), prefill_kv/ with reusable_prefix.py (its tokenizer-process side, which the
  JCT scheduler reads too), jct_scheduler/, hybrid_prefill/, features/prompt_logprobs/ (one module
  per process); memory_probe/ (the memory budget's peak) and forward_profile/
  (benchmarks) measure. single_token.py and tokenizer_endpoints.py are the OpenAI doors
  of the server (always on, no feature switch).
- cpu_support/: what SGLang 0.5.23 needs to run on a CPU-only machine (activated at
  interpreter start by a .pth file that only the CPU install writes).
- hook_targets.py: every SGLang symbol this project calls or hooks, checked by a test so
  that an SGLang upgrade fails loudly instead of silently.

The rest of prefillonly_sgl (validation, features, device defaults, the DSL, the KV and
attention decisions) is plain Python that can be imported and tested without SGLang.
"""

SGLANG_VERSION = "0.5.23"  # pinned exactly; see hook_targets.py before changing it

"""The runtime's boot code and fronts over SGLang. What imports or patches SGLang lives
here, in the features' process modules (prefillonly_sgl/features/<name>/) and in the hook
mechanism they share (prefillonly_sgl/hooking/); tests/test_package_shape.py keeps it so.

- score_front.py: the scoring path of the main process (Engine and server);
  label_sequences.py: labels of several tokens (the prompt, then the label prefixes).
- engine_lifecycle.py: the Engine's start (its start warnings, its memory planned,
  SGLang started, the front built) and the finalizer that stops what it started;
  offline_engine.py: starting and stopping SGLang's offline Engine (owned_processes.py:
  which processes it started, and killing them; worker_output.py: its workers' stderr;
  worker_watch.py: a worker dying after start); model_limits.py: the limits its
  scheduler reported; event_loop.py: which loop it answers on, and a synchronous call
  run there to its end.
- http_server/: `prefillonly serve` on SGLang's HTTP server (guard, usage, typed
  endpoints; the plain logic is in prefillonly_sgl/server/; the endpoints, the built-in
  APIs of prefillonly_sgl/apis/ among them, come from its caller); request_recording.py:
  usage and rids from the TokenizerManager.
- plugin.py: the SGLang plugin that installs the runtime features in every SGLang process
  (from the runtime configuration, read once into hooking/process_state.py, where hooks
  read it; each feature's register(), prefillonly_sgl/features/<name>/);
  memory_probe/ (the memory budget's peak) and forward_profile/ (benchmarks) measure.
  single_token.py and tokenizer_endpoints.py are the OpenAI doors of the server (always
  on, no feature switch).
- worker_forkserver.py: an Engine's or server's workers forked from a process that
  imported SGLang once (opt-in, PREFILLONLY_WORKER_START=forkserver; the test suite's),
  worker_forkserver_preload.py being what that process imports; model_configs.py:
  configurations as transformers writes them, fixed after SGLang builds them (every
  prefillonly process); redacted_settings.py: the start-up settings line without keys
  (serve and the Engine).
- cpu_support/: what SGLang 0.5.23 needs to run on a CPU-only machine (activated at
  interpreter start by a .pth file that only the CPU install writes).
- cuda_kit_support/: what its CUDA path needs on a card without sgl-kernel (the engine
  kit's card; activated by the kit's sitecustomize.py only).
- hook_targets.py (with its parts door_hook_targets.py, feature_hook_targets.py): every
  SGLang symbol this project calls or hooks, checked by a test so that an SGLang upgrade
  fails loudly instead of silently.

The rest of prefillonly_sgl (validation, the feature registry and the features' decisions,
device defaults, the DSL, decisions) is plain Python, importable and testable without
SGLang.
"""

SGLANG_VERSION = "0.5.23"  # pinned exactly; see hook_targets.py before changing it

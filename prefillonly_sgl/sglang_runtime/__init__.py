"""Everything that imports or patches SGLang lives in this package.

- cpu_support/: what SGLang 0.5.23 needs to run on a CPU-only machine (activated at
  interpreter start by a .pth file that only the CPU install writes).
- offline_engine.py: starting and stopping SGLang's offline Engine.
- http_server.py: `prefillonly serve` on SGLang's HTTP server (guard, usage, typed
  endpoints; the plain logic is in prefillonly_sgl/server/).
- hook_targets.py: every SGLang symbol this project calls or hooks, checked by a test so
  that an SGLang upgrade fails loudly instead of silently.

The rest of prefillonly_sgl (validation, device defaults, the DSL, scheduling policy) is
plain Python that can be imported and tested without SGLang.
"""

SGLANG_VERSION = "0.5.23"  # pinned exactly; see hook_targets.py before changing it

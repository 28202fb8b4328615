"""`prefillonly serve`: SGLang's HTTP server with prefill-only defaults, request checks,
bounded admission, per-request usage and typed app endpoints.

Plain Python (no SGLang import at module level), testable without starting a server:

- options.py: our `serve` options and the per-device SGLang flags filled in by default.
- request_checks.py: what a request body must look like before SGLang sees it.
- admission.py: the bound on admitted work (503 beyond it).
- endpoints.py: the extension point for typed endpoints (EndpointSpec, --app loading);
  the built-in APIs (/v1/score_labels, /v1/rerank, /v1/classify: prefillonly_sgl/apis/)
  and the DSL's endpoints (dsl/endpoint.py) use it. This package imports neither.
- scoring/errors.py: the JSON error body every refusal of this server has.
- guard.py: the ASGI middleware that applies all of the above to every work request
  (per-request usage records live in prefillonly_sgl/scoring/usage.py, shared with the Engine).
- metrics.py: Prometheus metrics of the guard.

The SGLang side (installing the guard and routes on SGLang's FastAPI app, recording usage
from the tokenizer manager, running the server) is sglang_runtime/http_server/.
"""

"""`prefillonly serve` on SGLang's own HTTP server.

SGLang's server is a module-level FastAPI `app` (sglang.srt.entrypoints.http_server) run
by uvicorn in the main process, with the scheduler and detokenizer in spawned processes.
Before it starts we add to that same app, so every SGLang endpoint and client keeps
working:
- the RequestGuard middleware (prefillonly_sgl/server/guard.py) on the work endpoints;
- /v1/chat/completions and /v1/completions routes on SGLang's handlers, which run a
  single-token request as a prefill-only request (sglang_runtime/single_token.py);
- a /v1/score route that calls SGLang's handler and adds cached tokens and queue/running
  time to the response's `usage` (the body was checked by the guard with ScoringFront's
  checks, score_front.py, the same the Engine and the typed endpoints use), or hands a
  body in vLLM's score shapes to the spec that claims it (apis/vllm_score.py);
- a RequestValidationError handler with short messages (SGLang's own embeds a traceback
  line), except on the paths whose error format SGLang documents;
- every added route's auth level for SGLang's key check, the admin key on work routes,
  /server_info and /get_server_info redacted, and no secret in any answer or log line
  (access.py; the rules in server/auth.py, server/redaction.py);
- the typed endpoints of the EndpointSpecs it is given (`--app`, and the built-in APIs of
  prefillonly_sgl/apis/: /v1/score_labels, /v1/rerank, /v1/classify), which score through
  ScoringFront;
- with `--tenant-keys`, the key check of several keys, one tenant each (tenant_requests.py), which
  runs each request in its tenant's prefix-cache namespace;
- a lifespan wrapper that, once SGLang is up, starts the ScoringFront (which records usage
  and rids from the tokenizer manager's generate_request), arms SGLang's SIGTERM drain at
  once, aborts what is still running --shutdown-timeout seconds after SIGTERM, and runs
  the endpoints' on_startup (their check_tokenizer runs before SGLang starts).
Then sglang.launch_server.run_server runs the server exactly as `sglang serve` would.

    runtime.py     the running server as the guard and the endpoints see it
    routes.py      the routes added to SGLang's app, answers and errors
    access.py      auth levels, the admin key, secrets kept out of answers and logs
    processor_check.py  a request's custom logit processor loaded in a throwaway process
    lifecycle.py   start-up, SIGTERM drain and its watchdog, the guard's metrics
    tenant_requests.py --tenant-keys: several API keys, one tenant (cache namespace) each
    here           install() puts them on the app; serve() builds ServerArgs and runs
"""

import os

from prefillonly_sgl.scoring.adapters import LORA_BODY_PATHS, MODEL_ADAPTER_PATHS
from prefillonly_sgl.scoring.cache_salts import BODY_SALT_PATHS
from prefillonly_sgl.server.admission import AdmissionControl
from prefillonly_sgl.server.auth import short_key_refusal
from prefillonly_sgl.server.body_encoding import DecodeRequestBody
from prefillonly_sgl.server.endpoints import EndpointSpec, check_unique_paths
from prefillonly_sgl.server.guard import GuardPolicy, RequestGuard
from prefillonly_sgl.server.options import ServeOptions, SGLangFlags
from prefillonly_sgl.server.redaction import RedactSecrets, secret_values
from prefillonly_sgl.server.tenant_keys import TenantKeys, TenantKeysError, load_tenant_keys
from prefillonly_sgl.sglang_runtime import redacted_settings, server_flags, worker_forkserver
from prefillonly_sgl.sglang_runtime.http_server import access
from prefillonly_sgl.sglang_runtime.http_server.lifecycle import _guard_metrics, _wrap_lifespan
from prefillonly_sgl.sglang_runtime.http_server.routes import (
    _add_endpoint,
    _install_validation_handler,
    _replace_models_route,
    _replace_score_route,
)
from prefillonly_sgl.sglang_runtime.http_server.runtime import SGLangRuntime
from prefillonly_sgl.sglang_runtime.http_server.tenant_requests import TenantKeyAuth

# SGLang endpoints that run the model: guarded (checked, admitted, drained on shutdown).
WORK_PATHS = {
    "/generate",
    "/v1/score",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/encode",
    "/classify",
    "/v1/classify",
    "/v1/rerank",
    "/v1/decisions",
    "/v1/responses",
    "/v1/messages",
    "/v1/systemone",
    "/invocations",
    "/api/generate",
    "/api/chat",
}
REPLACED_PATHS = frozenset({"/v1/rerank", "/v1/classify", "/v1/decisions", "/v1/systemone"})


def install(
    app,
    options: ServeOptions,
    specs: list[EndpointSpec],
    enable_metrics: bool,
    mark_reusable_prefixes: bool = True,
    tenant_keys: TenantKeys | None = None,
    admin_api_key: str | None = None,
    secrets: list[str] = (),
):
    """Adds everything `serve` adds to SGLang's FastAPI app (before it starts); ``specs``:
    every typed endpoint, the `--app` ones and the built-in APIs (prefillonly_sgl/apis/),
    which the caller builds. mark_reusable_prefixes: single-token OpenAI requests carry
    their reusable prefix (when a runtime feature reads it). secrets: the values of the
    server's secret settings (server/redaction.secret_values), kept out of every answer."""
    from fastapi.routing import APIRoute

    from prefillonly_sgl.sglang_runtime import single_token, tokenizer_endpoints

    # SGLang's /v1/rerank and /v1/classify serve cross-encoder / classification models
    # only, and its /v1/decisions and /v1/systemone score each question's whole prompt
    # outside the prefix-sharing path: ours (apis/, among `specs`) replace them.
    ours = {spec.path for spec in specs}
    app.router.routes[:] = [
        r
        for r in app.router.routes
        if not (isinstance(r, APIRoute) and r.path in REPLACED_PATHS and r.path in ours)
    ]
    sglang_endpoints = access.endpoint_ids(app)
    taken = {r.path for r in app.router.routes if isinstance(r, APIRoute)}
    check_unique_paths(specs, taken)
    runtime = SGLangRuntime(options, specs)
    _install_validation_handler(app)
    peers = [spec for spec in specs if spec.claims is not None]
    if any(spec.path != "/v1/score" for spec in peers):
        raise ValueError("EndpointSpec.claims is supported on /v1/score only")
    _replace_score_route(app, runtime, peers)
    _replace_models_route(app, runtime)
    single_token.install_routes(app, runtime)
    single_token.install_in_this_process(mark_reusable_prefixes)
    tokenizer_endpoints.install(app, lambda: runtime.tokenizer_manager)
    for spec in specs:
        if spec.claims is None:  # claimed bodies: the path's route hands them over
            _add_endpoint(app, spec, runtime)
    access.redact_settings_routes(app, list(secrets))
    runtime.auth_levels = access.check_auth_levels(app, sglang_endpoints)
    # A spec that claims some bodies of an SGLang path answers its refusals in its own
    # shape (routes._run_raw); the path's other errors stay SGLang's.
    error_shapes = {
        spec.path: spec.error_shape
        for spec in specs
        if spec.error_shape != "sglang" and spec.claims is None
    }
    policy = GuardPolicy(
        guarded_paths=WORK_PATHS | {spec.path for spec in specs},
        max_request_bytes=options.max_request_bytes,
        admission=AdmissionControl(options.max_pending_requests, options.max_pending_prompts),
        error_shapes=error_shapes,
        body_salt_paths=BODY_SALT_PATHS,
        body_lora_paths=LORA_BODY_PATHS,
        model_adapter_paths=MODEL_ADAPTER_PATHS,
    )
    app.add_middleware(
        RequestGuard, policy=policy, runtime=runtime, metrics=_guard_metrics(enable_metrics)
    )
    # Added last, so it runs first: the guard sees decoded bodies.
    app.add_middleware(
        DecodeRequestBody, max_request_bytes=options.max_request_bytes, error_shapes=error_shapes
    )
    # Outside all of ours (SGLang's key check, added at start, is outside it): no answer,
    # error or not, carries a secret value.
    app.add_middleware(RedactSecrets, secrets=lambda: secrets)
    if tenant_keys is not None:
        # --tenant-keys (then SGLang has no --api-key of its own; admin_api_key is its
        # --admin-api-key). Added last, so it runs before the rest of ours: a refused
        # request's body is never read.
        app.add_middleware(
            TenantKeyAuth, keys=tenant_keys, admin_api_key=admin_api_key, fastapi_app=app
        )
    _wrap_lifespan(app, runtime, specs, policy.in_flight)
    return runtime


def serve(
    flags: SGLangFlags,
    options: ServeOptions,
    specs: list[EndpointSpec],
    mark_reusable_prefixes: bool = True,
    worker_start: str = worker_forkserver.SPAWN,
) -> int:
    """Builds SGLang's ServerArgs from `flags` (read by SGLang's parser, server_flags.py)
    and runs SGLang's server with our
    additions and the typed endpoints ``specs`` (all of them: cli.py adds the built-in
    APIs to the `--app` ones), its workers started the ``worker_start`` way
    (worker_forkserver.py). Blocks until the server exits."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # as `sglang serve` does; the runtime configuration is already set
    server_args = server_flags.server_args(flags)
    if server_args.tokenizer_worker_num != 1:
        raise SystemExit(
            "prefillonly serve: --tokenizer-worker-num > 1 is not supported (the request "
            "checks run in the main process's HTTP server)"
        )
    refusal = short_key_refusal(
        **{"--api-key": server_args.api_key, "--admin-api-key": server_args.admin_api_key}
    )
    if refusal is not None:
        raise SystemExit(f"prefillonly serve: {refusal}")
    tenant_keys = _tenant_keys(options, server_args)
    from sglang.launch_server import run_server
    from sglang.srt.entrypoints.http_server import app

    from prefillonly_sgl.hooking.hooks import apply_hooks_now

    # Keys and other secret settings: out of every answer and log line (access.py).
    secrets = secret_values(server_args.resolved_dict())
    access.redact_logs(secrets)
    apply_hooks_now("serve_access", access.HOOKS)
    redacted_settings.install_in_this_process()
    install(
        app,
        options,
        specs,
        enable_metrics=bool(server_args.enable_metrics),
        mark_reusable_prefixes=mark_reusable_prefixes,
        tenant_keys=tenant_keys,
        admin_api_key=server_args.admin_api_key,
        secrets=secrets,
    )
    check_endpoints_before_start(server_args, specs)
    if server_args.device == "cpu":
        from prefillonly_sgl.sglang_runtime.offline_engine import _check_cpu_support

        _check_cpu_support()
    try:
        with worker_forkserver.workers_started(worker_start):
            run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


def check_endpoints_before_start(server_args, specs: list[EndpointSpec]) -> None:
    """The endpoints' `check_tokenizer`, with the tokenizer SGLang's TokenizerManager will
    load (its own get_tokenizer, the same arguments), before the engine starts: a label
    that cannot be scored refuses the start in seconds, not after the engine's minute."""
    checks = [spec.check_tokenizer for spec in specs if spec.check_tokenizer is not None]
    if not checks or server_args.skip_tokenizer_init:
        return
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(
        server_args.tokenizer_path or server_args.model_path,  # resolved later by SGLang
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        revision=server_args.revision,
        tokenizer_backend=server_args.tokenizer_backend,
    )
    for check in checks:
        try:
            check(tokenizer)
        except Exception as e:  # the check's own message names the endpoint and the label
            raise SystemExit(str(e)) from None


def _tenant_keys(options: ServeOptions, server_args) -> TenantKeys | None:
    """The keys of --tenant-keys (None without it); SystemExit naming the problem."""
    if options.tenant_keys is None:
        return None
    if server_args.api_key:
        raise SystemExit(
            "prefillonly serve: --tenant-keys replaces --api-key: give that key a tenant of "
            "its own in the file"
        )
    try:
        return load_tenant_keys(options.tenant_keys)
    except TenantKeysError as e:
        raise SystemExit(f"prefillonly serve: --tenant-keys {e}") from None
